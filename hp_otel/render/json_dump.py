"""The JSON dump: the design's nested records, counts and sharding info.

`build_json_dump` gives it as a dict; `write_json_dump` streams the same text record by
record, never one giant dict in memory.  The streamed text is byte-identical to
`json.dump(build_json_dump(...), f, indent=2)` (a test pins that), but the call tree is
encoded while it is walked, and values that repeat every step (an op's input list, a
collective's shapes) are encoded once per depth.  The standard encoder with `indent`
runs in pure Python: many times slower on a long window (docs/how-it-works/costs.md).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping
from json.encoder import encode_basestring_ascii as _encode_str
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan

from hp_otel.common.files import write_text_atomically
from hp_otel.render import bandwidth_fields
from hp_otel.render.levels import NoiseLevel, noise_level
from hp_otel.render.module_info import parameter_info, sharding_info
from hp_otel.spans import codec, schema
from hp_otel.spans.call_tree import CallRecord, build_call_tree

_INDENT = "  "
_PER_RECORD_FIELDS = ("duration_ns", "start_ns", "seq", *bandwidth_fields.FIELDS, "error", "children")
_PER_RECORD_ATTRIBUTES = frozenset({schema.COLLECTIVE_SEQ, schema.COLLECTIVE_MATCH_ID, *bandwidth_fields.ATTRIBUTES})
_CHUNK_CHARS = 1 << 16  # what one write() gets at most (roughly): the file grows as the tree is walked


def record_to_json(record: CallRecord) -> dict[str, Any]:
    """One record as the design's JSON node (its children empty: the caller fills them)."""
    out: dict[str, Any]
    if record.kind == schema.KIND_MODULE:
        out = {
            "type": "module",
            "module_fqn": record.fqn,
            "module_type": record.module_type,
            "event_type": "enter" if record.phase == schema.PHASE_FORWARD else record.phase,
        }
    elif record.kind == schema.KIND_OP:
        out = {
            "type": "op",
            "op_name": record.op_name,
            "inputs": [i.to_json() for i in record.inputs],
            "outputs": [o.to_json() for o in record.outputs],
        }
    elif record.kind == schema.KIND_COLLECTIVE:
        c = record.collective
        out = {
            "type": "collective",
            "collective_type": c.name,
            "op": c.op,
            "group_size": c.group_size,
            "group": c.group,
            "group_id": record.group.id,  # its members: in the dump's "groups" table
            "input_shape": list(c.input_shape),
            "output_shape": list(c.output_shape),
            "dtype": c.dtype,
            "bytes": c.bytes,
            "reduce_op": c.reduce_op,
            "async": c.is_async,
        }
        match = codec.decode_collective_match(record.attributes)
        if match.seq >= 0:  # what `hp-otel ranks` lines up across ranks
            out["window"] = match.window
            out["issued_in_module"] = match.module
    else:
        src, dst, shape = codec.decode_redistribute(record.attributes)
        out = {"type": "redistribute", "src_placements": src, "dst_placements": dst, "tensor_shape": list(shape)}
    out["phase"] = record.phase
    stack = codec.decode_call_stack(record.attributes) if record.kind != schema.KIND_MODULE else ()
    if stack:  # recorded with stack=: where it was issued, innermost first
        out["stack"] = list(stack)
    out["duration_ns"] = record.duration_ns
    if record.kind == schema.KIND_COLLECTIVE and schema.COLLECTIVE_SEQ in record.attributes:
        out["start_ns"] = record.start_ns
        out["seq"] = int(record.attributes[schema.COLLECTIVE_SEQ])
    if record.kind == schema.KIND_COLLECTIVE:
        out.update(bandwidth_fields.json_fields(record.attributes))
    if record.error:
        out["error"] = record.error
    out["children"] = []
    return out


def records_to_json(roots: Iterable[CallRecord], level: NoiseLevel) -> list[dict[str, Any]]:
    """The call tree as the design's nested records, keeping the nodes shown at this level.

    Walked with a stack, not by recursion: a tree thousands of levels deep is fine."""
    out: list[dict[str, Any]] = []
    stack: list[tuple[Iterator[CallRecord], list[dict[str, Any]]]] = [(iter(roots), out)]
    while stack:
        records, target = stack[-1]
        record = next(records, None)
        if record is None:
            stack.pop()
        elif level.shows(record):
            node = record_to_json(record)
            target.append(node)
            stack.append((iter(record.children), node["children"]))
        else:  # hidden: its children take its place
            stack.append((iter(record.children), target))
    return out


