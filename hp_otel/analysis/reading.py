"""Reading per-rank files for the rank comparison: each rank's collectives as a `CallTable`,
from a spans file (`CommDebugMode.write_spans`, the watchdog's) or a JSON dump (torch's
Flight Recorder dumps: `flight_recorder.read_any_rank_file`).

A file is read and JSON-decoded once (`rank_input`), straight into the fields compared:
no protobuf round trip, no SDK span objects.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hp_otel.analysis.call_table import CallTable
from hp_otel.analysis.rank_call import RankCall
from hp_otel.analysis.rank_input import (
    CollectiveSpan,
    RankInputError,
    decode_json,
    otlp_int,
    read_bytes,
    resources_and_collectives,
)
from hp_otel.common.input_files import checked_int
from hp_otel.common.rank_set import RankSet
from hp_otel.spans import codec, collectives_file, exposure, schema
from hp_otel.spans.call_tree import span_attributes
from hp_otel.spans.groups import GroupTable

__all__ = ["RankCall", "RankFile", "RankInputError", "calls_from_spans", "check_rank", "read_rank_file"]

_RANK_IN_NAME = re.compile(r"rank[_-]?(\d+)", re.IGNORECASE)


@dataclass
class RankFile:
    path: str
    rank: int
    calls: CallTable  # a list of RankCalls is turned into one
    unsequenced: int = 0  # collective spans without a seq (written by an older hp_otel)
    world_size: int | None = None  # the resource's hp_otel.world.size (None: the file does not say)
    # window label -> its exposed communication (spans files only: a JSON dump has no wait times)
    exposure: dict[str, exposure.ExposureReport] = field(default_factory=dict)
    ring: bool = False  # a step loop's collectives file: its windows are the rank's last steps

    def __post_init__(self) -> None:
        if not isinstance(self.calls, CallTable):
            self.calls = CallTable.of(self.rank, self.calls)


def check_rank(f: RankFile) -> None:
    """A rank that cannot be one of its world (rank -1, rank 7 of 2, a world of 0) is refused, naming the field."""
    if f.world_size is not None and f.world_size <= 0:
        raise RankInputError(
            f"{f.path}: {schema.RESOURCE_WORLD_SIZE} is {f.world_size}; a world size must be 1 or more"
        )
    if f.rank < 0:
        raise RankInputError(f"{f.path}: {schema.RESOURCE_RANK} is {f.rank}; a rank must be 0 or more")
    if f.world_size is not None and f.rank >= f.world_size:
        raise RankInputError(
            f"{f.path}: {schema.RESOURCE_RANK} {f.rank} is not below its {schema.RESOURCE_WORLD_SIZE} "
            f"{f.world_size}; a rank must be 0-{f.world_size - 1}"
        )


def _rank_of(path: str, resources: Sequence[Mapping[str, Any]], default_rank: int | None = None) -> int:
    ranks = {
        checked_int(r[schema.RESOURCE_RANK], schema.RESOURCE_RANK)
        for r in resources
        if r.get(schema.RESOURCE_RANK) is not None
    }
    if len(ranks) > 1:
        raise RankInputError(f"{path}: spans of several ranks {sorted(ranks)} in one file; give one file per rank")
    if ranks:
        return ranks.pop()
    found = _RANK_IN_NAME.search(os.path.basename(path))
    if found:
        return int(found.group(1))
    if default_rank is not None:
        return default_rank
    raise RankInputError(
        f"{path}: names no rank (no {schema.RESOURCE_RANK} resource attribute, no 'rank<N>' in its name)"
    )


def _world_size_of(resources: Sequence[Mapping[str, Any]]) -> int | None:
    sizes = []
    for r in resources:
        try:
            sizes.append(checked_int(r[schema.RESOURCE_WORLD_SIZE], schema.RESOURCE_WORLD_SIZE))
        except (KeyError, TypeError, ValueError):
            continue
    return max(sizes, default=None)


def read_rank_file(path: str | os.PathLike[str], default_rank: int | None = None, payload: Any = None) -> RankFile:
    """One rank's collectives from its spans file (OTLP/JSON) or its JSON dump (`generate_json_dump`).

    `default_rank`: the rank of a file that names none (`hp-otel diff` reads one file of one
    process); None: such a file is refused. `payload`: the file already parsed (read once by
    the bounded reader, `common/input_files.py`); None: it is read here.
    """
    text_path = os.fspath(path)
    if payload is None:
        payload = decode_json(text_path, read_bytes(text_path))
    return rank_file_of_payload(text_path, payload, default_rank)


def rank_file_of_payload(path: str, payload: Any, default_rank: int | None = None, by_module: bool = True) -> RankFile:
    """A decoded file as a rank's collectives: a JSON dump (a dict with "records"), else OTLP/JSON spans;
    its exposure per module too with `by_module`."""
    if isinstance(payload, dict) and "records" in payload and "resourceSpans" not in payload:
        return _read_dump(path, payload, default_rank)
    ring = False
    if collectives_file.is_collectives_payload(payload):
        resources, spans = _collectives_file(path, payload)
        ring = collectives_file.is_ring(payload)
    else:
        resources, spans = resources_and_collectives(path, payload)
    return rank_file_of_spans(path, resources, spans, default_rank, by_module, ring)


def rank_file_of_spans(
    path: str,
    resources: Sequence[Mapping[str, Any]],
    spans: Iterable[Any],
    default_rank: int | None = None,
    by_module: bool = True,
    ring: bool = False,
) -> RankFile:
    """A rank's collectives from its file's resources and collective spans (however they were decoded)."""
    try:
        rank = _rank_of(path, resources, default_rank)
    except (TypeError, ValueError) as exc:
        if isinstance(exc, RankInputError):
            raise
        raise RankInputError(f"{path}: its {schema.RESOURCE_RANK} is not a rank ({exc})") from exc
    collectives = list(spans)
    table = CallTable(rank)
    unsequenced = _add_calls(table, collectives, path)
    try:
        exposures = exposure.by_window(collectives, by_module)
    except (TypeError, ValueError) as exc:
        raise RankInputError(f"{path}: a collective span's times or wait attributes are malformed ({exc})") from exc
    return RankFile(path, rank, table, unsequenced, _world_size_of(resources), exposures, ring)


def _collectives_file(path: str, payload: dict[str, Any]) -> tuple[list[dict[str, Any]], list[CollectiveSpan]]:
    """A collectives file (`CommDebugMode.write_collectives`): its resource and calls, as a spans file's."""
    try:
        resource = payload.get("resource") or {}
        if isinstance(resource, dict):
            resource = schema.normalise_attributes(resource)
        if not isinstance(resource, dict):
            raise ValueError("its resource is not an object")
        spans = [
            CollectiveSpan(name, attributes, otlp_int(start), otlp_int(end))
            for name, attributes, start, end in collectives_file.collective_spans(payload)
        ]
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise RankInputError(f"{path}: not a collectives file hp_otel wrote ({type(exc).__name__}: {exc})") from exc
    return [resource], spans


