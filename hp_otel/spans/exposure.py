"""Exposed communication: how much of a window's collective time its thread spent waiting.

Definitions (docs/overlap.md says the same for users):

- a collective is *in flight* over `[issue, completion]`: its span's start and end;
- the window's thread is *blocked on communication* while it is inside a collective call
  or waiting for one: a synchronous collective's whole span; an async one's issuing call
  (`hp_otel.collective.call.duration` from its start) and the wait that completed it
  (`hp_otel.collective.wait.duration`, ending at its end: `wait_tensor`, `Work.wait()`);
- *communication time* of a set of collectives = length of the union of their in-flight
  intervals; *exposed* = the part of that union during which the thread was blocked (by any
  collective); *overlapped* = the rest, when the thread ran something else — compute, or
  any host code: hp_otel sees the thread, not the device's kernels;
- *overlap fraction* = overlapped / communication time.

Per phase and per module (the module that issued the collective) the same is computed over
that subset; subsets overlap each other in time, so their figures do not add up to the
window's.  Pure functions over `CommSpan`s: the recorder (metrics), the table, `hp-otel
ranks` and the plot all call `summarise`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hp_otel.common import intervals
from hp_otel.spans import schema

_FULLY_BLOCKING = (schema.COMPLETION_CALL, "")


@dataclass(frozen=True, slots=True)
class CommSpan:
    """One collective as the exposure arithmetic sees it."""

    start_ns: int
    end_ns: int
    phase: str = schema.PHASE_FORWARD
    module: str = ""
    blocked: tuple[intervals.Interval, ...] = ()  # when the thread waited on it

    @classmethod
    def of(
        cls,
        start_ns: int,
        end_ns: int,
        *,
        is_async: bool,
        completion: str,
        call_ns: int = 0,
        waited_ns: int = 0,
        phase: str = schema.PHASE_FORWARD,
        module: str = "",
    ) -> CommSpan:
        """From what a span or an event says: a synchronous call blocks for its whole span."""
        end_ns = max(end_ns, start_ns)
        if not is_async or completion in _FULLY_BLOCKING:
            blocked: tuple[intervals.Interval, ...] = ((start_ns, end_ns),)
        else:
            parts = []
            if call_ns > 0:
                parts.append((start_ns, min(start_ns + call_ns, end_ns)))
            if waited_ns > 0:
                parts.append((max(end_ns - waited_ns, start_ns), end_ns))
            blocked = tuple(parts)
        return cls(start_ns, end_ns, phase, module, blocked)


@dataclass(frozen=True, slots=True)
class Exposure:
    """Communication time of a set of collectives, and the part of it the thread waited for."""

    comm_ns: int = 0
    exposed_ns: int = 0
    collectives: int = 0

    @property
    def overlapped_ns(self) -> int:
        return self.comm_ns - self.exposed_ns

    @property
    def overlap_fraction(self) -> float | None:
        """overlapped / communication time; None without communication time."""
        return self.overlapped_ns / self.comm_ns if self.comm_ns > 0 else None

    def to_json(self) -> dict[str, Any]:
        return {
            "comm_ns": self.comm_ns,
            "exposed_ns": self.exposed_ns,
            "overlapped_ns": self.overlapped_ns,
            "overlap_fraction": self.overlap_fraction,
            "collectives": self.collectives,
        }


@dataclass(frozen=True)
class ExposureReport:
    """A window's (or a rank's) exposure: in total, per phase, per (phase, module)."""

    total: Exposure = field(default_factory=Exposure)
    by_phase: Mapping[str, Exposure] = field(default_factory=dict)
    by_module: Mapping[tuple[str, str], Exposure] = field(default_factory=dict)  # (phase, module)

    def to_json(self) -> dict[str, Any]:
        return {
            **self.total.to_json(),
            "by_phase": {phase: e.to_json() for phase, e in sorted(self.by_phase.items())},
            "by_module": [
                {"phase": phase, "module": module, **e.to_json()}
                for (phase, module), e in sorted(self.by_module.items())
            ],
        }


def _exposure(comms: Sequence[CommSpan], blocked: list[intervals.Interval]) -> Exposure:
    flight = intervals.union((c.start_ns, c.end_ns) for c in comms)
    return Exposure(intervals.length(flight), intervals.length(intervals.intersect(flight, blocked)), len(comms))


def summarise(comms: Iterable[CommSpan], by_module: bool = True) -> ExposureReport:
    """The exposure of these collectives (one window's, one rank's); per module only with `by_module`
    (half the cost: a step's modules each intersect the window's blocked time)."""
    comms = list(comms)
    if not comms:
        return ExposureReport()
    blocked = intervals.union(b for c in comms for b in c.blocked)
    phases: dict[str, list[CommSpan]] = {}
    modules: dict[tuple[str, str], list[CommSpan]] = {}
    for c in comms:
        phases.setdefault(c.phase, []).append(c)
        modules.setdefault((c.phase, c.module), []).append(c)
    return ExposureReport(
        _exposure(comms, blocked),
        {phase: _exposure(group, blocked) for phase, group in phases.items()},
        {key: _exposure(group, blocked) for key, group in modules.items()} if by_module else {},
    )


def _seconds_as_ns(value: Any, name: str) -> int:
    """A duration attribute (seconds) in whole ns; absent is 0. A value that is no number fails naming it."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number of seconds, got {value!r}")
    return round(value * 1e9)


