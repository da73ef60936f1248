"""Exposed-communication metrics: per (phase, module), the seconds collectives were in flight and
the seconds of that the window's thread waited (`hp.collective.time`, `hp.collective.exposed`).

Observable counters over cumulative totals, like calls and bytes: a window that ends adds its
figures to a dict (`add_window`), the SDK reads them when a reader collects.  The overlap fraction
over any range is `1 - rate(exposed) / rate(time)` (docs/overlap.md).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from hp_otel.spans import schema as s
from hp_otel.spans.exposure import CommSpan, ExposureReport, summarise

# One collective as the window's end snapshots it: (start_ns, end_ns, is_async, completion, call_ns,
# waited_ns, phase, module) -- plain tuples, so the step pays no more than building them.
WindowRow = tuple[int, int, bool, str, int, int, str, str]
_MAX_PENDING_WINDOWS = 256  # without a reader collecting, windows are summed in the step past this


def report_of(rows: Iterable[WindowRow]) -> ExposureReport:
    """The exposure of one window's snapshot (spans/exposure.py)."""
    return summarise(
        CommSpan.of(start, end, is_async=is_async, completion=completion, call_ns=call, waited_ns=waited,
                    phase=phase, module=module)
        for start, end, is_async, completion, call, waited, phase, module in rows
    )  # fmt: skip


class ExposureTotals:
    """Cumulative seconds per (phase, module); read by two observable counters.

    A window that ends hands its snapshot over (`defer`); the arithmetic runs when a reader
    collects (or once `_MAX_PENDING_WINDOWS` wait), off the training step's path.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: list[list[WindowRow]] = []
        self.comm_ns: dict[tuple[str, str], int] = {}
        self.exposed_ns: dict[tuple[str, str], int] = {}

    def defer(self, rows: list[WindowRow]) -> None:
        with self._lock:
            self._pending.append(rows)
            full = len(self._pending) >= _MAX_PENDING_WINDOWS
        if full:
            self.flush()

    def flush(self) -> None:
        """Add every window handed over since the last collection."""
        with self._lock:
            pending, self._pending = self._pending, []
        for rows in pending:
            report = report_of(rows)
            with self._lock:
                for key, e in report.by_module.items():
                    self.comm_ns[key] = self.comm_ns.get(key, 0) + e.comm_ns
                    self.exposed_ns[key] = self.exposed_ns.get(key, 0) + e.exposed_ns

    def _observe(self, totals: dict[tuple[str, str], int]) -> list[Observation]:
        self.flush()
        with self._lock:
            items = list(totals.items())
        return [Observation(ns / 1e9, {s.PHASE: phase, s.MODULE_FQN: module}) for (phase, module), ns in items]

    def observe_comm(self, options: CallbackOptions) -> Iterable[Observation]:
        return self._observe(self.comm_ns)

    def observe_exposed(self, options: CallbackOptions) -> Iterable[Observation]:
        return self._observe(self.exposed_ns)

    def register(self, meter: Meter) -> None:
        meter.create_observable_counter(
            s.METRIC_COMM_TIME,
            callbacks=[self.observe_comm],
            unit=s.METRIC_COMM_TIME_UNIT,
            description="Time collectives were in flight (union of [issue, completion] per window).",
        )
        meter.create_observable_counter(
            s.METRIC_COMM_EXPOSED,
            callbacks=[self.observe_exposed],
            unit=s.METRIC_COMM_TIME_UNIT,
            description="Part of hp.collective.time the window's thread spent in or waiting for a collective.",
        )