# What a call's kind (`CallKind`) is made of, besides the span's name: calls that share these values
# share their kind, so each kind is decoded and checked once per file, not once per call.
_KIND_KEYS = (
    schema.COLLECTIVE_WINDOW,
    schema.COLLECTIVE_GROUP_ID,
    schema.COLLECTIVE_GROUP,
    schema.COLLECTIVE_GROUP_RANKS,  # files of earlier versions: the members on every span
    schema.COLLECTIVE_GROUP_SIZE,
    schema.COLLECTIVE_OP,
    schema.COLLECTIVE_NAME,
    schema.COLLECTIVE_INPUT_SHAPE,
    schema.COLLECTIVE_OUTPUT_SHAPE,
    schema.COLLECTIVE_DTYPE,
    schema.COLLECTIVE_REDUCE_OP,
    schema.COLLECTIVE_MODULE,
    schema.PHASE,
    schema.CALL_STACK,
)


def _add_calls(table: CallTable, spans: Iterable[Any], where: str) -> int:
    """Append the collectives among `spans` to `table`; how many had no seq."""
    unsequenced = 0
    kinds: dict[tuple[Any, ...], int] = {}  # (span name, the _KIND_KEYS' values) -> the kind's index
    spans = list(spans)
    groups = _groups_of(spans, where)
    for span in spans:
        attrs = span_attributes(span)
        if attrs.get(schema.CALL_KIND) != schema.KIND_COLLECTIVE:
            continue
        get = attrs.get
        try:
            key: tuple[Any, ...] | None = (span.name, *[get(k) for k in _KIND_KEYS])
            kind = kinds.get(key)  # type: ignore[arg-type]
        except TypeError:  # a value that cannot be a key (hp_otel writes none): decoded call by call
            key = kind = None
        try:
            if kind is None:
                call = _call_from_span(table.rank, span, attrs, groups)
                if call is None:
                    unsequenced += 1
                    continue
                table.append(call)
                if key is not None:
                    kinds[key] = table.kind[-1]
                continue
            seq = checked_int(get(schema.COLLECTIVE_SEQ, -1), schema.COLLECTIVE_SEQ)
            if seq < 0:
                unsequenced += 1
                continue
            table.append_row(
                kind,
                seq,
                span.start_time or 0,
                span.end_time or 0,
                bool(get(schema.COLLECTIVE_IN_FLIGHT, False)),
                checked_int(get(schema.COLLECTIVE_BYTES, 0), schema.COLLECTIVE_BYTES),
                float(get(schema.COLLECTIVE_ALGBW, 0.0)),
                float(get(schema.COLLECTIVE_BUSBW, 0.0)),
            )
        except (TypeError, ValueError, OverflowError) as exc:  # attributes hp_otel did not write
            raise RankInputError(f"{where}: collective span {span.name!r} is malformed ({exc})") from exc
    return unsequenced