def _summary(
    roots: list[CallRecord],
    level: NoiseLevel,
    comm_counts: Mapping[str, int],
    comm_module_counts: Mapping[str, Any],
    dropped_records: int,
) -> dict[str, Any]:
    """Every key of the dump before "records", in order."""
    parameters = parameter_info(roots)
    return {
        "comm_counts": dict(comm_counts),
        "total_counts": sum(comm_counts.values()),
        "comm_module_counts": comm_module_counts,
        "sharding_info": sharding_info(parameters),
        "parameter_info": parameters,
        "noise_level": level.level,
        "dropped_records": dropped_records,
        "groups": _groups_table(roots),
    }


def _groups_table(roots: list[CallRecord]) -> dict[str, Any]:
    """The process groups the collectives ran on, by id: each group's members once (strided runs)."""
    for root in roots:
        for record in root.walk():
            if record.groups is not None:
                return record.groups.to_json()
    return {}


def build_json_dump(
    spans: Iterable[ReadableSpan],
    level: int | NoiseLevel | None,
    comm_counts: Mapping[str, int],
    comm_module_counts: Mapping[str, Any],
    dropped_records: int,
) -> dict[str, Any]:
    """The whole dump as one dict (tests and small windows; files are written by `write_json_dump`)."""
    flags = noise_level(level)
    roots = build_call_tree(spans)
    dump = _summary(roots, flags, comm_counts, comm_module_counts, dropped_records)
    dump["records"] = records_to_json(roots, flags)
    return dump


def _scalar(value: Any) -> str:
    if value is True:
        return "true"
    if value is False:
        return "false"
    if value is None:
        return "null"
    if isinstance(value, str):
        return _encode_str(value)
    if isinstance(value, int):
        return int.__repr__(value)
    return json.dumps(value)  # floats and anything else exactly as the standard encoder


def encode(value: Any, depth: int) -> str:
    """`json.dumps(value, indent=2)` for a value nested `depth` levels deep (its first line unindented)."""
    if isinstance(value, dict):
        if not value:
            return "{}"
        inner = "\n" + _INDENT * (depth + 1)
        items = (f"{_encode_str(str(k))}: {encode(v, depth + 1)}" for k, v in value.items())
        return "{" + inner + ("," + inner).join(items) + "\n" + _INDENT * depth + "}"
    if isinstance(value, (list, tuple)):
        if not value:
            return "[]"
        inner = "\n" + _INDENT * (depth + 1)
        return "[" + inner + ("," + inner).join(encode(v, depth + 1) for v in value) + "\n" + _INDENT * depth + "]"
    return _scalar(value)


