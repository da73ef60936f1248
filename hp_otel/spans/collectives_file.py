"""A rank's collectives file: the evidence `hp-otel ranks` compares, a few percent of the spans file.

The cross-rank analysis reads, of each collective span, its attributes of `KEPT` (group,
seq, op, shapes, dtype, bytes, module, phase, waits, bandwidths, call site) and its times;
nothing of the module and op spans around it.  This file holds exactly that, as JSON:

    {"format": "hp_otel.collectives", "version": 2, "resource": {"hp_otel.rank": 3, ...},
     "groups": {id: {"name": "1", "members": "0-4095", "mesh_dim": "dp"}, ...},   # each group once
     "kinds": [{attribute: value, ...}, ...],        # what calls share (op, group id, shapes, module, ...)
     "calls": [[kind, name, start_ns, end_ns, {attribute: value, ...}], ...]}   # what each call has of its own

A step repeats a few kinds of call, so each kind is written once, and a kind names its group by
id (`spans/groups.py`): the members are in the table, so no part of the file grows with a group's
size but the table's runs.  Version 1 (hp_otel before the table) carried the member list in every kind;
it is read as well.  Reading it back gives
the same (name, attributes, start, end) a spans file gives for its collective spans, so
`hp-otel ranks` compares both the same way (`collective_spans`).

A step loop's file (`CollectivesRing`: the always-on instrumentor's steps) holds the last
few steps instead, one window each, so its size stays bounded however long the run:

    {"format": "hp_otel.collectives", "version": 2, "resource": {...}, "keep": 4, "windows": [
    {"groups": {...}, "kinds": [...], "calls": [...]}
    ,{...}                                                          # a line per step, oldest first
    ]}

The file is one JSON document after every complete write, and each step is appended: the new
window's line is written over the closing `]}` (which it ends with again), so a sampled step
writes its own window, not the kept ones again. Once the file holds 2 x `keep` windows the next
step rewrites it with the last `keep` (atomically, by rename). A reader takes the last `keep`
windows, and a file cut in the middle of an append (a crash, or read while being written) is
read up to its last whole window (`recover_torn_ring`).
"""

from __future__ import annotations

import collections
import json
import os
from collections.abc import Iterable, Mapping
from typing import Any

from hp_otel.common.files import FileId, append_in_folder, file_id, write_in_folder, write_text_atomically
from hp_otel.common.input_files import InputFileError, parse_json
from hp_otel.spans import schema
from hp_otel.spans.groups import GroupTable

FORMAT = "hp_otel.collectives"
VERSION = 2
READ_VERSIONS = (1, 2)  # 1: every kind carries its group's name and member list (no group table)
# Per call: what differs between calls of one kind.
PER_CALL = (
    schema.COLLECTIVE_SEQ,
    schema.COLLECTIVE_IN_FLIGHT,
    schema.COLLECTIVE_CALL_DURATION,
    schema.COLLECTIVE_WAIT_DURATION,
    schema.COLLECTIVE_ALGBW,
    schema.COLLECTIVE_BUSBW,
)
# Shared by the calls of one kind.
SHARED = (
    schema.CALL_KIND,
    schema.COLLECTIVE_NAME,
    schema.COLLECTIVE_OP,
    schema.COLLECTIVE_GROUP_ID,  # its name and members: in the window's group table
    schema.COLLECTIVE_GROUP_SIZE,
    schema.COLLECTIVE_BACKEND,
    schema.COLLECTIVE_INPUT_SHAPE,
    schema.COLLECTIVE_OUTPUT_SHAPE,
    schema.COLLECTIVE_DTYPE,
    schema.COLLECTIVE_BYTES,
    schema.COLLECTIVE_REDUCE_OP,
    schema.COLLECTIVE_ASYNC,
    schema.COLLECTIVE_COMPLETION,
    schema.COLLECTIVE_WINDOW,
    schema.COLLECTIVE_MODULE,
    schema.PHASE,
    schema.CALL_STACK,
)
KEPT = frozenset(PER_CALL + SHARED)
RESOURCE_KEPT = (schema.RESOURCE_RANK, schema.RESOURCE_WORLD_SIZE)


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _window(spans: Iterable[Any]) -> dict[str, Any]:
    """{"groups": ..., "kinds": ..., "calls": ...} of the collective spans among `spans`."""
    table = GroupTable()
    kinds: list[dict[str, Any]] = []
    index: dict[str, int] = {}
    calls: list[list[Any]] = []
    for span in spans:
        attrs = span.attributes or {}
        if attrs.get(schema.CALL_KIND) != schema.KIND_COLLECTIVE:
            continue
        table.note(attrs)
        kind = {key: _plain(attrs[key]) for key in SHARED if key in attrs}
        key = json.dumps(kind, sort_keys=True)
        number = index.get(key)
        if number is None:
            number = index[key] = len(kinds)
            kinds.append(kind)
        own = {key: _plain(attrs[key]) for key in PER_CALL if key in attrs}
        calls.append([number, span.name, span.start_time or 0, span.end_time or 0, own])
    return {"groups": table.to_json(), "kinds": kinds, "calls": calls}