def calls_from_spans(spans: Iterable[Any], rank: int, where: str = "spans") -> tuple[list[RankCall], int]:
    """The collectives among finished spans (a file's, or a mode's own), and how many had no seq."""
    calls: list[RankCall] = []
    unsequenced = 0
    spans = list(spans)
    groups = _groups_of(spans, where)
    for span in spans:
        attrs = span_attributes(span)
        if attrs.get(schema.CALL_KIND) != schema.KIND_COLLECTIVE:
            continue
        try:
            call = _call_from_span(rank, span, attrs, groups)
        except (TypeError, ValueError) as exc:  # attributes hp_otel did not write
            raise RankInputError(f"{where}: collective span {span.name!r} is malformed ({exc})") from exc
        if call is None:
            unsequenced += 1
        else:
            calls.append(call)
    return calls, unsequenced


def _groups_of(spans: Sequence[Any], where: str) -> GroupTable:
    """The groups the collective spans describe (each on one of its spans, or the file's table)."""
    try:
        return GroupTable.of(
            attrs for attrs in map(span_attributes, spans) if attrs.get(schema.CALL_KIND) == schema.KIND_COLLECTIVE
        )
    except (TypeError, ValueError) as exc:
        raise RankInputError(f"{where}: a collective span's group is malformed ({exc})") from exc


def _call_from_span(rank: int, span: Any, attrs: Mapping[str, Any], groups: GroupTable) -> RankCall | None:
    match = codec.decode_collective_match(attrs)
    if match.seq < 0:
        return None
    info = codec.decode_collective(attrs, span.name, groups)
    return RankCall(
        rank=rank,
        window=match.window,
        group=info.group,
        group_ranks=RankSet.of(info.group_ranks),
        seq=match.seq,
        op=info.op or info.name,
        name=info.name,
        input_shape=tuple(checked_int(d, schema.COLLECTIVE_INPUT_SHAPE) for d in info.input_shape),
        output_shape=tuple(checked_int(d, schema.COLLECTIVE_OUTPUT_SHAPE) for d in info.output_shape),
        dtype=info.dtype,
        reduce_op=info.reduce_op,
        module=match.module,
        phase=str(attrs.get(schema.PHASE, "")),
        start_ns=span.start_time or 0,
        end_ns=span.end_time or 0,
        in_flight=match.in_flight,
        bytes=info.bytes,
        stack=codec.decode_call_stack(attrs),
        algbw=float(attrs.get(schema.COLLECTIVE_ALGBW, 0.0)),
        busbw=float(attrs.get(schema.COLLECTIVE_BUSBW, 0.0)),
    )


def _read_dump(path: str, dump: dict[str, Any], default_rank: int | None = None) -> RankFile:
    """A JSON dump names no rank: it comes from the file name (`comm_rank1.json`), else `default_rank`."""
    found = _RANK_IN_NAME.search(os.path.basename(path))
    if not found and default_rank is None:
        raise RankInputError(f"{path}: a JSON dump names no rank; name the file with 'rank<N>' (comm_rank0.json)")
    rank = int(found.group(1)) if found else int(default_rank)  # type: ignore[arg-type]
    calls: list[RankCall] = []
    unsequenced = 0
    stack = list(dump.get("records") or [])
    try:
        dump_groups = GroupTable.from_json(dump.get("groups") or {})
        while stack:
            node = stack.pop()
            stack.extend(node.get("children") or [])
            if node.get("type") != "collective":
                continue
            if "seq" not in node:
                unsequenced += 1
                continue
            start = checked_int(node["start_ns"], "start_ns")
            calls.append(
                RankCall(
                    rank=rank,
                    window=str(node.get("window", "")),
                    group=str(node.get("group", "")),
                    group_ranks=_dump_members(node, dump_groups),
                    seq=checked_int(node["seq"], "seq"),
                    op=str(node.get("op") or node.get("collective_type", "")),
                    name=str(node.get("collective_type", "")),
                    input_shape=tuple(checked_int(d, "input_shape") for d in node.get("input_shape", ())),
                    output_shape=tuple(checked_int(d, "output_shape") for d in node.get("output_shape", ())),
                    dtype=str(node.get("dtype", "")),
                    reduce_op=str(node.get("reduce_op", "")),
                    module=str(node.get("issued_in_module", "")),
                    phase=str(node.get("phase", "")),
                    start_ns=start,
                    end_ns=start + checked_int(node.get("duration_ns", 0), "duration_ns"),
                    in_flight=False,
                    bytes=checked_int(node.get("bytes", 0), "bytes"),
                    stack=tuple(str(f) for f in node.get("stack", ())),
                    algbw=float(node.get("algbw_bytes_per_s", 0.0)),
                    busbw=float(node.get("busbw_bytes_per_s", 0.0)),
                )
            )
    except (AttributeError, TypeError, ValueError, KeyError, RecursionError) as exc:
        raise RankInputError(f"{path}: not a JSON dump hp_otel wrote ({type(exc).__name__}: {exc})") from None
    return RankFile(path, rank, calls, unsequenced)


def _dump_members(node: Mapping[str, Any], table: GroupTable) -> RankSet:
    """A dump's collective's members: by its group id from the dump's table, or (dumps of earlier
    versions) the list it carries."""
    gid = node.get("group_id")
    if gid is not None:
        found = table.by_id.get(str(gid))
        return found.members if found is not None else RankSet()
    return RankSet.of(checked_int(r, "group_ranks") for r in node.get("group_ranks", ()))
