"""Turns recorded call events into OpenTelemetry spans.

Events carry their own timestamps, so the same builder serves both schedules of the
recorder: fed as events happen (live: spans open and close around the work and are the
current span meanwhile) or fed later from the event log (deferred: the step pays for
an append, the SDK span is built when someone reads the spans).  Either way a module,
op or redistribute event opens a span; a collective is a leaf span of the innermost
open call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.trace import Span, SpanContext, SpanKind, Status, StatusCode, TraceFlags, Tracer

from hp_otel.common import _otel_compat, launcher_env
from hp_otel.record import events as ev
from hp_otel.record import matching
from hp_otel.record import phase as phase_of
from hp_otel.record.attribution import Attribution, is_elsewhere
from hp_otel.record.call_stack import module_of
from hp_otel.record.collective_metrics import bandwidth_of
from hp_otel.record.faults import weak_method
from hp_otel.record.matching import Window
from hp_otel.record.readable_spans import DraftSpan, SpanOutlet
from hp_otel.record.span_store import LocalSpanStore
from hp_otel.record.user_hooks import COLLECTIVE_HOOK_FAULT, MODULE_HOOK_FAULT, NO_HOOKS, OP_HOOK_FAULT, UserHooks
from hp_otel.spans import codec, schema
from hp_otel.spans.bandwidth import attributes_of
from hp_otel.spans.infos import CollectiveInfo, OpInfo

_LOST_SPAN = trace.NonRecordingSpan(trace.INVALID_SPAN_CONTEXT)
_MODULE = schema.KIND_MODULE


def _ignore_fault(where: str, exc: BaseException) -> None:
    pass


class _Frame:
    """One open call."""

    __slots__ = ("ctx", "info", "key", "kind", "phase", "saved_ctx", "span")

    def __init__(self, kind: str, key: Any, span: Span, ctx: Any, saved_ctx: Any, phase: str, info: Any) -> None:
        self.kind = kind
        self.key = key
        self.span = span
        self.ctx = ctx
        self.saved_ctx = saved_ctx
        self.phase = phase
        self.info = info  # what a user hook is given: the ModuleInfo, or an op's inputs


def mark_error(span: Span, error: BaseException | str) -> None:
    """Error status, the exception event, and `error.type` (OTel's convention; `_OTHER` without an exception)."""
    text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
    span.set_status(Status(StatusCode.ERROR, text))
    span.set_attribute(schema.ERROR_TYPE, codec.error_type(error) if isinstance(error, BaseException) else "_OTHER")
    if isinstance(error, BaseException):
        span.record_exception(error)


class SpanBuilder:
    """Keeps the stack of open spans; `feed(event)` advances it by one event."""

    def __init__(
        self,
        tracer: Tracer,
        store: LocalSpanStore,
        parent_ctx: Any,
        live: bool,
        on_fault: Callable[[str, BaseException], None] | None = None,
        window: Window | None = None,
        hooks: UserHooks = NO_HOOKS,
        store_only: bool = False,
    ) -> None:
        self._tracer = tracer
        # The local store is the spans' only consumer (no processor, no hook): once it is full, a new
        # span would be built only to be dropped, so it is counted as dropped instead (time and memory
        # stay bounded by max_spans). The calls not built, by (kind, key), with how many are open.
        self._store_only = store_only and hooks == NO_HOOKS
        self._to_processors = not store_only  # hp_otel's own provider has none: a span goes to the store only
        self._skipped: dict[tuple[str, Any], int] = {}
        self._collective_hook = hooks.collective  # the user's span hooks (user_hooks.py); None: not set
        self._module_hook = hooks.module
        self._op_hook = hooks.op
        self._no_call_hooks = hooks.module is None and hooks.op is None  # a call's span ends as it is
        self._window = window  # what collective sequence numbers count within (matching.py)
        self._issued: dict[ev.CollectiveIssue, Any] = {}  # in flight -> the parent context it was issued under
        # A user's span processor raising inside start/end: counted here, and the span
        # still reaches the local store (the SDK sets the end time before the processors run).
        # Held weakly when it is a bound method (the recorder's): no reference cycle between the
        # recorder and its builder, so a window's records are freed as soon as the mode is dropped.
        self._fault_sink = weak_method(on_fault or _ignore_fault)
        self._store = store
        self._parent_ctx = parent_ctx
        # A window under no span (no step): its root spans all get this one trace id, not one each
        self._root_trace_id: int | None = None
        if not trace.get_current_span(parent_ctx).get_span_context().is_valid:
            window_trace = window.root_trace_id if window is not None else None
            self._root_trace_id = window_trace or RandomIdGenerator().generate_trace_id()
        self._live = live  # live: make each open span the current span of this thread
        # Deferred spans on an SDK tracer: made as ReadableSpans and handed to its processors, the sampler
        # asked once for the window (readable_spans.py); live ones, or another tracer's, take its own path.
        self._outlet: SpanOutlet | None = None
        self._window_parent: SpanContext | None = None  # the window's parent span, when valid
        self._unsampled = False  # the window's root decision: build nothing
        if not live:
            self._outlet = self._outlet_for(tracer, parent_ctx)
        self._stack: list[_Frame] = []
        # Async collectives whose completion was awaited when built: ended at completion or window end.
        self._awaiting: dict[int, tuple[Span, ev.Collective]] = {}
        # Encodings that repeat every step, made once per window.
        self._collective_attrs: dict[CollectiveInfo, dict[str, Any]] = {}
        self._described: set[str] = set()  # group ids whose name and members a span of this window carries
        self._rank: int | None = None  # this process's global rank (the first use: after the group exists)
        self._derived_tracer: Any = None  # the tracer's copy that gives link targets their derived ids
        # A user's hook interrupted (Ctrl-C, SystemExit): its span ended all the same, and the event
        # that ended it is fed again by the recorder (which puts back what a build did not finish).
        self._hook_interrupted = False
        self._ended: ev.Event | None = None  # that event: its span is done, nothing more to do
        self.fed = 0  # how many events the last `feed_all` advanced by

    def _outlet_for(self, tracer: Tracer, parent_ctx: Any) -> SpanOutlet | None:
        try:
            outlet = SpanOutlet.of(tracer)
            if outlet is None:
                return None
            parent = trace.get_current_span(parent_ctx).get_span_context()
            self._window_parent = parent if parent.is_valid else None
            outlet.decide(tracer, parent_ctx, parent.trace_id if parent.is_valid else self._root_trace_id)
        except Exception as exc:  # a user's sampler raising: this window's spans take the tracer's own path
            self._on_fault("span_processor", exc)
            self._window_parent = None
            return None
        self._unsampled = not outlet.sampled
        return outlet

    def feed(self, event: ev.Event) -> None:
        """Advance by one event; what its handler raises is raised."""
        self.feed_all((event,), None)

    def feed_all(self, events: Sequence[ev.Event], on_fault: Callable[[BaseException], None] | None) -> None:
        """Advance by each event in turn (one call for a whole build). A handler's Exception goes to
        `on_fault` and the next event is fed (raised without one); a BaseException (Ctrl-C from a
        user's hook) is raised at once, `fed` then saying how many events were done before it."""
        if self._unsampled:  # the window was sampled out: its counts stand, no span is made
            self.fed = len(events)
            return
        handlers, store = _HANDLERS, self._store
        fed = 0
        try:
            for event in events:
                if event is self._ended:
                    self._ended = None
                elif not (self._store_only and (self._skipped or store.full) and self._skip(event)):
                    try:
                        handlers[type(event)](self, event)
                    except Exception as exc:
                        self._after_raise(event)
                        if on_fault is None:
                            raise
                        on_fault(exc)
                fed += 1
        except BaseException:
            if fed < len(events):
                self._after_raise(events[fed])
            self.fed = fed
            raise
        self.fed = fed

    def _after_raise(self, event: ev.Event) -> None:
        """A handler raised: an event whose span ended all the same (a user's hook interrupted) is
        done, and does nothing when fed again."""
        if self._hook_interrupted and type(event) in _ONE_SPAN_EVENTS:
            self._ended = event
        self._hook_interrupted = False

    def _skip(self, event: ev.Event) -> bool:
        """With the store full: True for an event whose span would only be dropped (counted as dropped)."""
        kind = type(event)
        if kind is ev.ModuleExit:
            return self._unskip((schema.KIND_MODULE, (event.fqn, event.phase)))  # type: ignore[union-attr]
        if kind is ev.OpExit:
            return self._unskip((schema.KIND_OP, event.name))  # type: ignore[union-attr]
        if kind is ev.RedistributeExit:
            return self._unskip((schema.KIND_REDISTRIBUTE, None))
        if kind is ev.BackwardEnd:  # closes every backward module span: the skipped ones too
            backward = [k for k in self._skipped if k[0] == schema.KIND_MODULE and k[1][1] == schema.PHASE_BACKWARD]
            for k in backward:
                del self._skipped[k]
            return False
        if kind is ev.WindowEnd:
            self._skipped = {}
            return False
        if not self._store.full:
            return False
        if kind is ev.CollectiveIssue:
            return True  # its span would be dropped: no parent to remember
        if kind is ev.Collective:
            if event.issue is not None:  # type: ignore[union-attr]
                self._issued.pop(event.issue, None)  # type: ignore[union-attr]
            self._store.count_dropped(1)
            return True
        if kind is ev.ModuleEnter:
            key: tuple[str, Any] = (schema.KIND_MODULE, (event.module.fqn, event.phase))  # type: ignore[union-attr]
        elif kind is ev.OpEnter:
            key = (schema.KIND_OP, event.name)  # type: ignore[union-attr]
        else:
            key = (schema.KIND_REDISTRIBUTE, None)
        self._skipped[key] = self._skipped.get(key, 0) + 1
        self._store.count_dropped(1)
        return True

    def _unskip(self, key: tuple[str, Any]) -> bool:
        """The exit of a call: True if its enter was skipped (the innermost open call of that key was)."""
        open_skipped = self._skipped.get(key, 0)
        if not open_skipped:
            return False
        if open_skipped == 1:
            del self._skipped[key]
        else:
            self._skipped[key] = open_skipped - 1
        return True

    def _on_fault(self, where: str, exc: BaseException) -> None:
        sink = self._fault_sink()
        if sink is not None:
            sink(where, exc)

    # --- stack ----------------------------------------------------------------
    def _push(
        self,
        kind: str,
        key: Any,
        name: str,
        attrs: dict[str, Any],
        phase: str,
        time_ns: int,
        info: Any = None,
        parent_ctx: Any = None,
    ) -> None:
        """Open a span (on `attrs` as they are: a `codec.SharedAttributes` is copied before a write)."""
        if parent_ctx is None:
            parent_ctx = self._stack[-1].ctx if self._stack else self._parent_ctx
        if self._outlet is not None:  # deferred: a draft is its children's parent as it is
            draft = self._draft(name, parent_ctx, attrs, time_ns, None, None)
            self._stack.append(_Frame(kind, key, draft, draft, None, phase, info))
            return
        span = self._start_span(name, parent_ctx, attrs, time_ns)
        # A span that failed to start is invisible: its children attach to its parent. A draft is its
        # children's parent as it is (no Context is made for it: nothing makes it current).
        if type(span) is DraftSpan:
            ctx: Any = span
        else:
            ctx = parent_ctx if span is _LOST_SPAN else trace.set_span_in_context(span, parent_ctx)
        saved = None
        if self._live:
            saved = otel_context.get_current()
            otel_context.attach(ctx)
        self._stack.append(_Frame(kind, key, span, ctx, saved, phase, info))

    def _pop(self, kind: str, key: Any) -> _Frame | None:
        """Remove the innermost open frame matching (kind, key), wherever it is.

        Frames above it stay open: MindSpore's backward hooks close parents before
        children, and a missing exit must not end someone else's span.
        """
        stack = self._stack
        if stack and not self._live:  # the innermost one, as calls nest (nothing to restore: not live)
            frame = stack[-1]
            if frame.kind == kind and frame.key == key:
                return stack.pop()
        for i in range(len(stack) - 1, -1, -1):
            frame = stack[i]
            if frame.kind == kind and frame.key == key:
                del stack[i]
                if self._live and i == len(stack):  # it was the top: restore what was current before it
                    otel_context.attach(frame.saved_ctx)
                return frame
        return None

    def _end(self, frame: _Frame, time_ns: int, error: Any = None, outputs: Any = ()) -> None:
        if error is not None:
            mark_error(frame.span, error)
        elif self._no_call_hooks and type(frame.span) is DraftSpan:
            self._end_draft(frame.span, time_ns)
            return
        try:
            if frame.kind == schema.KIND_MODULE:
                if self._module_hook is not None:
                    self._run_hook(self._module_hook, frame.span, frame.info, MODULE_HOOK_FAULT)
            elif frame.kind == schema.KIND_OP and self._op_hook is not None:
                info = OpInfo(frame.key, tuple(frame.info or ()), tuple(outputs))
                self._run_hook(self._op_hook, frame.span, info, OP_HOOK_FAULT)
        finally:  # a hook interrupted by Ctrl-C: the span is still ended and kept
            self._end_span(frame.span, time_ns)

    def _run_hook(self, hook: Callable[[Span, Any], Any], span: Span, info: Any, fault: str) -> None:
        """The user's hook on a span about to end; what it raises is counted, never propagated."""
        if not span.is_recording():  # sampled out, or failed to start: nothing to write on
            return
        if type(span) is DraftSpan:
            span.checked = True  # what the hook writes is cleaned and bounded as the SDK would
        try:
            hook(span, info)
        except Exception as exc:
            self._on_fault(fault, exc)
        except BaseException:  # Ctrl-C, SystemExit: raised, once its span has ended (see feed)
            self._hook_interrupted = True
            raise

    def _end_span(self, span: Span, time_ns: int) -> None:
        if type(span) is DraftSpan:
            self._end_draft(span, time_ns)
            return
        try:
            span.end(end_time=time_ns)
        except Exception as exc:  # a span processor's on_end raised
            self._on_fault("span_processor", exc)
        self._export(span)

    def _end_draft(self, span: DraftSpan, time_ns: int) -> None:
        """A deferred span's end: made readable for the provider's processors (where `end()` hands it);
        the local store keeps its fields, or the readable span when they need the SDK's bounds."""
        outlet = self._outlet
        assert outlet is not None
        readable = None
        if self._to_processors:
            readable = span.readable(outlet, time_ns)
            try:
                outlet.processor.on_end(readable)
            except Exception as exc:
                self._on_fault("span_processor", exc)
        if not span.keep_in(self._store, outlet, time_ns):
            self._store.export((readable or span.readable(outlet, time_ns),))

    def _start_span(
        self, name: str, parent_ctx: Any, attrs: dict[str, Any], time_ns: int, links: Any = None, span_id: Any = None
    ) -> Span:
        """The SDK span; with `span_id`, that id (a link target other ranks derive, matching.py); a root
        span of a window under no span, in the window's trace (`Window.root_trace_id`)."""
        if self._outlet is not None:
            return self._draft(name, parent_ctx, attrs, time_ns, links, span_id)
        tracer = self._tracer
        token = trace_token = None
        root = parent_ctx is self._parent_ctx and self._root_trace_id is not None
        if span_id is not None or root:
            if self._derived_tracer is None:
                self._derived_tracer = matching.tracer_with_derived_ids(tracer) or tracer
            tracer = self._derived_tracer
            if span_id is not None:
                token = matching.DERIVED_IDS.forced.set(span_id)
            if root:
                trace_token = matching.DERIVED_IDS.forced_trace.set(self._root_trace_id)
        try:
            return tracer.start_span(name, context=parent_ctx, attributes=attrs, start_time=time_ns, links=links)
        except Exception as exc:  # a span processor's on_start raised: the SDK span is lost to us
            self._on_fault("span_processor", exc)
            return _LOST_SPAN
        finally:
            if token is not None:
                matching.DERIVED_IDS.forced.reset(token)
            if trace_token is not None:
                matching.DERIVED_IDS.forced_trace.reset(trace_token)

    def _draft(
        self,
        name: str,
        parent_ctx: Any,
        attrs: dict[str, Any],
        time_ns: int,
        links: Any,
        span_id: Any,
    ) -> DraftSpan:
        """A deferred span, written on until it ends."""
        outlet = self._outlet
        assert outlet is not None
        if type(parent_ctx) is DraftSpan:  # the usual parent, inline
            parent = parent_ctx.ctx
            ctx = outlet.child_context(parent, span_id)
        else:
            parent = self._span_context_of(parent_ctx)
            trace_id = 0  # a child's is its parent's
            if parent is None:
                trace_id = self._root_trace_id or outlet.id_generator.generate_trace_id()
            ctx = outlet.context(parent, trace_id, span_id)
        return DraftSpan(name, ctx, parent, attrs, time_ns, links, outlet.limits)

    def _span_context_of(self, parent_ctx: Any) -> SpanContext | None:
        """The span a parent context names (a draft, the window's parent, or a Context's span), if valid."""
        if type(parent_ctx) is DraftSpan:
            return parent_ctx.ctx
        if parent_ctx is self._parent_ctx and self._outlet is not None:
            return self._window_parent
        parent = trace.get_current_span(parent_ctx).get_span_context()
        return parent if parent.is_valid else None

    def _export(self, span: Span) -> None:
        if isinstance(span, ReadableSpan):  # sampled out spans record nothing
            self._store.export((span,))

    def _phase(self) -> str:
        """The phase of an op or redistribute starting now: `phase_of.enclosing` over the open module calls."""
        for frame in reversed(self._stack):
            if frame.kind == _MODULE:
                return frame.phase
        return phase_of.OUTSIDE_MODULES

    # --- handlers -------------------------------------------------------------
    def _module_enter(self, e: ev.ModuleEnter) -> None:
        module = e.module
        attrs = codec.encoded_module(module, e.phase)  # shared: a span copies it before it writes on it
        parent_ctx = self._module_ctx(e.under) if e.under is not None else None
        name = schema.module_span_name(module.span_name, e.phase)
        key = (module.fqn, e.phase)
        self._push(schema.KIND_MODULE, key, name, attrs, e.phase, e.time_ns, module, parent_ctx)

    def _module_ctx(self, key: tuple[str, str]) -> Any:
        """The context of the innermost open module span of `key` (the window's root if none is open)."""
        for frame in reversed(self._stack):
            if frame.kind == schema.KIND_MODULE and frame.key == key:
                return frame.ctx
        return self._parent_ctx

    def _module_exit(self, e: ev.ModuleExit) -> None:
        frame = self._pop(schema.KIND_MODULE, (e.fqn, e.phase))
        if frame is not None:
            self._end(frame, e.time_ns, e.error)

    def _backward_end(self, e: ev.BackwardEnd) -> None:
        for frame in [
            f for f in reversed(self._stack) if f.kind == schema.KIND_MODULE and f.phase == schema.PHASE_BACKWARD
        ]:
            self._pop(frame.kind, frame.key)
            self._end(frame, e.time_ns)

    def _op_enter(self, e: ev.OpEnter) -> None:
        phase = self._phase()
        attrs = codec.encoded_op(e.name, e.inputs, phase)  # shared: a span copies it before it writes on it
        self._push(schema.KIND_OP, e.name, e.name, attrs, phase, e.time_ns, e.inputs)

    def _op_exit(self, e: ev.OpExit) -> None:
        frame = self._pop(schema.KIND_OP, e.name)
        if frame is None:
            return
        if e.outputs:
            span = frame.span
            shared = span.shared_attributes() if type(span) is DraftSpan else None
            if shared is not None:  # nothing wrote on it: the shared encoding with these outputs
                span.share_attributes(codec.encoded_op_outputs(shared, e.outputs))
            else:
                span.set_attributes(codec.encode_tensor_infos(e.outputs, "output"))
        self._end(frame, e.time_ns, e.error, e.outputs)

    def _redistribute_enter(self, e: ev.RedistributeEnter) -> None:
        phase = self._phase()
        attrs = codec.encoded_redistribute(e.src_placements, e.dst_placements, e.shape, phase)
        if e.stack:  # its own copy, with the call stack
            attrs = dict(attrs)
            codec.encode_call_stack(attrs, e.stack, module_of)
        self._push(schema.KIND_REDISTRIBUTE, None, schema.REDISTRIBUTE_SPAN_NAME, attrs, phase, e.time_ns)

    def _redistribute_exit(self, e: ev.RedistributeExit) -> None:
        frame = self._pop(schema.KIND_REDISTRIBUTE, None)
        if frame is not None:
            self._end(frame, e.time_ns, e.error)

    def _collective_issue(self, e: ev.CollectiveIssue) -> None:
        self._issued[e] = self._parent_for(e.place)

    def _parent_for(self, place: Attribution) -> Any:
        """The innermost open span's context; the window's root for another thread's collective in no
        module call of its own (the open spans are the window thread's: attribution.py)."""
        return self._stack[-1].ctx if self._stack and not is_elsewhere(place) else self._parent_ctx

    def _collective(self, e: ev.Collective) -> None:
        info = e.info
        attrs = self._collective_attrs.get(info)
        if attrs is None:
            attrs = self._collective_attrs[info] = codec.encode_collective(info)
        issued_under = self._issued.pop(e.issue, None) if e.issue is not None else None
        place = e.place  # what its counts were made from (attribution.py)
        parent_ctx = issued_under or self._parent_for(place)
        attrs, links, span_id = self._matching(attrs, info, e.seq, place.fqn, place.phase)
        if attrs[schema.COLLECTIVE_GROUP_ID] not in self._described:  # the group's first span: it describes it
            self._described.add(attrs[schema.COLLECTIVE_GROUP_ID])
            attrs.update(codec.group_of(info).attributes())
        if place.issued_by is not None:
            attrs[schema.COLLECTIVE_ISSUED_BY] = place.issued_by
        if e.stack:
            codec.encode_call_stack(attrs, e.stack, module_of)
        finished = e.error is None and e.completion != schema.COMPLETION_LAUNCH and not info.fake_group
        if finished:  # its end is known: the bandwidth goes in with the start's attributes (one SDK call less)
            attrs.update(attributes_of(bandwidth_of(e, e.end_ns - e.start_ns)))  # the metrics' own, computed once
        span = self._start_span(info.op, parent_ctx, attrs, e.start_ns, links, span_id)
        if e.issue is not None and e.issue.dumped_to:
            span.add_event(
                schema.WATCHDOG_EVENT,
                {schema.WATCHDOG_PATH: e.issue.dumped_to, schema.WATCHDOG_WAITED_S: e.issue.waited_s},
                timestamp=e.start_ns + int(e.issue.waited_s * 1e9),
            )
        if e.error is not None:
            mark_error(span, e.error)
        if e.completion == schema.COMPLETION_LAUNCH:  # completion not seen yet: end it when it is, or at window end
            self._awaiting[id(e)] = (span, e)
            return
        self._end_collective(span, e, with_bandwidth=False)

    def _end_collective(self, span: Span, e: ev.Collective, with_bandwidth: bool = True) -> None:
        completion, end_ns = e.completion, e.end_ns
        if e.device is not None:  # CUDA: the device time, if its events are complete by now (never a sync)
            device_ns = self._device_ns(e)
            if device_ns is not None:
                completion, end_ns = schema.COMPLETION_DEVICE, e.start_ns + device_ns
        span.set_attribute(schema.COLLECTIVE_COMPLETION, completion)
        if completion != schema.COMPLETION_CALL and e.returned_ns:  # what the exposure figures need (exposure.py)
            span.set_attribute(schema.COLLECTIVE_CALL_DURATION, max(e.returned_ns - e.start_ns, 0) / 1e9)
            span.set_attribute(schema.COLLECTIVE_WAIT_DURATION, e.waited_ns / 1e9)
        if with_bandwidth and e.error is None and completion != schema.COMPLETION_LAUNCH and not e.info.fake_group:
            span.set_attributes(attributes_of(bandwidth_of(e, end_ns - e.start_ns)))
        try:
            if self._collective_hook is not None:
                self._run_hook(self._collective_hook, span, e.info, COLLECTIVE_HOOK_FAULT)
        finally:
            self._end_span(span, end_ns)

    def _device_ns(self, e: ev.Collective) -> int | None:
        try:
            probe = e.device
            return probe() if probe is not None else None
        except Exception as exc:  # the host time stands
            self._on_fault("collective_device_time", exc)
            return None

    def complete_collective(self, e: ev.Collective) -> None:
        """An awaited collective completed (live spans: it ends now)."""
        pending = self._awaiting.pop(id(e), None)
        if pending is not None:
            try:
                self._end_collective(*pending)
            finally:
                self._hook_interrupted = False  # not fed: nothing to feed again

    def _matching(
        self, attrs: dict[str, Any], info: CollectiveInfo, seq: int, fqn: str, phase: str
    ) -> tuple[dict[str, Any], Any, int | None]:
        """A collective's attributes with its phase and cross-rank identity; its link to the group's
        first member's span of it, or (on that member) the span id the others' links name."""
        attrs = codec.encode_collective_place(attrs, phase, fqn)
        if seq < 0 or self._window is None:
            return attrs, None, None
        if self._rank is None:
            self._rank = launcher_env.current_rank()
        group = codec.group_of(info)
        match_id, span_id, link = matching.link_target(self._window, group.id, group.members, seq, self._rank)
        attrs.update(codec.encode_collective_match(seq, self._window.label, match_id))
        return attrs, (link,) if link is not None else None, span_id

    def in_flight_span(self, issue: ev.CollectiveIssue, now_ns: int) -> ReadableSpan:
        """A finished span for a collective that has not returned: start = issue time, end = now,
        `hp_otel.collective.in_flight` true. Made directly, not by the tracer: it goes to a file, never
        to your processors (the real span follows if the call ever returns)."""
        parent_ctx = self._issued.get(issue) or self._parent_for(issue.place)
        parent = self._span_context_of(parent_ctx)
        place = issue.place
        # no link: the span its link would name is exported only if the call returns
        attrs, _, _ = self._matching(codec.encode_collective(issue.info), issue.info, issue.seq, place.fqn, place.phase)
        attrs.update(codec.group_of(issue.info).attributes())  # a span of its own file: described on it
        attrs[schema.COLLECTIVE_IN_FLIGHT] = True
        if issue.stack:
            codec.encode_call_stack(attrs, issue.stack, module_of)
        trace_id = parent.trace_id if parent is not None else self._root_trace_id
        trace_id = trace_id or RandomIdGenerator().generate_trace_id()
        context = SpanContext(trace_id, RandomIdGenerator().generate_span_id(), False, TraceFlags(TraceFlags.SAMPLED))
        events = ()
        if issue.dumped_to:
            events = (
                Event(
                    schema.WATCHDOG_EVENT,
                    {schema.WATCHDOG_PATH: issue.dumped_to, schema.WATCHDOG_WAITED_S: issue.waited_s},
                    timestamp=now_ns,
                ),
            )
        return ReadableSpan(
            name=issue.info.op,
            context=context,
            parent=parent,
            resource=getattr(self._tracer, "resource", None) or Resource.get_empty(),
            instrumentation_scope=_otel_compat.instrumentation_scope(self._tracer),
            attributes=attrs,
            events=events,
            kind=SpanKind.INTERNAL,
            start_time=issue.start_ns,
            end_time=max(now_ns, issue.start_ns),
        )

    def _window_end(self, e: ev.WindowEnd) -> None:
        """Close every span still open, with error status if the window raised."""
        # One at a time: an interrupted hook leaves the rest for this event fed again.
        awaiting, stack = self._awaiting, self._stack
        try:
            while awaiting:  # completed since, or never: then its launch is all we saw
                span, collective = awaiting.pop(next(iter(awaiting)))
                try:
                    self._end_collective(span, collective)
                except Exception as exc:
                    self._on_fault("span_build", exc)
            while stack:
                frame = stack.pop()
                try:
                    self._end(frame, e.time_ns, e.error)
                except Exception as exc:  # one span failing must not leave the others open
                    self._on_fault("span_build", exc)
        finally:
            if self._live:  # the context of the window's start, whatever order the spans closed in
                otel_context.attach(self._parent_ctx)


# The events that end one span: fed again after a hook's interruption, they have nothing left to do.
_ONE_SPAN_EVENTS = (ev.ModuleExit, ev.OpExit, ev.Collective)
# Event type -> handler, at class level: a per-instance table of bound methods is a reference
# cycle that only the garbage collector frees (and with it the window's whole store).
_HANDLERS: dict[type, Callable[[SpanBuilder, Any], None]] = {
    ev.ModuleEnter: SpanBuilder._module_enter,
    ev.ModuleExit: SpanBuilder._module_exit,
    ev.OpEnter: SpanBuilder._op_enter,
    ev.OpExit: SpanBuilder._op_exit,
    ev.RedistributeEnter: SpanBuilder._redistribute_enter,
    ev.RedistributeExit: SpanBuilder._redistribute_exit,
    ev.CollectiveIssue: SpanBuilder._collective_issue,
    ev.Collective: SpanBuilder._collective,
    ev.BackwardEnd: SpanBuilder._backward_end,
    ev.WindowEnd: SpanBuilder._window_end,
}
