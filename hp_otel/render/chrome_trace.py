"""Spans as Chrome / Perfetto trace-event JSON, optionally merged with a torch.profiler trace.

Each hp_otel call becomes a complete event (`"ph": "X"`) in a process of its own per rank
("hp_otel rank r"), with its span attributes as `args`. Complete events on one thread track
must nest (Perfetto does not support partial overlap and mis-nests it), and a collective
ends at its completion, often after the op that issued it returned; so modules, ops and
redistributes go on the "calls" thread, and each rank's collectives on a thread per process
group ("collectives tp [0,1]"), as Kineto shows a communication stream. Anything that
would still overlap partially (async collectives of one group in flight together) moves to
the next thread of its kind ("calls (2)", "collectives tp [0,1] (2)"). The same collective on
each rank (`render/cross_rank.py`, as the timeline's dashed lines) is joined by a flow in
Perfetto's "flow v2" form: `bind_id`, `flow_out` on one rank's event, `flow_in` on the next
rank's, in the order the ranks started it (Perfetto sorts by time, and a flow must begin
before it ends), so Perfetto draws an arrow from each rank's collective to the next one's. torch.profiler's chrome
traces put `ts` in µs after `baseTimeNanoseconds` (Unix epoch); hp_otel's spans carry
Unix-epoch nanoseconds, so merged events line up on the profiler's clock: hp_otel's
collectives sit next to the kernels and CPU ops they launched.

Each collective event also carries the args torch.profiler's Kineto writer puts on one
(`render/kineto.py`), and `chrome_traces_per_rank` writes a file per rank with its
`distributedInfo`, the layout Holistic Trace Analysis reads a run's folder in.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan

from hp_otel.common.input_files import InputFileError, read_json
from hp_otel.render import kineto
from hp_otel.render.cross_rank import CollectiveKeys
from hp_otel.spans import schema
from hp_otel.spans.call_tree import CallRecord, build_call_tree, span_attributes

PID_BASE = 1_000_000  # hp_otel's process tracks: PID_BASE + rank, apart from real pids


class ProfilerTraceError(ValueError):
    """A file that is not a torch.profiler (Chrome trace-event) JSON trace."""


def _args(record: CallRecord) -> dict[str, Any]:
    args = {key: list(value) if isinstance(value, tuple) else value for key, value in record.attributes.items()}
    if record.kind == schema.KIND_COLLECTIVE:
        args.update(kineto.collective_args(record.attributes, record.group))
    return args


CALLS_TID = 1
COLLECTIVES_TID = 100  # the first collectives track of a rank; groups (and their overflow tracks) count up


def _group_track(record: CallRecord) -> str:
    return f"collectives {record.group.label()}"


def _groups_of(records: Sequence[CallRecord]) -> Any:
    """The group table the rank's collective records share (build_call_tree made one per rank)."""
    return next((r.groups for r in records if r.groups is not None), None)


def nesting_lanes(intervals: Sequence[tuple[int, int]]) -> list[int]:
    """A lane per interval such that two intervals of one lane are disjoint or one contains the other.

    Greedy, in start order (longest first on ties): an interval joins the first lane whose
    innermost still-open interval contains it, or that has nothing open.
    """
    order = sorted(range(len(intervals)), key=lambda i: (intervals[i][0], -intervals[i][1]))
    open_stacks: list[list[int]] = []  # per lane: the ends of the intervals open at the current start
    lanes = [0] * len(intervals)
    for i in order:
        start, end = intervals[i]
        for stack in open_stacks:
            while stack and stack[-1] <= start:
                stack.pop()
        lane = next((k for k, st in enumerate(open_stacks) if not st or end <= st[-1]), len(open_stacks))
        if lane == len(open_stacks):
            open_stacks.append([])
        open_stacks[lane].append(end)
        lanes[i] = lane
    return lanes