def _header(resource: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "version": VERSION,
        "resource": {key: resource[key] for key in RESOURCE_KEPT if resource.get(key) is not None},
    }


def collectives_payload(spans: Iterable[Any], resource: Mapping[str, Any]) -> dict[str, Any]:
    """The file's JSON for finished spans (ReadableSpan-like: name, attributes, start_time, end_time)."""
    return {**_header(resource), **_window(spans)}


def write_collectives(path: str | os.PathLike[str], spans: Iterable[Any], resource: Mapping[str, Any]) -> None:
    """Write the collectives file atomically (one C-encoded `json.dumps`: cheap enough for a hanging rank)."""
    text = json.dumps(collectives_payload(spans, resource), separators=(",", ":"))
    write_text_atomically(path, lambda handle: handle.write(text))


RING_NAME = "collectives-rank{rank}.json"  # a step loop's file in its folder: one per rank
DEFAULT_KEEP = 4  # steps a step loop's file keeps


_TAIL = "\n]}\n"  # a ring file's closing bytes: each append writes over them and ends with them again
COMPACT_FACTOR = 2  # a ring file is rewritten (to `keep` windows) once it holds this many times `keep`


class CollectivesRing:
    """The collectives of a rank's last `keep` steps in one file (`folder/collectives-rank<R>.json`):
    each step appended, the file rewritten to the last `keep` once it holds `COMPACT_FACTOR` x `keep`,
    so bounded however long the run, and what `hp-otel ranks` compares across ranks at any moment
    (every rank's file holds the same last steps)."""

    def __init__(self, folder: str | os.PathLike[str], keep: int, rank: int) -> None:
        self.folder = os.fspath(folder)
        self.name = RING_NAME.format(rank=rank)
        self.path = os.path.join(self.folder, self.name)
        self.keep = keep
        self._windows: collections.deque[str] = collections.deque(maxlen=keep)
        self._head = ""  # the header line the file has
        self._held = 0  # windows in the file
        self._file: FileId | None = None  # the file as this ring left it; None: rewrite at the next step
        self.bytes_written = 0  # this ring's writes, appends and rewrites
        self.rewrites = 0

    def add(self, spans: Iterable[Any], resource: Mapping[str, Any]) -> None:
        """Keep this step's collectives (dropping the oldest past `keep`) and append them to the file."""
        window = json.dumps(_window(spans), separators=(",", ":"))
        self._windows.append(window)
        head = json.dumps({**_header(resource), "keep": self.keep}, separators=(",", ":"))
        head = f'{head[:-1]},"windows":['
        if self._file is not None and head == self._head and self._held < COMPACT_FACTOR * self.keep:
            piece = f"\n,{window}{_TAIL}".encode()
            expect, self._file = self._file, None  # None until the write is known whole
            left = append_in_folder(self.folder, self.name, expect[2] - len(_TAIL), piece, expect, "collectives file")
            if left is not None:
                self._file, self._held = left, self._held + 1
                self.bytes_written += len(piece)
                return
        self._rewrite(head)

    def _rewrite(self, head: str) -> None:
        text = f"{head}\n" + "\n,".join(self._windows) + _TAIL
        left: list[FileId] = []

        def write(handle: Any) -> None:
            handle.write(text)
            handle.flush()
            left.append(file_id(handle.fileno()))

        self._file = None
        write_in_folder(self.folder, self.name, write, "collectives file")
        self._file, self._head, self._held = left[0], head, len(self._windows)
        self.bytes_written += len(text)  # ASCII: json.dumps escapes the rest
        self.rewrites += 1