def comm_span_of(attrs: Mapping[str, Any], start_ns: int, end_ns: int) -> CommSpan:
    """A collective span's `CommSpan`, from its attributes and times."""
    return CommSpan.of(
        start_ns,
        end_ns,
        is_async=bool(attrs.get(schema.COLLECTIVE_ASYNC, False)),
        completion=str(attrs.get(schema.COLLECTIVE_COMPLETION, "")),
        call_ns=_seconds_as_ns(attrs.get(schema.COLLECTIVE_CALL_DURATION), schema.COLLECTIVE_CALL_DURATION),
        waited_ns=_seconds_as_ns(attrs.get(schema.COLLECTIVE_WAIT_DURATION), schema.COLLECTIVE_WAIT_DURATION),
        phase=str(attrs.get(schema.PHASE, schema.PHASE_FORWARD)),
        module=str(attrs.get(schema.COLLECTIVE_MODULE, "")),
    )


def by_window(spans: Iterable[Any], by_module: bool = True) -> dict[str, ExposureReport]:
    """Finished spans (ReadableSpan-like: attributes, start_time, end_time) -> exposure per window label
    (`hp_otel.collective.window`; "" for spans that carry none); per module too with `by_module`."""
    windows: dict[str, list[CommSpan]] = {}
    for span in spans:
        attrs = span.attributes or {}
        if attrs.get(schema.CALL_KIND) != schema.KIND_COLLECTIVE or attrs.get(schema.COLLECTIVE_IN_FLIGHT):
            continue
        if (
            attrs.get(schema.COLLECTIVE_BACKEND) == schema.BACKEND_FAKE
        ):  # returned at once: it overlapped nothing, exposed nothing
            continue
        start, end = span.start_time or 0, span.end_time or 0
        windows.setdefault(str(attrs.get(schema.COLLECTIVE_WINDOW, "")), []).append(comm_span_of(attrs, start, end))
    return {window: summarise(comms, by_module) for window, comms in windows.items()}


def _ms(ns: int) -> str:
    return f"{ns / 1e6:.3f} ms"


def describe(e: Exposure) -> str:
    """`comm 12.000 ms, exposed 6.000 ms, overlapped 6.000 ms (50%)`."""
    fraction = e.overlap_fraction
    share = f" ({fraction:.0%})" if fraction is not None else ""
    return f"comm {_ms(e.comm_ns)}, exposed {_ms(e.exposed_ns)}, overlapped {_ms(e.overlapped_ns)}{share}"


FAKE_GROUP_NOTE = (
    "communication: not timed: {count} collective(s) on torch's fake process group, which returns at once "
    "(no time, bandwidth or overlap to show)"
)


def footer_lines(report: ExposureReport, label: str = "") -> list[str]:
    """Lines for a table footer: the total, then each phase."""
    if report.total.collectives == 0:
        return []
    head = f"communication{f' ({label})' if label else ''}: {describe(report.total)}"
    lines = [head]
    for phase, e in sorted(report.by_phase.items()):
        lines.append(f"  {phase}: {describe(e)}")
    return lines
