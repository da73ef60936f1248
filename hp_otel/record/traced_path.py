"""A traced window's path: what the counts-only path does, and each event kept for its span
(`SpanFeed`), the collective also for the window's exposed-communication figures (`WindowExposure`)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from time import time_ns
from typing import Any

from hp_otel.record import events as ev
from hp_otel.record.attribution import Attribution
from hp_otel.record.collective_metrics import CollectiveMetrics, call_bandwidth
from hp_otel.record.faults import FaultSink
from hp_otel.record.in_flight import InFlight
from hp_otel.record.liveness import Liveness
from hp_otel.record.settings import RecorderSettings
from hp_otel.record.span_feed import SpanFeed
from hp_otel.record.window_exposure import WindowExposure
from hp_otel.record.window_path import WindowPath
from hp_otel.spans import schema
from hp_otel.spans.infos import CollectiveInfo, ModuleCall, ModuleInfo, TensorInfo

_get_ident = threading.get_ident


class TracedPath(WindowPath):
    """The observer calls of a window that records spans."""

    def __init__(
        self,
        settings: RecorderSettings,
        metrics: CollectiveMetrics,
        liveness: Liveness,
        in_flight: InFlight,
        counts: tuple[dict[str, int], dict[str, str], dict[str, dict[str, dict[str, int]]]],
        on_fault: FaultSink,
        spans: SpanFeed,
        exposure: WindowExposure,
    ) -> None:
        super().__init__(settings, metrics, liveness, in_flight, counts, on_fault)
        self._spans = spans
        self._emit = spans.emit
        self._exposure = exposure
        self._backward_moved_ns = 0  # when the open backward spans last changed

    def stop(self, error: BaseException | None) -> None:
        try:
            self._emit(ev.WindowEnd(time_ns(), error))  # spans still open end now
        except Exception as exc:
            self._on_fault("window_end", exc)
        super().stop(error)

    def follow_backward(self, chain: tuple[ModuleCall, ...], time_ns: int) -> None:
        """Close the open backward spans not in `chain`, open those of `chain` not open yet."""
        attribution = self._attribution
        open_calls = attribution.backward_calls
        same = 0
        limit = min(len(open_calls), len(chain))
        while same < limit and open_calls[same] is chain[same]:
            same += 1
        if same == len(open_calls) == len(chain):
            return
        # never before the previous move: a span must not end before it started
        time_ns = self._backward_moved_ns = max(time_ns, self._backward_moved_ns)
        attribution.backward_calls = chain
        emit = self._emit
        for call in reversed(open_calls[same:]):
            try:
                emit(ev.ModuleExit(time_ns, call.module.fqn, schema.PHASE_BACKWARD, None))
            except Exception as exc:
                self._on_fault("module_exit", exc)
        for call in chain[same:]:
            try:
                emit(ev.ModuleEnter(time_ns, call.module, schema.PHASE_BACKWARD))
            except Exception as exc:
                self._on_fault("module_enter", exc)

    def _open_owner(self, place: Attribution, time_ns: int) -> None:
        """Module spans of the group's module (and enclosing calls not open) around its collective."""
        phase = place.phase
        for i, module in enumerate(place.opened):
            self._emit(ev.ModuleEnter(time_ns, module, phase, (place.under or ("", "")) if i == 0 else None))

    def _completed(self, token: ev.Collective) -> None:
        builder = self._spans.builder
        if self._spans.live and builder is not None and _get_ident() == self.thread:  # live spans end on it only
            builder.complete_collective(token)

    # --- observer calls -------------------------------------------------------------
    def on_module_enter(self, module: ModuleInfo, phase: str) -> None:
        if not self.accepting:
            return
        try:
            self._open_call(module.fqn, phase)
            self._emit(ev.ModuleEnter(time_ns(), module, phase))
        except Exception as exc:
            self._on_fault("module_enter", exc)

    def on_module_exit(self, fqn: str, phase: str, error: BaseException | None = None) -> None:
        if not self.accepting:
            return
        try:
            self._close_call(fqn, phase)
            self._emit(ev.ModuleExit(time_ns(), fqn, phase, error))
        except Exception as exc:
            self._on_fault("module_exit", exc)

    def on_backward_end(self) -> None:
        if not self.accepting:
            return
        try:
            self._end_backward()
            self._emit(ev.BackwardEnd(time_ns()))
        except Exception as exc:
            self._on_fault("backward_end", exc)

    def on_op_enter(self, op_name: str, inputs: Sequence[TensorInfo]) -> None:
        if not self.accepting:
            return
        try:
            self._emit(ev.OpEnter(time_ns(), op_name, inputs))
        except Exception as exc:
            self._on_fault("op_enter", exc)

    def on_op_exit(self, op_name: str, outputs: Sequence[TensorInfo], error: BaseException | None = None) -> None:
        if not self.accepting:
            return
        try:
            self._emit(ev.OpExit(time_ns(), op_name, outputs, error))
        except Exception as exc:
            self._on_fault("op_exit", exc)

    def on_redistribute_enter(self, src_placements: str, dst_placements: str, shape: tuple[int, ...]) -> None:
        if not self.accepting:
            return
        try:
            now = time_ns()
            self._redistribute_follows(now)
            call_stack = self._call_stack
            stack = call_stack.capture() if call_stack is not None else ()
            self._emit(ev.RedistributeEnter(now, src_placements, dst_placements, shape, stack))
        except Exception as exc:
            self._on_fault("redistribute_enter", exc)

    def on_redistribute_exit(self, error: BaseException | None = None) -> None:
        if not self.accepting:
            return
        try:
            self._emit(ev.RedistributeExit(time_ns(), error))
        except Exception as exc:
            self._on_fault("redistribute_exit", exc)

    def on_collective_issue(self, info: CollectiveInfo, start_ns: int, phase: str | None = None) -> Any:
        if not self.accepting:
            return None
        try:
            issue = self._issue(info, start_ns, phase)
            self._emit(issue)
            return issue
        except Exception as exc:
            self._on_fault("collective_issue", exc)
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
            self._in_flight.returned(issue, done, error is not None)
        if not self.accepting:
            if ticket is not None:
                self._liveness.forget(ticket)
            return None
        try:
            if issue is not None:  # its issue took its place, number and stack (and opened its owner's spans)
                place = issue.place
                seq, stack = issue.seq, issue.stack
            else:  # a source without issue records: decided now
                place = self._attribution.attribute(phase)
                if place.chain is not None:  # backward: the open backward spans follow its calls first
                    self.follow_backward(place.chain, start_ns)
                seq = self._next_seq(info)
                call_stack = self._call_stack
                stack = call_stack.capture() if call_stack is not None else ()
                if place.opened:
                    self._open_owner(place, start_ns)
            self._count(info, place)
            awaits = awaits_completion and error is None
            duration_ns = end_ns - start_ns
            measured = not awaits and error is None  # its bandwidth is known now (else: at completion, or none)
            bw = call_bandwidth(info, duration_ns) if measured else None
            key = self._metrics.measure(info, place, None if awaits else duration_ns, error, bw)
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
                self._metrics.awaiting(event, key)
                self._liveness.launched(ticket, event, start_ns, info.op, info.group)
            else:
                self._liveness.completed(ticket, end_ns)
            self._emit(event)
            opened = place.opened  # FSDP's forward prefetch: the spans of the module whose parameters move
            if opened:
                for module in reversed(opened):
                    self._emit(ev.ModuleExit(end_ns, module.fqn, place.phase, None))
            self._exposure.add(event, awaits)
            return event if awaits else None
        except Exception as exc:
            self._on_fault("collective", exc)
            return None
