"""Live staleness of one process's collectives, for always-on monitoring of hangs.

Three observable gauges read this state when a metric reader collects:
collectives in flight now, seconds since one last completed, and the age of the oldest
one in flight (with its op and group).  A rank whose last completion is old while its
peers' are fresh is a hang suspect (`deploy/alerts/hp_otel_rules.yml`).

The training step only does dict updates here (one insert at issue, one pop at
completion); the gauges compute ages at collection time.  "In flight": issued (or, for
sources that report no issue, launched) and not completed — a synchronous call until it
returns, an async one until its wait or Work is seen.  An async collective whose
completion was never seen by the time its window ends is dropped (not counted as
completed, not left in flight forever).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from hp_otel.spans import schema

_MAX_IN_FLIGHT = 4096  # work nobody waits for: forget the oldest beyond this
_now = time.time_ns


class Liveness:
    """Collectives in flight and the last completion time, per metric provider (so across windows)."""

    def __init__(self) -> None:
        # id(key) -> (start_ns, op, group, key): by identity (events are not hashable);
        # the key is held so that its id stays its own
        self._in_flight: dict[int, tuple[int, str, str, Any]] = {}
        self.last_completion_ns = 0
        self.first_issue_ns = 0

    # --- the hot path -----------------------------------------------------------
    def issued(self, key: Any, start_ns: int, op: str, group: str) -> None:
        in_flight = self._in_flight
        if len(in_flight) >= _MAX_IN_FLIGHT:
            in_flight.pop(next(iter(in_flight)), None)
        in_flight[id(key)] = (start_ns, op, group, key)
        if not self.first_issue_ns:
            self.first_issue_ns = start_ns

    def completed(self, key: Any, end_ns: int) -> None:
        """`key`'s collective completed at `end_ns` (a key never issued still counts as a completion)."""
        self._in_flight.pop(id(key), None)
        if end_ns > self.last_completion_ns:
            self.last_completion_ns = end_ns

    def launched(self, key: Any, token: Any, start_ns: int, op: str, group: str) -> None:
        """`key`'s call returned but its work is not done: in flight as `token` until `completed(token)`."""
        in_flight = self._in_flight
        entry = in_flight.pop(id(key), None) if key is not None else None
        if entry is not None:  # `issued()`, inline: its place in flight goes to the token
            in_flight[id(token)] = (entry[0], op, group, token)
        else:
            self.issued(token, start_ns, op, group)

    def forget(self, key: Any) -> None:
        """Drop `key` without a completion (its completion will never be seen)."""
        self._in_flight.pop(id(key), None)

    # --- the gauges -------------------------------------------------------------------
    def snapshot(self) -> list[tuple[int, str, str]]:
        """(start_ns, op, group) of each collective in flight (one C-level copy: safe while the step updates)."""
        return [entry[:3] for entry in list(self._in_flight.values())]

    def observe_in_flight(self, options: CallbackOptions) -> Iterable[Observation]:
        if not self.first_issue_ns:
            return []
        return [Observation(len(self._in_flight))]

    def observe_since_completion(self, options: CallbackOptions) -> Iterable[Observation]:
        """Seconds since the last completion; before the first one, since the first issue."""
        since = self.last_completion_ns or self.first_issue_ns
        if not since:
            return []
        return [Observation(max(_now() - since, 0) / 1e9)]

    def observe_oldest(self, options: CallbackOptions) -> Iterable[Observation]:
        entries = self.snapshot()
        if not entries:
            return []
        start_ns, op, group = min(entries)
        return [
            Observation(max(_now() - start_ns, 0) / 1e9, {schema.COLLECTIVE_OP: op, schema.COLLECTIVE_GROUP: group})
        ]

    def register(self, meter: Meter, on_fault: Callable[[str, BaseException], None]) -> None:
        """The three observable gauges on `meter`; a callback fault is counted with `on_fault`."""

        def guarded(
            observe: Callable[[CallbackOptions], Iterable[Observation]], where: str
        ) -> Callable[[CallbackOptions], Iterable[Observation]]:
            def callback(options: CallbackOptions) -> Iterable[Observation]:
                try:
                    return list(observe(options))
                except Exception as exc:
                    on_fault(where, exc)
                    return []

            return callback

        meter.create_observable_gauge(
            schema.METRIC_IN_FLIGHT,
            callbacks=[guarded(self.observe_in_flight, "liveness_in_flight")],
            unit=schema.METRIC_IN_FLIGHT_UNIT,
            description="Collectives issued and not completed now.",
        )
        meter.create_observable_gauge(
            schema.METRIC_SINCE_COMPLETION,
            callbacks=[guarded(self.observe_since_completion, "liveness_since_completion")],
            unit=schema.METRIC_SINCE_COMPLETION_UNIT,
            description="Seconds since a collective last completed (before the first: since the first issue).",
        )
        meter.create_observable_gauge(
            schema.METRIC_OLDEST_IN_FLIGHT,
            callbacks=[guarded(self.observe_oldest, "liveness_oldest")],
            unit=schema.METRIC_OLDEST_IN_FLIGHT_UNIT,
            description="Age of the oldest collective in flight, with its op and group.",
        )
