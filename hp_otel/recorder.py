"""The recorder: observer events in, OpenTelemetry spans and counters out.

Module, op and redistribute events open spans that become the current span until
their exit; a collective is a leaf span of the innermost open call.  The same
collective events feed exact in-process counts and the OTel instruments.  Nothing
here raises into the traced code: a fault is counted, logged once per kind, and
recording goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import Span, Status, StatusCode, Tracer

from hp_otel import schema as s
from hp_otel.exporter import BoundedInMemorySpanExporter
from hp_otel.records import CollectiveInfo, TensorInfo, encode_collective, encode_tensor_infos
from hp_otel.telemetry import Instruments

logger = logging.getLogger("hp_otel")


class _Frame:
    """One open call on the recorder's stack."""

    __slots__ = ("kind", "key", "span", "ctx", "saved_ctx", "phase", "fqn")

    def __init__(self, kind: str, key: Any, span: Span, ctx: Any, saved_ctx: Any, phase: str, fqn: str) -> None:
        self.kind = kind
        self.key = key
        self.span = span
        self.ctx = ctx
        self.saved_ctx = saved_ctx
        self.phase = phase
        self.fqn = fqn


def _mark_error(span: Span, error: BaseException) -> None:
    span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
    span.record_exception(error)


class SpanRecorder:
    """Implements `hp_otel.observer.Observer` on top of an OTel tracer and meter."""

    def __init__(self, tracer: Tracer, instruments: Instruments, store: BoundedInMemorySpanExporter) -> None:
        self._tracer = tracer
        self._instruments = instruments
        self._store = store
        self._stack: list[_Frame] = []
        self._parent_ctx: Any = None
        self.active = False
        self.suspended = 0  # > 0 while a nested mode records instead of this one
        self.comm_counts: dict[str, int] = {}
        self.comm_ops: dict[str, str] = {}  # framework name -> normalised op
        self.module_counts: dict[str, dict[str, dict[str, int]]] = {}
        self.fault_counts: dict[str, int] = {}
        self._metric_attrs: dict[tuple[Any, ...], dict[str, Any]] = {}
        self._collective_attrs: dict[CollectiveInfo, dict[str, Any]] = {}

    # --- lifecycle -----------------------------------------------------------
    @property
    def accepting(self) -> bool:
        return self.active and not self.suspended

    def start(self) -> None:
        """Begin a window: new spans nest under whatever span is current now."""
        self._parent_ctx = otel_context.get_current()
        self._stack.clear()
        self.active = True

    def stop(self, error: BaseException | None = None) -> None:
        """End the window: close every span still open (with error status if the window raised)."""
        self.active = False
        stack, self._stack = self._stack, []
        for frame in reversed(stack):
            try:
                if error is not None:
                    _mark_error(frame.span, error)
                self._end(frame)
            except Exception as exc:  # pragma: no cover - SDK failure while unwinding
                self.on_fault("unwind", exc)
        if self._parent_ctx is not None:
            otel_context.attach(self._parent_ctx)

    def reset_counts(self) -> None:
        self.comm_counts.clear()
        self.comm_ops.clear()
        self.module_counts.clear()

    # --- stack ----------------------------------------------------------------
    def _push(self, kind: str, key: Any, name: str, attrs: dict[str, Any], phase: str, fqn: str) -> None:
        stack = self._stack
        parent_ctx = stack[-1].ctx if stack else self._parent_ctx
        span = self._tracer.start_span(name, context=parent_ctx, attributes=attrs)
        ctx = trace.set_span_in_context(span, parent_ctx)
        stack.append(_Frame(kind, key, span, ctx, otel_context.get_current(), phase, fqn))
        otel_context.attach(ctx)

    def _pop(self, kind: str, key: Any) -> _Frame | None:
        """Remove the innermost open frame matching (kind, key), wherever it is on the stack.

        Frames above it stay open: MindSpore's backward hooks close parents before
        children, and a missing exit must not end someone else's span.
        """
        stack = self._stack
        for i in range(len(stack) - 1, -1, -1):
            frame = stack[i]
            if frame.kind == kind and frame.key == key:
                del stack[i]
                if i == len(stack):  # it was the top: hand currency back to what was current before it
                    otel_context.attach(frame.saved_ctx)
                return frame
        return None

    def _end(self, frame: _Frame, end_time: int | None = None) -> None:
        span = frame.span
        span.end(end_time=end_time)
        if isinstance(span, ReadableSpan):
            self._store.export((span,))

    def _phase(self, hint: str | None = None) -> tuple[str, str]:
        """(phase, fqn) of the innermost open module, else the hint."""
        for frame in reversed(self._stack):
            if frame.kind == s.KIND_MODULE:
                return frame.phase, frame.fqn
        return hint or s.PHASE_FORWARD, ""

    # --- observer: modules ----------------------------------------------------
    def on_module_enter(
        self, fqn: str, span_name: str, module_type: str, phase: str, static_attrs: dict[str, Any] | None = None
    ) -> None:
        if not self.accepting:
            return
        try:
            attrs = {s.CALL_KIND: s.KIND_MODULE, s.MODULE_FQN: fqn, s.MODULE_TYPE: module_type, s.PHASE: phase}
            if static_attrs:
                attrs.update(static_attrs)
            self._push(s.KIND_MODULE, (fqn, phase), span_name, attrs, phase, fqn)
        except Exception as exc:
            self.on_fault("module_enter", exc)

    def on_module_exit(self, fqn: str, phase: str, error: BaseException | None = None) -> None:
        if not self.accepting:
            return
        try:
            frame = self._pop(s.KIND_MODULE, (fqn, phase))
            if frame is not None:
                if error is not None:
                    _mark_error(frame.span, error)
                self._end(frame)
        except Exception as exc:
            self.on_fault("module_exit", exc)

    def on_backward_end(self) -> None:
        if not self.accepting:
            return
        try:
            open_backward = [f for f in self._stack if f.kind == s.KIND_MODULE and f.phase == s.PHASE_BACKWARD]
            for frame in reversed(open_backward):
                self._pop(s.KIND_MODULE, frame.key)
                self._end(frame)
        except Exception as exc:
            self.on_fault("backward_end", exc)

    # --- observer: ops --------------------------------------------------------
    def on_op_enter(self, op_name: str, inputs: Sequence[TensorInfo]) -> None:
        if not self.accepting:
            return
        try:
            phase, fqn = self._phase()
            attrs = encode_tensor_infos(inputs, "input")
            attrs[s.CALL_KIND] = s.KIND_OP
            attrs[s.OP_NAME] = op_name
            attrs[s.PHASE] = phase
            self._push(s.KIND_OP, op_name, op_name, attrs, phase, fqn)
        except Exception as exc:
            self.on_fault("op_enter", exc)

    def on_op_exit(self, op_name: str, outputs: Sequence[TensorInfo], error: BaseException | None = None) -> None:
        if not self.accepting:
            return
        try:
            frame = self._pop(s.KIND_OP, op_name)
            if frame is None:
                return
            if outputs:
                frame.span.set_attributes(encode_tensor_infos(outputs, "output"))
            if error is not None:
                _mark_error(frame.span, error)
            self._end(frame)
        except Exception as exc:
            self.on_fault("op_exit", exc)

    # --- observer: redistribute -------------------------------------------------
    def on_redistribute_enter(self, src_placements: str, dst_placements: str, shape: tuple[int, ...]) -> None:
        if not self.accepting:
            return
        try:
            phase, fqn = self._phase()
            attrs = {
                s.CALL_KIND: s.KIND_REDISTRIBUTE,
                s.REDISTRIBUTE_SRC_PLACEMENTS: src_placements,
                s.REDISTRIBUTE_DST_PLACEMENTS: dst_placements,
                s.TENSOR_SHAPE: shape,
                s.PHASE: phase,
            }
            self._push(s.KIND_REDISTRIBUTE, None, s.REDISTRIBUTE_SPAN_NAME, attrs, phase, fqn)
        except Exception as exc:
            self.on_fault("redistribute_enter", exc)

    def on_redistribute_exit(self, error: BaseException | None = None) -> None:
        if not self.accepting:
            return
        try:
            frame = self._pop(s.KIND_REDISTRIBUTE, None)
            if frame is not None:
                if error is not None:
                    _mark_error(frame.span, error)
                self._end(frame)
        except Exception as exc:
            self.on_fault("redistribute_exit", exc)

    # --- observer: collectives --------------------------------------------------
    def on_collective(
        self,
        info: CollectiveInfo,
        start_ns: int,
        end_ns: int,
        error: BaseException | None = None,
        phase: str | None = None,
    ) -> None:
        if not self.accepting:
            return
        try:
            phase, fqn = self._count(info, phase)
            key = (info.name, info.op, info.group_size, info.dtype, phase, fqn)
            metric_attrs = self._metric_attrs.get(key)
            if metric_attrs is None:
                metric_attrs = dict(zip(s.METRIC_ATTRIBUTE_KEYS, key, strict=True))
                self._metric_attrs[key] = metric_attrs
            inst = self._instruments
            inst.calls.add(1, metric_attrs)
            inst.bytes.add(info.bytes, metric_attrs)
            inst.duration.record((end_ns - start_ns) / 1e9, metric_attrs)
        except Exception as exc:
            self.on_fault("collective_metrics", exc)
        try:
            attrs = self._collective_attrs.get(info)
            if attrs is None:
                attrs = encode_collective(info)
                self._collective_attrs[info] = attrs
            stack = self._stack
            parent_ctx = stack[-1].ctx if stack else self._parent_ctx
            span = self._tracer.start_span(
                info.op, context=parent_ctx, attributes={**attrs, s.PHASE: phase}, start_time=start_ns
            )
            if error is not None:
                _mark_error(span, error)
            span.end(end_time=end_ns)
            if isinstance(span, ReadableSpan):
                self._store.export((span,))
        except Exception as exc:
            self.on_fault("collective_span", exc)

    def _count(self, info: CollectiveInfo, phase_hint: str | None) -> tuple[str, str]:
        """Exact counts, overall and per open module; returns the innermost module's (phase, fqn)."""
        name = info.name
        counts = self.comm_counts
        counts[name] = counts.get(name, 0) + 1
        self.comm_ops[name] = info.op
        innermost: tuple[str, str] | None = None
        seen: set[tuple[str, str]] = set()
        for frame in reversed(self._stack):
            if frame.kind != s.KIND_MODULE or (frame.fqn, frame.phase) in seen:
                continue
            seen.add((frame.fqn, frame.phase))
            if innermost is None:
                innermost = (frame.phase, frame.fqn)
            per_phase = self.module_counts.setdefault(frame.fqn, {}).setdefault(frame.phase, {})
            per_phase[name] = per_phase.get(name, 0) + 1
        return innermost or (phase_hint or s.PHASE_FORWARD, "")

    # --- faults -------------------------------------------------------------------
    def on_fault(self, where: str, exc: BaseException) -> None:
        """Count a fault in our own code, log it once per kind, and keep going."""
        try:
            first = where not in self.fault_counts
            self.fault_counts[where] = self.fault_counts.get(where, 0) + 1
            if first:
                logger.warning(
                    "hp_otel: %s callback failed; tracing continues and the traced code is unaffected "
                    "(further %s faults are counted, not logged)",
                    where,
                    where,
                    exc_info=exc,
                )
            self._instruments.callback_errors.add(1, {s.CALLBACK_NAME: where})
        except Exception:  # pragma: no cover - logging itself failed; nothing more we can do safely
            pass
