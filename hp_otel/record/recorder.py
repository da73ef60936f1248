"""The window recorder: observer events in, exact counts, metrics and spans out.

The hot path (one call per module, op, redistribute or collective event) does the
least it can, as a dispatcher: note which modules are open, ask `attribution` once where a
collective belongs, count it exactly, hand it to `collective_metrics`, and append a
timestamped event.  What it records is fixed when it is made (`settings`).  Spans are
built from those events by `SpanBuilder`:

- deferred (the default): at window end for your provider, when first read for hp_otel's own; or,
  once `max_pending` events have piled up, the oldest in slices of `_BUILD_SLICE` — the
  training step pays for an append, not for an SDK span (docs/how-it-works/costs.md), and a
  long window's step never waits for more than one slice;
- live (`live_spans=True`): as events happen, through the SDK, so spans reach your
  processors at once and are the current span while their work runs.

Nothing here raises into the traced code: a fault is counted, logged once per kind,
and recording goes on.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import Tracer

from hp_otel.record import events as ev
from hp_otel.record import matching
from hp_otel.record.attribution import Attribution, Attributor, ParamResolver, Resolver
from hp_otel.record.collective_metrics import CollectiveMetrics, call_bandwidth
from hp_otel.record.exposure_metrics import WindowRows, report_of
from hp_otel.record.instruments import Instruments
from hp_otel.record.settings import RecorderSettings
from hp_otel.record.span_builder import SpanBuilder
from hp_otel.record.span_store import LocalSpanStore
from hp_otel.spans import schema
from hp_otel.spans.exposure import ExposureReport
from hp_otel.spans.infos import CollectiveInfo, ModuleCall, ModuleInfo, TensorInfo

logger = logging.getLogger("hp_otel")
_now = time.time_ns
_get_ident = threading.get_ident
_MAX_IN_FLIGHT = 4096
_MAX_WINDOW_COLLECTIVES = 65536  # what the exposure figures of one window are computed from
_EXPOSURE_BATCH = 4096  # finished collectives held as events before their exposure rows are written
# Unbuilt events built at a time once `max_pending` wait (a bounded part of one step).
_BUILD_SLICE = 256
_MAX_AWAITING = 4096  # awaited collectives whose exposure rows wait (beyond, the oldest are written as they are)


class WindowRecorder:
    """Records one window (a `CommDebugMode` block): implements `hp_otel.record.observer.Observer`."""

    def __init__(self, tracer: Tracer, instruments: Instruments, settings: RecorderSettings) -> None:
        self._tracer = tracer
        self._instruments = instruments
        self.settings = settings
        self.store = self._store = LocalSpanStore(settings.max_spans)
        # The settings the hot path and the sources read, as plain attributes (one lookup each).
        self.live = settings.live
        self.spans_enabled = settings.spans_enabled  # False: counts and metrics only (an unsampled step)
        self.ops_enabled = settings.ops_enabled  # False: sources leave out op tracing
        self.hooks = settings.hooks  # the user's span hooks, run by the span builder as each span ends
        self.store_only = settings.store_only  # the local store is the spans' only consumer (see SpanBuilder)
        self.call_stack = settings.call_stack  # opt-in: the user's frames issuing each collective and redistribute
        self._max_pending = max(settings.max_pending, 1)
        self._pending: list[ev.Event] = []
        self._builder: SpanBuilder | None = None
        # Re-entrant: a span hook runs inside a build and may read the mode (`get_finished_spans`,
        # `write_spans`) on the same thread; `_building` names that thread, whose reads then see the
        # spans built so far instead of building again inside the build.
        self._build_lock = threading.RLock()
        self._building = 0
        # The open module calls of each thread, (fqn, phase) innermost last (a thread with none: no entry).
        self._stacks: dict[int, list[tuple[str, str]]] = {}
        # Where each collective belongs, decided once (attribution.py); it reads `_stacks`, the same dict.
        self._attribution = Attributor(self._stacks, self.on_fault)
        # Backward by autograd node (torch): the module calls whose backward spans are open, outermost
        # first, are the attributor's `backward_calls` (a recompute counts for them too).
        self._backward_moved_ns = 0  # when the open backward spans last changed
        self._liveness = instruments.liveness  # the staleness gauges' state (per provider, across windows)
        self.metrics = CollectiveMetrics(instruments, self.live, settings.module_label, self.on_fault)
        self.module_depth = settings.module_depth  # how deep module sources hook (None: every module)
        self._parent_ctx: Any = None  # the window's parent context (a span builder made later nests there)
        # The window's collectives, for its exposed-communication figures (spans/exposure.py): finished
        # ones wait as events until `_EXPOSURE_BATCH` do, then become compact rows; those awaiting a
        # completion (which may still move their end and wait) wait until stop().
        self._window_rows = WindowRows()
        self._window_collectives: list[ev.Collective] = []  # finished, not yet in _window_rows
        self._window_awaited: list[ev.Collective] = []
        self._awaited_limit = _EXPOSURE_BATCH  # awaited ones held before those done are folded into rows
        self._exposure_room = _MAX_WINDOW_COLLECTIVES  # collectives the window's rows may still take
        self._exposure_rows = WindowRows()  # the last stopped window's, for `exposure`
        self._exposure: ExposureReport | None = None
        self._thread = threading.get_ident()  # the window's thread: live spans end on it only
        self._active = False
        self._suspended = 0  # > 0 while a nested mode records instead of this one
        self.accepting = False  # active and not suspended: the one flag the hot path reads
        self.comm_counts: dict[str, int] = {}
        self.comm_ops: dict[str, str] = {}  # framework name -> normalised op
        self.module_counts: dict[str, dict[str, dict[str, int]]] = {}
        self.fault_counts: dict[str, int] = {}
        # Per window: the next sequence number of each group (name, ranks), and the
        # collectives issued that have not returned (what a hang watchdog writes).
        self._seqs: dict[tuple[str, tuple[int, ...]], int] = {}
        self._in_flight: dict[ev.CollectiveIssue, None] = {}
        self.window: matching.Window | None = None
        self.wants_completion = False  # sources attach a done-probe to returned collectives (watchdog on)

    # --- lifecycle -----------------------------------------------------------
    @property
    def active(self) -> bool:
        return self._active

    @active.setter
    def active(self, value: bool) -> None:
        self._active = value
        self.accepting = value and not self._suspended

    @property
    def suspended(self) -> int:
        return self._suspended

    @suspended.setter
    def suspended(self, value: int) -> None:
        self._suspended = value
        self.accepting = self._active and not value

    def start(self) -> None:
        """Begin a window: its spans nest under whatever span is current now."""
        self.materialise()  # spans of an earlier window are built with that window's builder
        parent_ctx = otel_context.get_current()
        self.metrics.start(parent_ctx)  # the step's span: durations' exemplars link to it
        self._parent_ctx = parent_ctx
        self.window = matching.window_for(parent_ctx)
        self._seqs.clear()
        self._in_flight.clear()
        # A counts-only window builds no span: its builder is made only if one is asked for (in_flight_spans)
        self._builder = self._new_builder() if self.spans_enabled else None
        self._instruments.totals.set_fault_sink(self.on_fault)  # faults in the metric callbacks count here
        self._stacks.clear()
        self._attribution.backward_calls = ()
        self._window_rows = WindowRows()
        self._window_collectives = []
        self._window_awaited = []
        self._awaited_limit = _EXPOSURE_BATCH
        self._exposure_room = _MAX_WINDOW_COLLECTIVES
        self._thread = self._attribution.thread = threading.get_ident()
        self.active = True

    def _new_builder(self) -> SpanBuilder:
        return SpanBuilder(
            self._tracer,
            self._store,
            self._parent_ctx,
            self.live,
            self.on_fault,
            self.window,
            self.hooks,
            store_only=self.store_only and not self.live,
        )

    def stop(self, error: BaseException | None = None) -> None:
        """End the window: spans still open end now (with error status if the window raised)."""
        self.active = False
        try:
            self._emit(ev.WindowEnd(_now(), error))
        except Exception as exc:
            self.on_fault("window_end", exc)
        self._stacks.clear()
        self._attribution.backward_calls = ()
        self.metrics.stop()
        self._measure_exposure()

    @staticmethod
    def _write_exposure_rows(rows: WindowRows, collectives: list[ev.Collective]) -> None:
        """Add these collectives' rows (their events can go: nothing moves them now)."""
        add = rows.add
        for e in collectives:
            place = e.place
            add(e.start_ns, e.end_ns, e.info.is_async, e.completion, e.returned_ns - e.start_ns, e.waited_ns,
                place.phase, place.fqn)  # fmt: skip

    def _fold_awaited(self) -> None:
        """Write the rows of the awaited collectives nothing can move any more (completed by their
        `wait_tensor`, which reports its wait first); keep the others as events, at most
        `_MAX_AWAITING` (beyond, the oldest are written as they are, as the metrics' sweep does).
        So a long window holds a bounded number of events whatever `max_spans` drops."""
        still: list[ev.Collective] = []
        final: list[ev.Collective] = []
        for event in self._window_awaited:
            (final if event.completion == schema.COMPLETION_WAIT else still).append(event)
        if len(still) > _MAX_AWAITING:
            final.extend(still[:-_MAX_AWAITING])
            still = still[-_MAX_AWAITING:]
        self._write_exposure_rows(self._window_rows, final)
        self._window_awaited = still
        self._awaited_limit = max(_EXPOSURE_BATCH, 2 * len(still))  # amortised: each event swept O(1) times

    def _measure_exposure(self) -> None:
        """Snapshot the window's collectives for its exposed communication (computed when asked for or
        when a metric reader collects: not on the step's path)."""
        finished, self._window_collectives = self._window_collectives, []
        awaited, self._window_awaited = self._window_awaited, []
        rows, self._window_rows = self._window_rows, WindowRows()
        try:
            self._write_exposure_rows(rows, finished)
            self._write_exposure_rows(rows, awaited)
            rows.seal()
            if not rows:
                return
            self._exposure_rows, self._exposure = rows, None
            self._instruments.exposure.defer(rows, self.metrics.module_label)
        except Exception as exc:
            self.on_fault("exposure", exc)

    @property
    def exposure(self) -> ExposureReport:
        """The last stopped window's exposed communication (docs/overlap.md)."""
        if self._exposure is None:
            try:
                self._exposure = report_of(self._exposure_rows)
            except Exception as exc:
                self.on_fault("exposure", exc)
                self._exposure = ExposureReport()
        return self._exposure

    def reset(self) -> None:
        """Forget counts and unbuilt events (the OTel counters, being cumulative, keep theirs).

        Between windows also the span builder (its per-window caches) and the in-flight records.
        Refused from a span hook while that build runs: the build would go on with what it forgot."""
        if self._building == threading.get_ident():
            raise RuntimeError(
                "clear() was called from a span hook (collective_hook, module_hook, op_hook) while the mode "
                "builds its spans; clear the mode after reading it, outside the hook"
            )
        with self._build_lock:
            self._pending = []  # a new list: the old one's memory goes (clear() keeps its capacity)
            if not self._active:
                self._builder = None
                self._in_flight.clear()
        self.comm_counts.clear()
        self.comm_ops.clear()
        self.module_counts.clear()

    def unbuilt_events(self) -> int:
        """Events recorded whose spans are not built yet (deferred spans)."""
        return len(self._pending)

    def materialise(self) -> None:
        """Build the spans of every event recorded so far (from a span hook during a build: nothing more)."""
        if self._building == threading.get_ident():
            return
        with self._build_lock:
            pending, self._pending = self._pending, []
            self._build(pending)

    def build_oldest(self, count: int | None = None) -> None:
        """Build the spans of the oldest `count` unbuilt events: what the step pays once `max_pending`
        wait, a slice at a time, so no single step pauses for the whole backlog; each later slice
        comes after as many new events."""
        if self._building == threading.get_ident():  # a hook's own collective or module during a build
            return
        count = _BUILD_SLICE if count is None else count
        with self._build_lock:
            pending = self._pending
            batch = pending[:count]
            del pending[:count]
            self._build(batch)

    def _build(self, events: list[ev.Event]) -> None:
        """Feed `events` to the builder (under the build lock). An exception that is not a fault
        of ours (Ctrl-C, SystemExit from a hook) puts back every event not yet built, the
        interrupted one included, so a later read builds them: nothing recorded is lost."""
        builder = self._builder
        if builder is None:
            return
        built = 0
        self._building = threading.get_ident()
        try:
            for event in events:
                try:
                    builder.feed(event)
                except Exception as exc:
                    self.on_fault("span_build", exc)
                built += 1
        except BaseException:
            self._pending[:0] = events[built:]
            raise
        finally:
            self._building = 0

    def _emit(self, event: ev.Event) -> None:
        if not self.spans_enabled:
            return
        if self.live:
            builder = self._builder
            if builder is not None:
                try:
                    builder.feed(event)
                except Exception as exc:
                    self.on_fault("span_build", exc)
            return
        self._pending.append(event)
        if len(self._pending) >= self._max_pending:  # bound memory: build now, the store caps what it keeps
            self.build_oldest()

    # --- observer: modules ----------------------------------------------------
    def on_module_enter(self, module: ModuleInfo, phase: str) -> None:
        if not self.accepting:
            return
        try:
            thread = _get_ident()
            modules = self._stacks.get(thread)
            if modules is None:
                modules = self._stacks[thread] = []
            if phase == schema.PHASE_RECOMPUTE and (not modules or modules[-1][1] != phase):
                # a recompute starts: the backward spans follow the node that asked for it first, so
                # it nests (and counts) inside their calls (attribution.py)
                chain = self._attribution.running_chain()
                if chain is not None:
                    self._follow_backward(chain, _now())
            modules.append((module.fqn, phase))
            if self.spans_enabled:  # counts only: no event to make (`_emit` would drop it)
                self._emit(ev.ModuleEnter(_now(), module, phase))
        except Exception as exc:
            self.on_fault("module_enter", exc)

    def on_module_exit(self, fqn: str, phase: str, error: BaseException | None = None) -> None:
        if not self.accepting:
            return
        try:
            self._close_module_call(fqn, phase)
            if self.spans_enabled:
                self._emit(ev.ModuleExit(_now(), fqn, phase, error))
        except Exception as exc:
            self.on_fault("module_exit", exc)

    def _close_module_call(self, fqn: str, phase: str) -> None:
        """Forget the innermost open call of `fqn` in `phase`: this thread's, else another's."""
        key = (fqn, phase)
        thread = _get_ident()
        stacks = self._stacks
        mine = stacks.get(thread)
        for ident, modules in [(thread, mine)] if mine is not None and key in mine else list(stacks.items()):
            for i in range(len(modules) - 1, -1, -1):
                if modules[i] == key:
                    del modules[i]
                    if not modules:  # a thread with no open call has no entry: the dict stays small
                        del stacks[ident]
                    return

    def on_backward_end(self) -> None:
        if not self.accepting:
            return
        try:
            for ident, modules in list(self._stacks.items()):  # the attributor's lists too
                modules[:] = [m for m in modules if m[1] != schema.PHASE_BACKWARD]
                if not modules:
                    del self._stacks[ident]
            self._attribution.backward_calls = ()
            if self.spans_enabled:
                self._emit(ev.BackwardEnd(_now()))
        except Exception as exc:
            self.on_fault("backward_end", exc)

    def on_backward_modules(self, chain: Sequence[ModuleCall]) -> None:
        if not self.accepting:
            return
        try:
            chain = tuple(chain)
            open_calls = self._attribution.backward_calls
            if len(chain) < len(open_calls) and all(a is b for a, b in zip(chain, open_calls, strict=False)):
                # An enclosing call's gradient arrives while calls inside it are open (grad hooks on a
                # shared multi-tensor output run in any order): its backward is open already.
                return
            self._follow_backward(chain, _now())
        except Exception as exc:
            self.on_fault("backward_modules", exc)

    def set_node_attribution(self, resolve: Resolver | None) -> None:
        self._attribution.node = resolve

    def set_param_attribution(self, resolve: ParamResolver | None) -> None:
        """A module source says which module calls own the parameters a collective moves (FSDP's
        parameter group issuing it): it counts, and nests, under those (attribution.py)."""
        self._attribution.param = resolve

    def _open_owner(self, place: Attribution, time_ns: int) -> None:
        """Module spans of the group's module (and enclosing calls not open) around its collective."""
        phase = place.phase
        for i, module in enumerate(place.opened):
            self._emit(ev.ModuleEnter(time_ns, module, phase, (place.under or ("", "")) if i == 0 else None))

    def _close_owner(self, opened: tuple[ModuleInfo, ...], phase: str, time_ns: int) -> None:
        for module in reversed(opened):
            self._emit(ev.ModuleExit(time_ns, module.fqn, phase, None))

    def _follow_backward(self, chain: tuple[ModuleCall, ...], time_ns: int) -> None:
        """Close the open backward spans not in `chain`, open those of `chain` not open yet."""
        open_calls = self._attribution.backward_calls
        same = 0
        limit = min(len(open_calls), len(chain))
        while same < limit and open_calls[same] is chain[same]:
            same += 1
        if same == len(open_calls) == len(chain):
            return
        # never before the previous move: a span must not end before it started
        time_ns = self._backward_moved_ns = max(time_ns, self._backward_moved_ns)
        self._attribution.backward_calls = chain
        if not self.spans_enabled:  # counts only: the calls followed, no span events to make
            return
        for call in reversed(open_calls[same:]):
            try:
                self._emit(ev.ModuleExit(time_ns, call.module.fqn, schema.PHASE_BACKWARD, None))
            except Exception as exc:
                self.on_fault("module_exit", exc)
        for call in chain[same:]:
            try:
                self._emit(ev.ModuleEnter(time_ns, call.module, schema.PHASE_BACKWARD))
            except Exception as exc:
                self.on_fault("module_enter", exc)

    # --- observer: ops and redistributes ------------------------------------------
    def on_op_enter(self, op_name: str, inputs: Sequence[TensorInfo]) -> None:
        if not self.accepting:
            return
        try:
            self._emit(ev.OpEnter(_now(), op_name, inputs))
        except Exception as exc:
            self.on_fault("op_enter", exc)

    def on_op_exit(self, op_name: str, outputs: Sequence[TensorInfo], error: BaseException | None = None) -> None:
        if not self.accepting:
            return
        try:
            self._emit(ev.OpExit(_now(), op_name, outputs, error))
        except Exception as exc:
            self.on_fault("op_exit", exc)

    def on_redistribute_enter(self, src_placements: str, dst_placements: str, shape: tuple[int, ...]) -> None:
        if not self.accepting:
            return
        try:
            now = _now()
            modules = self._stacks.get(_get_ident())  # backward (also inside an optimizer's step): its node's first
            if (not modules or modules[-1][1] == schema.PHASE_OPTIMIZER) and self._attribution.node is not None:
                chain = self._attribution.running_chain()
                if chain is not None:
                    self._follow_backward(chain, now)
            call_stack = self.call_stack
            stack = call_stack.capture() if call_stack is not None and self.spans_enabled else ()
            self._emit(ev.RedistributeEnter(now, src_placements, dst_placements, shape, stack))
        except Exception as exc:
            self.on_fault("redistribute_enter", exc)

    def on_redistribute_exit(self, error: BaseException | None = None) -> None:
        if not self.accepting:
            return
        try:
            self._emit(ev.RedistributeExit(_now(), error))
        except Exception as exc:
            self.on_fault("redistribute_exit", exc)

    # --- observer: collectives --------------------------------------------------
    def on_collective_issue(self, info: CollectiveInfo, start_ns: int, phase: str | None = None) -> Any:
        if not self.accepting:
            return None
        if not (self.spans_enabled or self.wants_completion):  # counts need no issue record: the gauges' only
            try:
                return self._liveness.ticket(start_ns, info.op, info.group)
            except Exception as exc:
                self.on_fault("collective_issue", exc)
                return None
        try:
            place = self._attribution.attribute(phase)
            if place.chain is not None:  # backward: its node's modules, before the span finds its parent
                self._follow_backward(place.chain, start_ns)
            if place.opened:  # FSDP: the modules of the group whose parameters move, not running
                self._open_owner(place, start_ns)
            issue = ev.CollectiveIssue(start_ns, info, self._next_seq(info), place)
            call_stack = self.call_stack
            if call_stack is not None:
                issue.stack = call_stack.capture()
            in_flight = self._in_flight
            if len(in_flight) >= _MAX_IN_FLIGHT:  # work nobody waits for: forget the oldest
                in_flight.pop(next(iter(in_flight)), None)
            in_flight[issue] = None
            self._liveness.issued(issue, start_ns, info.op, info.group)
            self._emit(issue)
            return issue
        except Exception as exc:
            self.on_fault("collective_issue", exc)
            return None

    def on_collective(
        self,
        info: CollectiveInfo,
        start_ns: int,
        end_ns: int,
        error: BaseException | None = None,
        phase: str | None = None,
        ticket: Any = None,
        awaits_completion: bool = False,
        done: Callable[[], bool] | None = None,
        device: Callable[[], int | None] | None = None,
    ) -> ev.Collective | None:
        """Count and record one collective; with `awaits_completion` (launched, not finished)
        returns the token to pass to `on_collective_complete` when it finishes."""
        issue = ticket if type(ticket) is ev.CollectiveIssue else None
        if issue is not None:
            issue.returned = True
            if done is not None and error is None:  # in flight until its work is done
                issue.pending = done
            else:
                self._in_flight.pop(issue, None)
        if not self.accepting:
            if ticket is not None:
                self._liveness.forget(ticket)
            return None
        try:
            if issue is not None:
                place = issue.place
            else:  # no issue record (a counts-only window, a source without one): decided now
                place = self._attribution.attribute(phase)
                if place.chain is not None:  # backward: the open backward spans follow its calls first
                    self._follow_backward(place.chain, start_ns)
            # Exact counts, overall and for each module it belongs to (the same place its span reads).
            name = info.name
            counts = self.comm_counts
            counts[name] = counts.get(name, 0) + 1
            self.comm_ops[name] = info.op
            owners = place.owners
            if owners:
                module_counts = self.module_counts
                phase = place.phase
                for fqn in owners:
                    per_phase = module_counts.setdefault(fqn, {}).setdefault(phase, {})
                    per_phase[name] = per_phase.get(name, 0) + 1
            awaits = awaits_completion and error is None
            duration_ns = end_ns - start_ns
            measured = not awaits and error is None  # its bandwidth is known now (else: at completion, or none)
            bw = call_bandwidth(info, duration_ns) if measured else None
            key = self.metrics.measure(info, place, None if awaits else duration_ns, error, bw)
            spans = self.spans_enabled
            if not (awaits or spans):  # counts only, finished: nothing more to keep
                self._liveness.completed(ticket, end_ns)
                return None
            # FSDP's forward prefetch: the spans of the module whose parameters move (its issue opened them)
            opened = place.opened if spans else ()
            if issue is not None:
                seq, stack = issue.seq, issue.stack
            else:
                seq = self._next_seq(info) if spans else -1
                call_stack = self.call_stack
                stack = call_stack.capture() if call_stack is not None and spans else ()
                if opened:
                    self._open_owner(place, start_ns)
            event = ev.Collective(
                start_ns=start_ns,
                end_ns=end_ns,
                info=info,
                error=error,
                place=place,
                seq=seq,
                issue=issue,
                completion=schema.COMPLETION_LAUNCH if awaits else schema.COMPLETION_CALL,
                returned_ns=end_ns,
                device=device,
                stack=stack,
                bw=bw,
                bw_ns=duration_ns if measured else -1,
            )
            if awaits:
                self.metrics.awaiting(event, key)
                self._liveness.launched(ticket, event, start_ns, info.op, info.group)
            else:
                self._liveness.completed(ticket, end_ns)
            if not spans:
                return event if awaits else None
            self._emit(event)
            if opened:
                self._close_owner(opened, place.phase, end_ns)
            if self._exposure_room > 0 and not info.fake_group:  # a fake group's calls overlap nothing
                self._exposure_room -= 1
                if awaits:
                    awaited = self._window_awaited
                    awaited.append(event)
                    if len(awaited) >= self._awaited_limit:
                        self._fold_awaited()
                else:
                    finished = self._window_collectives
                    finished.append(event)
                    if len(finished) >= _EXPOSURE_BATCH:
                        self._window_collectives = []
                        self._write_exposure_rows(self._window_rows, finished)
            return event if awaits else None
        except Exception as exc:
            self.on_fault("collective", exc)
            return None

    def on_collective_complete(self, token: Any, end_ns: int, completion: str) -> None:
        """The collective of `token` finished at `end_ns` (its wait_tensor, its Work); any thread."""
        if not isinstance(token, ev.Collective) or token.completion != schema.COMPLETION_LAUNCH:
            return
        try:
            token.end_ns = max(end_ns, token.end_ns)
            token.completion = completion
            self._liveness.completed(token, end_ns)
            builder = self._builder
            if self.live and builder is not None and threading.get_ident() == self._thread:
                builder.complete_collective(token)
        except Exception as exc:
            self.on_fault("collective_complete", exc)

    def on_collective_wait(self, token: Any, start_ns: int, end_ns: int) -> None:
        """A thread waited for the collective of `token` from `start_ns` to `end_ns` (before or after
        its completion was reported); any thread."""
        if not isinstance(token, ev.Collective):
            return
        try:
            token.waited_ns += max(end_ns - max(start_ns, token.start_ns), 0)
            if token.completion != schema.COMPLETION_LAUNCH and token.end_ns > end_ns:
                # done by the time its wait returned: the backend thread's timestamp came late (the GIL)
                token.end_ns = max(end_ns, token.returned_ns)
        except Exception as exc:
            self.on_fault("collective_wait", exc)

    def _next_seq(self, info: CollectiveInfo) -> int:
        """This collective's index among the window's collectives on its group (one dict update)."""
        key = (info.group, info.group_ranks)
        seqs = self._seqs
        seq = seqs.get(key, 0)
        seqs[key] = seq + 1
        return seq

    def forget_completed(self) -> None:
        """Drop returned collectives whose work is done (the watchdog's thread calls this)."""
        for issue in self.in_flight():
            pending = issue.pending
            if issue.returned and pending is not None:
                try:
                    done = pending()
                except Exception:  # a handle that cannot say: it returned, count it done
                    done = True
                if done:
                    self._in_flight.pop(issue, None)

    def in_flight(self) -> list[ev.CollectiveIssue]:
        """Collectives issued in this window that have not returned, oldest first (any thread may ask)."""
        return list(dict(self._in_flight))  # one C-level copy: safe while the training thread adds and removes

    def in_flight_spans(self, now_ns: int) -> list[ReadableSpan]:
        """The in-flight collectives as finished spans marked in flight (for a file; nothing is exported)."""
        self.forget_completed()
        self.materialise()
        builder = self._builder
        if builder is None and self._active and self._in_flight:  # a counts-only window's first one
            with self._build_lock:
                builder = self._builder = self._builder or self._new_builder()
        if builder is None:
            return []
        spans = []
        with self._build_lock:
            for issue in self.in_flight():
                try:
                    spans.append(builder.in_flight_span(issue, now_ns))
                except Exception as exc:  # live spans change under us on the training thread: skip this one
                    self.on_fault("in_flight_span", exc)
        return spans

    # --- faults -------------------------------------------------------------------
    def on_fault(self, where: str, exc: BaseException) -> None:
        """Count a fault in our own code, log it once per kind, and keep going."""
        try:
            first = where not in self.fault_counts
            self.fault_counts[where] = self.fault_counts.get(where, 0) + 1
            if first:
                logger.warning(
                    "hp_otel: %s failed; tracing goes on and the traced code is unaffected "
                    "(later %s faults are counted, not logged)",
                    where,
                    where,
                    exc_info=exc,
                )
            self._instruments.callback_errors.add(1, {schema.CALLBACK_NAME: where})
        except Exception:  # pragma: no cover - logging itself failed; nothing more can be done safely
            pass