def trace_events(spans_by_rank: Mapping[int, Sequence[ReadableSpan]], base_ns: int) -> list[dict[str, Any]]:
    """Metadata naming each rank's process and threads, then one complete event per call (µs after `base_ns`)."""
    events: list[dict[str, Any]] = []
    same_collective: dict[tuple[Any, ...], list[tuple[int, int, dict[str, Any]]]] = {}  # key -> (start, rank, event)
    for rank in sorted(spans_by_rank):
        pid = PID_BASE + rank
        track = (("process_name", {"name": f"hp_otel rank {rank}"}), ("process_sort_index", {"sort_index": -1}))
        for name, args in track:
            events.append({"ph": "M", "name": name, "pid": pid, "tid": 0, "args": args})
        records = [record for root in build_call_tree(spans_by_rank[rank]) for record in root.walk()]
        keys = CollectiveKeys(_groups_of(records))  # fed in call order, as the timeline feeds it
        key_of = {
            id(r): keys.key(r.attributes, str(r.attributes.get(schema.COLLECTIVE_OP, "")) or r.name)[0]
            for r in records
            if r.kind == schema.KIND_COLLECTIVE
        }
        by_track: dict[str, list[CallRecord]] = {}
        for record in records:
            kind = _group_track(record) if record.kind == schema.KIND_COLLECTIVE else "calls"
            by_track.setdefault(kind, []).append(record)
        next_tid = COLLECTIVES_TID
        for kind in sorted(by_track, key=lambda k: (k != "calls", k)):
            members = by_track[kind]
            lanes = nesting_lanes([(r.start_ns, max(r.end_ns, r.start_ns)) for r in members])
            tids: dict[int, int] = {}
            for lane in sorted(set(lanes)):
                if kind == "calls" and lane == 0:
                    tids[lane] = CALLS_TID
                elif kind == "calls":
                    tids[lane] = CALLS_TID + lane
                else:
                    tids[lane] = next_tid
                    next_tid += 1
                name = kind if lane == 0 else f"{kind} ({lane + 1})"
                events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tids[lane], "args": {"name": name}})
                events.append(
                    {
                        "ph": "M",
                        "name": "thread_sort_index",
                        "pid": pid,
                        "tid": tids[lane],
                        "args": {"sort_index": tids[lane]},
                    }
                )
            for record, lane in zip(members, lanes, strict=True):
                event = {
                    "ph": "X",
                    "cat": f"hp_otel.{record.kind}",
                    "name": record.name,
                    "pid": pid,
                    "tid": tids[lane],
                    "ts": (record.start_ns - base_ns) / 1000,
                    "dur": max(record.duration_ns, 0) / 1000,
                    "args": _args(record),
                }
                events.append(event)
                if id(record) in key_of:
                    same_collective.setdefault(key_of[id(record)], []).append((record.start_ns, rank, event))
    for key, ranks in same_collective.items():
        _join(ranks, _flow_id(key))
    return events


def _flow_id(key: tuple[Any, ...]) -> str:
    """A flow id as Perfetto reads one: hexadecimal (another string is dropped without a word), 64 bits.

    The match id is such a number already, unique per collective; a key without one is hashed."""
    if key[1] == "id":
        return f"0x{key[2]}"
    return "0x" + hashlib.sha256(repr(key).encode()).hexdigest()[:16]


def _join(ranks: list[tuple[int, int, dict[str, Any]]], bind_id: str) -> None:
    """One flow from each rank's event of a collective to the next rank's, in start order (one rank: none)."""
    if len(ranks) < 2:
        return
    ranks.sort(key=lambda item: item[:2])
    for position, (_, _, event) in enumerate(ranks):
        event["bind_id"] = bind_id
        if position > 0:
            event["flow_in"] = True
        if position < len(ranks) - 1:
            event["flow_out"] = True


def read_profiler_trace(path: str | os.PathLike[str]) -> dict[str, Any]:
    try:
        trace = read_json(path, "profiler trace")  # the bounded reader: regular file, size limit first
    except InputFileError as exc:
        raise ProfilerTraceError(str(exc)) from None
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        raise ProfilerTraceError(f"profiler trace {os.fspath(path)!r} has no 'traceEvents' list")
    if not isinstance(trace.get("baseTimeNanoseconds"), int):
        raise ProfilerTraceError(
            f"profiler trace {os.fspath(path)!r} has no 'baseTimeNanoseconds' (torch.profiler's export_chrome_trace "
            "writes it; without it its clock cannot be matched)"
        )
    return trace


def profiler_rank(trace: Mapping[str, Any]) -> int | None:
    """The rank a torch.profiler trace says it is of (its `distributedInfo`), None if it does not say."""
    info = trace.get("distributedInfo")
    rank = info.get("rank") if isinstance(info, dict) else None
    return rank if isinstance(rank, int) and not isinstance(rank, bool) else None


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


def chrome_traces_per_rank(
    spans_by_rank: Mapping[int, Sequence[ReadableSpan]],
    profiler_traces: Mapping[int, Mapping[str, Any]] | None = None,
) -> dict[int, dict[str, Any]]:
    """{rank: that rank's document, with `distributedInfo`}: merged into that rank's profiler trace if given.

    A profiler trace has a `distributedInfo` of its own (torch.profiler writes it when a process group
    exists): that one is kept, ours written only where there is none."""
    world = _world_size(spans_by_rank)
    documents: dict[int, dict[str, Any]] = {}
    for rank, spans in spans_by_rank.items():
        document = chrome_trace({rank: spans}, (profiler_traces or {}).get(rank))
        attributes = (span_attributes(span) for span in spans)
        collectives = [attrs for attrs in attributes if attrs.get(schema.CALL_KIND) == schema.KIND_COLLECTIVE]
        document.setdefault("distributedInfo", kineto.distributed_info(rank, world, collectives))
        documents[rank] = document
    return documents


def _world_size(spans_by_rank: Mapping[int, Sequence[ReadableSpan]]) -> int:
    """The world size the ranks' resources say (hp_otel.world.size), else the number of ranks given."""
    for spans in spans_by_rank.values():
        for span in spans:
            size = span.resource.attributes.get(schema.RESOURCE_WORLD_SIZE) if span.resource else None
            if isinstance(size, int) and size > 0:
                return size
    return len(spans_by_rank)
