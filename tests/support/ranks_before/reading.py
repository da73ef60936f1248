"""Reading per-rank files for the rank comparison: each rank's collectives as `RankCall`s,
from a spans file (`CommDebugMode.write_spans`, the watchdog's) or a JSON dump (torch's
Flight Recorder dumps: `flight_recorder.read_any_rank_file`)."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hp_otel.spans import codec, exposure, schema
from hp_otel.spans.call_tree import span_attributes
from hp_otel.spans.groups import GroupTable
from hp_otel.spans.otlp_json import SpanFileError, read_trace_file

# Ops whose shapes legitimately differ between ranks (uneven splits, point to point).


_SHAPE_FREE_OPS = frozenset({"all_to_all", "send", "recv", "gather", "scatter"})
_P2P_OPS = frozenset({"send", "recv"})
_RANK_IN_NAME = re.compile(r"rank[_-]?(\d+)", re.IGNORECASE)


class RankInputError(ValueError):
    """A file `hp-otel ranks` cannot compare (missing, not spans, no rank, two files of one rank)."""


@dataclass(frozen=True)
class RankCall:
    """One collective as one rank issued it."""

    rank: int
    window: str
    group: str
    group_ranks: tuple[int, ...]
    seq: int
    op: str
    name: str
    input_shape: tuple[int, ...]
    output_shape: tuple[int, ...]
    dtype: str
    reduce_op: str
    module: str
    phase: str
    start_ns: int
    end_ns: int
    in_flight: bool
    bytes: int = 0  # what it moved (its inputs' bytes, hp_otel.collective.input.size); 0 where the file says none
    stack: tuple[str, ...] = ()  # where it was issued (`stack=`, a Flight Recorder dump's frames), innermost first
    # NCCL-tests' bandwidths of this rank's call, bytes/s (0.0: none recorded: in flight, a barrier, older files)
    algbw: float = 0.0
    busbw: float = 0.0

    def signature(self) -> tuple[Any, ...]:
        """What must be equal on every rank of the group."""
        op = "send/recv" if self.op in _P2P_OPS else self.op
        if self.op in _SHAPE_FREE_OPS:
            return (op, self.dtype, self.reduce_op)
        return (op, self.input_shape, self.output_shape, self.dtype, self.reduce_op)

    def where(self) -> str:
        if self.module == "(unknown)":  # the names as they are now (issue 47): only the reading is compared
            return "an unknown module"
        return f"Module({self.module})" if self.module else "(outside)"

    def describe(self) -> str:
        shapes = f"input {_shape(self.input_shape)} output {_shape(self.output_shape)}"
        reduce = f" {self.reduce_op}" if self.reduce_op else ""
        state = " (in flight)" if self.in_flight else ""
        at = f" at {self.stack[0]}" if self.stack else ""
        phase = f" [{self.phase}]" if self.phase else ""  # a Flight Recorder entry has none
        return f"{self.op} {shapes} {self.dtype}{reduce} in {self.where()}{phase}{state}{at}"

    def to_json(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "seq": self.seq,
            "op": self.op,
            "name": self.name,
            "input_shape": list(self.input_shape),
            "output_shape": list(self.output_shape),
            "dtype": self.dtype,
            "reduce_op": self.reduce_op,
            "module": self.module or "(outside)",
            "phase": self.phase,
            "start_ns": self.start_ns,
            "in_flight": self.in_flight,
            **({"stack": list(self.stack)} if self.stack else {}),
        }


def _shape(shape: Sequence[int]) -> str:
    return "(" + ", ".join(map(str, shape)) + ")"


@dataclass
class RankFile:
    path: str
    rank: int
    calls: list[RankCall]
    unsequenced: int = 0  # collective spans without a seq (written by an older hp_otel)
    world_size: int | None = None  # the resource's hp_otel.world.size (None: the file does not say)
    # window label -> its exposed communication (spans files only: a JSON dump has no wait times)
    exposure: dict[str, exposure.ExposureReport] = field(default_factory=dict)


def _rank_of(path: str, resources: Sequence[Mapping[str, Any]], default_rank: int | None = None) -> int:
    ranks = {int(r[schema.RESOURCE_RANK]) for r in resources if r.get(schema.RESOURCE_RANK) is not None}
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
            sizes.append(int(r[schema.RESOURCE_WORLD_SIZE]))
        except (KeyError, TypeError, ValueError):
            continue
    return max(sizes, default=None)


def read_rank_file(path: str | os.PathLike[str], default_rank: int | None = None) -> RankFile:
    """One rank's collectives from its spans file (OTLP/JSON) or its JSON dump (`generate_json_dump`).

    `default_rank`: the rank of a file that names none (`hp-otel diff` reads one file of one
    process); None: such a file is refused.
    """
    text_path = os.fspath(path)
    dump = _json_dump(text_path)
    if dump is not None:
        return _read_dump(text_path, dump, default_rank)
    try:
        spans, resources = read_trace_file(text_path)
    except SpanFileError as exc:
        raise RankInputError(str(exc)) from exc
    try:
        rank = _rank_of(text_path, resources, default_rank)
    except (TypeError, ValueError) as exc:
        if isinstance(exc, RankInputError):
            raise
        raise RankInputError(f"{text_path}: its {schema.RESOURCE_RANK} is not a rank ({exc})") from exc
    calls, unsequenced = calls_from_spans(spans, rank, text_path)
    try:
        exposures = exposure.by_window(spans)
    except (TypeError, ValueError) as exc:
        raise RankInputError(
            f"{text_path}: a collective span's times or wait attributes are malformed ({exc})"
        ) from exc
    return RankFile(text_path, rank, calls, unsequenced, _world_size_of(resources), exposures)


def calls_from_spans(spans: Iterable[Any], rank: int, where: str = "spans") -> tuple[list[RankCall], int]:
    """The collectives among finished spans (a file's, or a mode's own), and how many had no seq."""
    calls: list[RankCall] = []
    unsequenced = 0
    spans = list(spans)
    # Input adapter (not the frozen logic): today's files describe each group once, by id.
    groups = GroupTable.of(span_attributes(s) for s in spans)
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


def _call_from_span(rank: int, span: Any, attrs: Mapping[str, Any], groups: GroupTable) -> RankCall | None:
    match = codec.decode_collective_match(attrs)
    if match.seq < 0:
        return None
    info = codec.decode_collective(attrs, span.name, groups)
    return RankCall(
        rank=rank,
        window=match.window,
        group=info.group,
        group_ranks=tuple(int(r) for r in info.group_ranks),
        seq=match.seq,
        op=info.op or info.name,
        name=info.name,
        input_shape=tuple(int(d) for d in info.input_shape),
        output_shape=tuple(int(d) for d in info.output_shape),
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


def _json_dump(path: str) -> dict[str, Any] | None:
    """The file as a JSON dump (a dict with "records"), or None for anything else (read as spans)."""
    try:
        with open(path, encoding="utf-8") as handle:
            payload = json.load(handle)
    except (OSError, UnicodeDecodeError, ValueError):
        return None  # the spans reader says what is wrong
    return payload if isinstance(payload, dict) and "records" in payload and "resourceSpans" not in payload else None


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
        while stack:
            node = stack.pop()
            stack.extend(node.get("children") or [])
            if node.get("type") != "collective":
                continue
            if "seq" not in node:
                unsequenced += 1
                continue
            start = int(node["start_ns"])
            calls.append(
                RankCall(
                    rank=rank,
                    window=str(node.get("window", "")),
                    group=str(node.get("group", "")),
                    group_ranks=tuple(int(r) for r in node.get("group_ranks", ())),
                    seq=int(node["seq"]),
                    op=str(node.get("op") or node.get("collective_type", "")),
                    name=str(node.get("collective_type", "")),
                    input_shape=tuple(int(d) for d in node.get("input_shape", ())),
                    output_shape=tuple(int(d) for d in node.get("output_shape", ())),
                    dtype=str(node.get("dtype", "")),
                    reduce_op=str(node.get("reduce_op", "")),
                    module=str(node.get("issued_in_module", "")),
                    phase=str(node.get("phase", "")),
                    start_ns=start,
                    end_ns=start + int(node.get("duration_ns", 0)),
                    in_flight=False,
                    bytes=int(node.get("bytes", 0)),
                    stack=tuple(str(f) for f in node.get("stack", ())),
                    algbw=float(node.get("algbw_bytes_per_s", 0.0)),
                    busbw=float(node.get("busbw_bytes_per_s", 0.0)),
                )
            )
    except (AttributeError, TypeError, ValueError, KeyError) as exc:
        raise RankInputError(f"{path}: not a JSON dump hp_otel wrote ({type(exc).__name__}: {exc})") from exc
    return RankFile(path, rank, calls, unsequenced)
