"""Spans as Chrome / Perfetto trace-event JSON, optionally merged with a torch.profiler trace.

Each hp_otel call becomes a complete event (`"ph": "X"`) on a process track of its own
per rank ("hp_otel rank r"), with its span attributes as `args`. torch.profiler's chrome
traces put `ts` in µs after `baseTimeNanoseconds` (Unix epoch); hp_otel's spans carry
Unix-epoch nanoseconds, so merged events line up on the profiler's clock: hp_otel's
collectives sit next to the kernels and CPU ops they launched.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan

from hp_otel.spans.call_tree import CallRecord, build_call_tree

PID_BASE = 1_000_000  # hp_otel's process tracks: PID_BASE + rank, apart from real pids


class ProfilerTraceError(ValueError):
    """A file that is not a torch.profiler (Chrome trace-event) JSON trace."""


def _args(record: CallRecord) -> dict[str, Any]:
    return {key: list(value) if isinstance(value, tuple) else value for key, value in record.attributes.items()}


def trace_events(spans_by_rank: Mapping[int, Sequence[ReadableSpan]], base_ns: int) -> list[dict[str, Any]]:
    """Metadata naming each rank's track, then one complete event per call (µs after `base_ns`)."""
    events: list[dict[str, Any]] = []
    for rank in sorted(spans_by_rank):
        pid = PID_BASE + rank
        track = (("process_name", {"name": f"hp_otel rank {rank}"}), ("process_sort_index", {"sort_index": -1}))
        for name, args in track:
            events.append({"ph": "M", "name": name, "pid": pid, "tid": 0, "args": args})
        for root in build_call_tree(spans_by_rank[rank]):
            for record in root.walk():
                events.append(
                    {
                        "ph": "X",
                        "cat": f"hp_otel.{record.kind}",
                        "name": record.name,
                        "pid": pid,
                        "tid": 1,
                        "ts": (record.start_ns - base_ns) / 1000,
                        "dur": record.duration_ns / 1000,
                        "args": _args(record),
                    }
                )
    return events


def read_profiler_trace(path: str | os.PathLike[str]) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as handle:
            trace = json.load(handle)
    except (OSError, ValueError) as exc:
        raise ProfilerTraceError(f"profiler trace {os.fspath(path)!r} cannot be read as JSON: {exc}") from exc
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise ProfilerTraceError(f"profiler trace {os.fspath(path)!r} has no 'traceEvents' list")
    if not isinstance(trace.get("baseTimeNanoseconds"), int):
        raise ProfilerTraceError(
            f"profiler trace {os.fspath(path)!r} has no 'baseTimeNanoseconds' (torch.profiler's export_chrome_trace "
            "writes it; without it its clock cannot be matched)"
        )
    return trace


def chrome_trace(
    spans_by_rank: Mapping[int, Sequence[ReadableSpan]], profiler_trace: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The trace-event document: the profiler's, with hp_otel's tracks added; or hp_otel's alone."""
    if profiler_trace is not None:
        base_ns = int(profiler_trace["baseTimeNanoseconds"])
        merged = dict(profiler_trace)
        merged["traceEvents"] = [*profiler_trace["traceEvents"], *trace_events(spans_by_rank, base_ns)]
        return merged
    starts = [span.start_time for spans in spans_by_rank.values() for span in spans if span.start_time]
    base_ns = (min(starts) // 1_000_000_000) * 1_000_000_000 if starts else 0
    events = trace_events(spans_by_rank, base_ns)
    return {"traceEvents": events, "displayTimeUnit": "ms", "baseTimeNanoseconds": base_ns}