def recover_torn_ring(data: bytes, path: str) -> dict[str, Any] | None:
    """A ring file cut in the middle of an append (a crash, or read while written): its header and the
    whole windows before the cut. None: not a ring file's layout (the caller reports it as not JSON)."""
    head, newline, rest = data.partition(b"\n")
    if not newline or not head.startswith(b'{"format":"hp_otel.collectives"') or not head.endswith(b'"windows":['):
        return None
    try:
        payload = parse_json(head + b"]}", path, "collectives file")
    except InputFileError:
        return None
    windows = []
    for i, line in enumerate(rest.split(b"\n")):
        if i and not line.startswith(b","):
            break  # the closing `]}` of a whole file, or the cut
        try:
            window = parse_json(line[1:] if i else line, path, "collectives file")
        except InputFileError:
            break
        if not isinstance(window, dict):
            break
        windows.append(window)
    payload["windows"] = windows
    return payload  # type: ignore[no-any-return]


def is_collectives_payload(payload: Any) -> bool:
    return isinstance(payload, dict) and payload.get("format") == FORMAT


def _attribute(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def collective_spans(payload: Mapping[str, Any]) -> list[tuple[str, dict[str, Any], Any, Any]]:
    """(name, attributes, start_ns, end_ns) of each call, as a spans file's collective span would give them.

    Raises ValueError (or TypeError, KeyError) for a payload this version did not write."""
    if payload.get("version") not in READ_VERSIONS:
        raise ValueError(
            f"version {payload.get('version')!r}; this hp_otel reads versions {', '.join(map(str, READ_VERSIONS))}"
        )
    out = []
    for window in windows_of(payload):
        kinds = [
            schema.normalise_attributes({key: _attribute(v) for key, v in dict(kind).items()})
            for kind in window["kinds"]
        ]
        _describe_groups(kinds, window.get("groups") or {})
        for number, name, start, end, own in window["calls"]:
            if isinstance(number, bool) or not isinstance(number, int) or not 0 <= number < len(kinds):
                raise ValueError(f"a call names kind {number!r} of {len(kinds)}")
            attributes = {**kinds[number], **{key: _attribute(v) for key, v in dict(own).items()}}
            attributes = schema.normalise_attributes(attributes)
            out.append((str(name), attributes, start, end))
    return out


def _describe_groups(kinds: list[dict[str, Any]], entries: Mapping[str, Any]) -> None:
    """Each kind gains its group's description from the window's table, as the span that described
    it carried it (one dict of strings per group, shared by its kinds: members are parsed once)."""
    table = GroupTable.from_json(entries)
    described = {gid: g.attributes() for gid, g in table.by_id.items()}
    for kind in kinds:
        found = described.get(kind.get(schema.COLLECTIVE_GROUP_ID))  # type: ignore[arg-type]
        if found is not None:
            kind.update(found)


def is_ring(payload: Mapping[str, Any]) -> bool:
    """A step loop's file: the last steps of a rank, each window a step (`CollectivesRing`)."""
    return "windows" in payload


def windows_of(payload: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The windows a payload holds: a step loop's kept steps, or the one window of a window's file."""
    if not is_ring(payload):
        return [payload]
    windows = payload["windows"]
    if not isinstance(windows, list) or not all(isinstance(w, dict) for w in windows):
        raise ValueError("its windows are not a list of objects")
    keep = payload.get("keep")
    if isinstance(keep, int) and not isinstance(keep, bool) and keep >= 1:
        return windows[-keep:]  # appended since the last rewrite: up to COMPACT_FACTOR x keep
    return windows