class _Encoder:
    """Encodes call records; the text of a record's own fields is cached by its attributes.

    Every step repeats the same modules, ops and collectives with the same attributes, so
    a long window encodes each distinct record once per depth; only its duration, error
    and children are written per record.
    """

    def __init__(self, level: NoiseLevel) -> None:
        self.level = level
        self._heads: dict[tuple[Any, ...], str] = {}

    def _head(self, record: CallRecord, depth: int) -> str:
        """`{` and every field up to `"duration_ns": ` (exclusive of its value)."""
        try:
            attrs = record.attributes
            if (
                schema.COLLECTIVE_SEQ in attrs or schema.COLLECTIVE_BUSBW in attrs
            ):  # changes every call: not in its head
                attrs = {k: v for k, v in attrs.items() if k not in _PER_RECORD_ATTRIBUTES}
            key: tuple[Any, ...] | None = (record.kind, record.name, depth, tuple(attrs.items()))
            head = self._heads.get(key)  # type: ignore[arg-type]
        except TypeError:  # unhashable attribute values: encode without caching
            key, head = None, None
        if head is None:
            fields = record_to_json(record)
            for late in _PER_RECORD_FIELDS:  # written per record, in this order
                fields.pop(late, None)
            inner = "\n" + _INDENT * (depth + 1)
            parts = [f"{_encode_str(k)}: {encode(v, depth + 1)}" for k, v in fields.items()]
            head = "{" + inner + ("," + inner).join(parts) + "," + inner + '"duration_ns": '
            if key is not None:
                if len(self._heads) >= 8192:
                    self._heads.clear()
                self._heads[key] = head
        return head

    def record(self, record: CallRecord, depth: int) -> Iterator[str]:
        """One record's own fields (a dict at `depth`), up to `"children": ` (`records` writes the rest)."""
        inner = "\n" + _INDENT * (depth + 1)
        text = self._head(record, depth) + int.__repr__(record.duration_ns)
        seq = record.attributes.get(schema.COLLECTIVE_SEQ) if record.kind == schema.KIND_COLLECTIVE else None
        if seq is not None:
            text += f',{inner}"start_ns": {int.__repr__(record.start_ns)},{inner}"seq": {int.__repr__(int(seq))}'
        if record.kind == schema.KIND_COLLECTIVE:
            for name, value in bandwidth_fields.json_fields(record.attributes).items():
                text += f",{inner}{_encode_str(name)}: {_scalar(value)}"
        if record.error:
            text += "," + inner + '"error": ' + _encode_str(record.error)
        yield text + "," + inner + '"children": '

    def records(self, records: Iterable[CallRecord], depth: int) -> Iterator[str]:
        """A list of the records shown at this noise level (hidden ones give way to their children).

        Walked with a stack, not by recursion: a tree thousands of levels deep is fine.
        Each entry is one open list: its records still to write, its depth, and whether
        it is still empty."""
        stack: list[list[Any]] = [[_shown(records, self.level), depth, True]]
        while stack:
            frame = stack[-1]
            shown, at, first = frame
            record = next(shown, None)
            if record is None:
                stack.pop()
                yield "[]" if first else "\n" + _INDENT * at + "]"
                if stack:  # the list was a record's children: close that record
                    yield "\n" + _INDENT * (at - 1) + "}"
                continue
            frame[2] = False
            yield ("[" if first else ",") + "\n" + _INDENT * (at + 1)
            yield from self.record(record, at + 1)
            stack.append([_shown(record.children, self.level), at + 2, True])


def _shown(records: Iterable[CallRecord], level: NoiseLevel) -> Iterator[CallRecord]:
    """The records shown at this level, in order: a hidden one's children in its place (to any depth)."""
    stack = [iter(records)]
    while stack:
        for record in stack[-1]:
            if level.shows(record):
                yield record
            else:
                stack.append(iter(record.children))
                break
        else:
            stack.pop()


def iter_json_dump(
    spans: Iterable[ReadableSpan],
    level: int | NoiseLevel | None,
    comm_counts: Mapping[str, int],
    comm_module_counts: Mapping[str, Any],
    dropped_records: int,
) -> Iterator[str]:
    """The dump's text in pieces, in the order of `build_json_dump`'s keys."""
    flags = noise_level(level)
    roots = build_call_tree(spans)
    head = _summary(roots, flags, comm_counts, comm_module_counts, dropped_records)
    inner = "\n" + _INDENT
    yield "{" + inner + ("," + inner).join(f"{_encode_str(k)}: {encode(v, 1)}" for k, v in head.items())
    yield "," + inner + '"records": '
    yield from _Encoder(flags).records(roots, 1)
    yield "\n}"


def write_json_dump(
    path: str | os.PathLike[str],
    spans: Iterable[ReadableSpan],
    level: int | NoiseLevel | None,
    comm_counts: Mapping[str, int],
    comm_module_counts: Mapping[str, Any],
    dropped_records: int,
    argument: str = "path",
) -> None:
    """Stream the dump into `path` atomically (a temporary file renamed at the end)."""
    pieces = iter_json_dump(spans, level, comm_counts, comm_module_counts, dropped_records)

    def write(handle: Any) -> None:
        buffer: list[str] = []
        size = 0
        for piece in pieces:
            buffer.append(piece)
            size += len(piece)
            if size >= _CHUNK_CHARS:
                handle.write("".join(buffer))
                buffer.clear()
                size = 0
        handle.write("".join(buffer))

    write_text_atomically(path, write, argument=argument)
