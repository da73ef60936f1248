"""A counts-only window's path (`record_spans=False`, an unsampled step): exact counts, metrics and the
staleness gauges, no event kept for a span. Modules are still followed: a collective counts for the
calls it runs in."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from time import time_ns
from typing import Any

from hp_otel.record import events as ev
from hp_otel.record.collective_metrics import call_bandwidth
from hp_otel.record.window_path import WindowPath
from hp_otel.spans import schema
from hp_otel.spans.infos import CollectiveInfo, ModuleCall, ModuleInfo, TensorInfo

_FORWARD = schema.PHASE_FORWARD
_LAUNCH = schema.COMPLETION_LAUNCH
_get_ident = threading.get_ident


class CountsPath(WindowPath):
    """The observer calls of a window that counts only."""

    def follow_backward(self, chain: tuple[ModuleCall, ...], time_ns: int) -> None:
        self._attribution.backward_calls = chain  # the calls followed: no span to open or close

    def on_module_enter(self, module: ModuleInfo, phase: str) -> None:
        if not self.accepting:
            return
        try:
            modules = self._stacks.get(_get_ident())
            if modules is not None and phase is _FORWARD:  # `_open_call`'s common case, inline
                modules.append((module.fqn, phase))
            else:
                self._open_call(module.fqn, phase)
        except Exception as exc:
            self._on_fault("module_enter", exc)

    def on_module_exit(self, fqn: str, phase: str, error: BaseException | None = None) -> None:
        if not self.accepting:
            return
        try:
            modules = self._stacks.get(_get_ident())
            if modules and len(modules) > 1 and modules[-1] == (fqn, phase):  # `_close_call`'s common case, inline
                del modules[-1]
            else:
                self._close_call(fqn, phase)
        except Exception as exc:
            self._on_fault("module_exit", exc)

    def on_backward_end(self) -> None:
        if not self.accepting:
            return
        try:
            self._end_backward()
        except Exception as exc:
            self._on_fault("backward_end", exc)

    def on_op_enter(self, op_name: str, inputs: Sequence[TensorInfo]) -> None:
        """No op span in a counts-only window (sources install no op hook; an extra source may call)."""

    def on_op_exit(self, op_name: str, outputs: Sequence[TensorInfo], error: BaseException | None = None) -> None:
        """See `on_op_enter`."""

    def on_redistribute_enter(self, src_placements: str, dst_placements: str, shape: tuple[int, ...]) -> None:
        if not self.accepting:
            return
        try:
            self._redistribute_follows(time_ns())
        except Exception as exc:
            self._on_fault("redistribute_enter", exc)

    def on_redistribute_exit(self, error: BaseException | None = None) -> None:
        """Nothing to count."""

    def on_collective_issue(self, info: CollectiveInfo, start_ns: int, phase: str | None = None) -> Any:
        if not self.accepting:
            return None
        try:
            if not self.wants_completion:  # counts need no issue record: the staleness gauges' ticket only
                launch = ev.Launch(start_ns, info)  # (and, if launched, its completion record)
                self._liveness.issued(launch, start_ns, info.op, info.group)
                return launch
            return self._issue(info, start_ns, phase)  # a hang watchdog writes the ones in flight
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
    ) -> ev.Collective | ev.Launch | None:
        """Count one collective; a launched one (`awaits_completion`) returns the token its completion
        and wait are reported with (its metrics wait for them)."""
        issue = ticket if type(ticket) is ev.CollectiveIssue else None
        if issue is not None:
            self._in_flight.returned(issue, done, error is not None)
        if not self.accepting:
            if ticket is not None:
                self._liveness.forget(ticket)
            return None
        try:
            if issue is not None:
                place = issue.place
            else:
                place = self._attribution.attribute(phase)
                if place.chain is not None:  # backward: the calls followed first
                    self.follow_backward(place.chain, start_ns)
            self._count(info, place)
            if not awaits_completion or error is not None:  # finished: nothing more to keep
                duration_ns = end_ns - start_ns
                bw = call_bandwidth(info, duration_ns) if error is None else None
                self._metrics.measure(info, place, duration_ns, error, bw)
                self._liveness.completed(ticket, end_ns)
                return None
            key = self._metrics.measure(info, place, None, error, None)
            if type(ticket) is ev.Launch:
                # No watchdog: the issue's ticket, in flight since its issue, is the launch's token too
                # (what a `Collective` would hold for the metrics, and the same place in the staleness gauges).
                ticket.start_ns = start_ns
                ticket.info = info
                ticket.end_ns = ticket.returned_ns = end_ns
                ticket.completion = _LAUNCH
                self._metrics.awaiting(ticket, key)
                return ticket
            event = ev.Collective(
                start_ns=start_ns,
                end_ns=end_ns,
                info=info,
                error=error,
                place=place,
                seq=-1 if issue is None else issue.seq,
                issue=issue,
                completion=schema.COMPLETION_LAUNCH,
                returned_ns=end_ns,
                device=device,
                stack=() if issue is None else issue.stack,
                bw=None,
                bw_ns=-1,
            )
            self._metrics.awaiting(event, key)
            self._liveness.launched(ticket, event, start_ns, info.op, info.group)
            return event
        except Exception as exc:
            self._on_fault("collective", exc)
            return None
