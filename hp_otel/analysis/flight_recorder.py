"""torch's Flight Recorder dumps as rank files: `hp-otel ranks` (and `diff`) read them like spans files.

Flight Recorder (`TORCH_FR_BUFFER_SIZE=N`) keeps each process's last N collectives in a ring
buffer; a dump is one file per rank, named `<prefix><rank>`, written by NCCL's watchdog on a
timeout (`TORCH_NCCL_DUMP_ON_TIMEOUT`, prefix `TORCH_NCCL_DEBUG_INFO_TEMP_FILE` /
`TORCH_FR_DUMP_TEMP_FILE`, default `/tmp/nccl_trace_rank_`) or on demand:
`torch._C._distributed_c10d._dump_fr_trace()` (pickle; every backend that records, gloo included)
or `_dump_fr_trace_json()` (JSON, no stack frames).  Both hold
`{"version", "pg_config", "pg_status", "entries": [...]}`.

Each entry becomes a `RankCall`, so the desync / hang / straggler analysis of
`hp_otel.analysis` runs on them unchanged.  Numbering differs from hp_otel's spans:

- `seq` is FR's `collective_seq_id` (per process group, from 1, since the group was made, all
  ranks alike; only collectives count) — hp_otel's `hp_otel.collective.seq` counts from 0 within a
  window (a step) and counts point-to-point calls too;
- point-to-point entries (`is_p2p`) are numbered by `p2p_seq_id` in their own window
  (`flight recorder p2p`), compared only on two-rank groups (a pair's sends and receives);
- the window is the whole buffer (`flight recorder`): the ranks' rings may have dropped
  different old entries, so `align_buffers` compares each group from the newest first seq of
  its ranks on;
- FR records no reduce op, module or phase; the op comes from `profiling_name`
  (`nccl:all_reduce` → `all_reduce`), the dtype from FR's scalar type names (`Float` →
  `torch.float32`), the frames (pickle dumps) as `file:line:function` without torch's.

Pickles are read with an unpickler that refuses every class: a dump holds only dicts, lists,
strings and numbers, and a file that names a class is refused, not executed.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from hp_otel.analysis.rank_call import UNKNOWN_MODULE
from hp_otel.analysis.rank_input import decode_json, fast_collectives
from hp_otel.analysis.reading import RankCall, RankFile, RankInputError, rank_file_of_payload, rank_file_of_spans
from hp_otel.common.input_files import InputFileError, checked_int, parse_pickle, read_bytes
from hp_otel.common.package_dirs import package_dirs
from hp_otel.common.rank_set import EMPTY, RankSet

WINDOW = "flight recorder"
P2P_WINDOW = "flight recorder p2p"
STACK_DEPTH = 8  # frames kept per entry, innermost first (as CommDebugMode(stack=True))

# profiling_name after the backend's "nccl:" / "gloo:" -> hp_otel's normalised op.
_OPS = MappingProxyType(
    {
        "all_reduce": "all_reduce",
        "allreduce": "all_reduce",
        "allreduce_coalesced": "all_reduce",
        "all_reduce_coalesced": "all_reduce",
        "all_gather": "all_gather",
        "allgather": "all_gather",
        "_allgather_base": "all_gather",
        "all_gather_into_tensor_coalesced": "all_gather",
        "allgather_into_tensor_coalesced": "all_gather",
        "allgather_coalesced": "all_gather",
        "reduce_scatter": "reduce_scatter",
        "_reduce_scatter_base": "reduce_scatter",
        "reduce_scatter_tensor_coalesced": "reduce_scatter",
        "all_to_all": "all_to_all",
        "alltoall": "all_to_all",
        "alltoall_base": "all_to_all",
        "all_to_allv": "all_to_all",
        "broadcast": "broadcast",
        "_broadcast_oop": "broadcast",
        "barrier": "barrier",
        "send": "send",
        "recv": "recv",
        "recvanysource": "recv",
        "gather": "gather",
        "scatter": "scatter",
        "reduce": "reduce",
        "_reduce_oop": "reduce",
    }
)
# FR writes c10::ScalarType names; hp_otel's spans carry torch's dtype names.
_DTYPES = MappingProxyType(
    {
        "Float": "torch.float32",
        "Double": "torch.float64",
        "Half": "torch.float16",
        "BFloat16": "torch.bfloat16",
        "Float8_e4m3fn": "torch.float8_e4m3fn",
        "Float8_e5m2": "torch.float8_e5m2",
        "Long": "torch.int64",
        "Int": "torch.int32",
        "Short": "torch.int16",
        "Char": "torch.int8",
        "Byte": "torch.uint8",
        "Bool": "torch.bool",
        "ComplexFloat": "torch.complex64",
        "ComplexDouble": "torch.complex128",
    }
)
_RANK_IN_NAME = re.compile(r"rank[_-]?(\d+)", re.IGNORECASE)
_TRAILING_NUMBER = re.compile(r"(\d+)(?:\.[A-Za-z]\w*)?$")  # FR's <prefix><rank>, maybe saved with an extension
_LIBRARIES = ("torch", "hp_otel", "typing_extensions")  # whose frames are not the user's call site
# Installed on whatever machine wrote the dump: a site-packages (pip, venv, conda) or dist-packages (Debian) folder.
_INSTALLED = re.compile(r"[\\/](?:site|dist)-packages[\\/](?:(?:torch|hp_otel)[\\/]|typing_extensions\.py$)")
_LIBRARY_FOLDER = re.compile(r"(?:^|(?<=[\\/]))(torch|hp_otel)(?=[\\/])")
_PICKLE_PROTOCOL_2_PLUS = b"\x80"


def _is_dump(payload: Any) -> bool:
    return isinstance(payload, dict) and "entries" in payload and "pg_config" in payload


def read_payload(path: str | os.PathLike[str], max_bytes: int | None = None) -> tuple[Any, bool]:
    """The file parsed once by the bounded reader (`common/input_files.py`): (payload, is a pickle).

    A pickle is read by the restricted unpickler (plain data only, an object budget); anything
    else as JSON. A file that is neither raises RankInputError naming it."""
    text_path = os.fspath(path)
    return _parse(text_path, _read(text_path, max_bytes))


def _read(path: str, max_bytes: int | None = None) -> bytes:
    try:
        return read_bytes(path, "rank file", max_bytes)
    except InputFileError as exc:
        raise RankInputError(str(exc)) from None


def _parse(path: str, data: bytes) -> tuple[Any, bool]:
    try:
        if data[:1] == _PICKLE_PROTOCOL_2_PLUS:
            return parse_pickle(data, path, "Flight Recorder dump"), True
        return decode_json(path, data), False  # a ring file cut in an append: up to its last whole step
    except InputFileError as exc:
        raise RankInputError(str(exc)) from None


def load_dump(path: str | os.PathLike[str], max_bytes: int | None = None) -> dict[str, Any] | None:
    """The dump in the file (pickle or JSON), or None when the file is not a Flight Recorder dump
    (a file that cannot be read at all raises RankInputError)."""
    payload, pickled = read_payload(path, max_bytes)
    if _is_dump(payload):
        return payload  # type: ignore[no-any-return]
    if pickled:
        raise RankInputError(f"{os.fspath(path)}: a pickle without Flight Recorder's 'entries' and 'pg_config'")
    return None


def read_any_rank_file(path: str | os.PathLike[str], by_module: bool = True) -> RankFile:
    """A rank's collectives from its Flight Recorder dump, spans file or JSON dump, whichever it is.

    The file is read and decoded once, whatever it turns out to be; `by_module`: a spans
    file's exposure per module too."""
    text_path = os.fspath(path)
    data = _read(text_path)
    if data[:1] != _PICKLE_PROTOCOL_2_PLUS:
        fast = fast_collectives(text_path, data)  # a spans file: only its collective spans decoded
        if fast is not None:
            return rank_file_of_spans(text_path, *fast, by_module=by_module)
    payload, pickled = _parse(text_path, data)
    if _is_dump(payload):
        return read_flight_recorder_file(text_path, payload)
    if pickled:
        raise RankInputError(f"{text_path}: a pickle without Flight Recorder's 'entries' and 'pg_config'")
    return rank_file_of_payload(text_path, payload, by_module=by_module)


def rank_of(path: str, dump: Mapping[str, Any]) -> int:
    """The dump's rank: its own `rank` field if any, else the file name (`nccl_trace_rank_3`, `fr_3.pkl`)."""
    if isinstance(dump.get("rank"), int):
        return int(dump["rank"])
    name = os.path.basename(path)
    found = _RANK_IN_NAME.search(name) or _TRAILING_NUMBER.search(name)
    if found is None:
        raise RankInputError(f"{path}: a Flight Recorder dump names its rank in the file name (<prefix><rank>)")
    return int(found.group(1))


def read_flight_recorder_file(path: str | os.PathLike[str], dump: Mapping[str, Any] | None = None) -> RankFile:
    """One rank's collectives from its Flight Recorder dump, as the spans reader returns them."""
    text_path = os.fspath(path)
    if dump is None:
        dump = load_dump(text_path)
        if dump is None:
            raise RankInputError(f"{text_path}: not a Flight Recorder dump")
    rank = rank_of(text_path, dump)
    calls: list[RankCall] = []
    skipped = 0
    try:
        groups = _Groups(dump.get("pg_config"))
        for entry in dump["entries"] or ():
            call = _call(rank, entry, groups)
            if call is None:
                skipped += 1
            else:
                calls.append(call)
    except (AttributeError, KeyError, TypeError, ValueError, RecursionError) as exc:
        problem = f"{type(exc).__name__}: {exc}"
        raise RankInputError(f"{text_path}: a Flight Recorder entry hp_otel cannot read ({problem})") from None
    return RankFile(text_path, rank, calls, skipped)


class _Groups:
    """A group's global ranks from `pg_config` (FR writes them as the text of a list, "[0, 1]").

    Found by the entry's group name, else by its description; gloo on torch 2.13 registers
    the default group under the name "" (its entries say "0"), so a lone entry is that group.
    """

    def __init__(self, pg_config: Any) -> None:
        self.by_name: dict[str, RankSet] = {}
        self.by_desc: dict[str, RankSet] = {}
        for name, config in (pg_config or {}).items():
            if not isinstance(config, Mapping):
                continue
            ranks = config.get("ranks", "")
            try:
                listed = json.loads(ranks) if isinstance(ranks, str) else ranks
                parsed = RankSet.of(checked_int(r, "ranks") for r in listed)  # hashed per call in O(1)
            except (TypeError, ValueError, RecursionError):
                parsed = EMPTY
            self.by_name[str(config.get("name", name))] = parsed
            if config.get("desc"):
                self.by_desc[str(config["desc"])] = parsed

    def ranks(self, name: str, desc: str) -> RankSet:
        if name in self.by_name:
            return self.by_name[name]
        if desc in self.by_desc:
            return self.by_desc[desc]
        if len(self.by_name) == 1 and "" in self.by_name:
            return self.by_name[""]
        return EMPTY


def _call(rank: int, entry: Mapping[str, Any], groups: _Groups) -> RankCall | None:
    group = entry.get("process_group") or ("", "")
    name = str(group[0])
    group_ranks = groups.ranks(name, str(group[1]) if len(group) > 1 else "")
    profiling_name = str(entry.get("profiling_name", ""))
    op = _OPS.get(profiling_name.rpartition(":")[2], profiling_name.rpartition(":")[2])
    if entry.get("is_p2p"):
        if len(group_ranks) != 2:  # a p2p number aligns only between the two ends of a pair
            return None
        window, seq = P2P_WINDOW, checked_int(entry["p2p_seq_id"], "p2p_seq_id")
    else:
        window, seq = WINDOW, checked_int(entry["collective_seq_id"], "collective_seq_id")
    start = checked_int(entry.get("time_created_ns") or 0, "time_created_ns")
    completed = checked_int(entry.get("time_discovered_completed_ns") or 0, "time_discovered_completed_ns")
    in_flight = not entry.get("retired", False) and entry.get("state") != "completed"
    return RankCall(
        rank=rank,
        window=window,
        group=name,
        group_ranks=group_ranks,
        seq=seq,
        op=op,
        name=profiling_name,
        input_shape=_first_shape(entry.get("input_sizes")),
        output_shape=_first_shape(entry.get("output_sizes")),
        dtype=_dtype(entry.get("input_dtypes") or entry.get("output_dtypes")),
        reduce_op="",
        module=UNKNOWN_MODULE,  # a Flight Recorder entry names no module
        phase="",
        start_ns=start,
        end_ns=max(completed, start),
        in_flight=in_flight,
        stack=_user_frames(entry.get("frames") or ()),
    )


def _first_shape(sizes: Any) -> tuple[int, ...]:
    if not sizes:
        return ()
    return tuple(checked_int(d, "input_sizes/output_sizes") for d in sizes[0])


def _dtype(dtypes: Any) -> str:
    if not dtypes:
        return ""
    first = str(dtypes[0])
    return _DTYPES.get(first, first)


def _user_frames(frames: Sequence[Mapping[str, Any]]) -> tuple[str, ...]:
    """FR's frames (innermost first) without torch's and hp_otel's, as `file:line:function`."""
    out = []
    for frame in frames:
        filename, line, name = frame.get("filename", ""), frame.get("line", 0), frame.get("name", "")
        if type(filename) is str and type(line) is int and type(name) is str:
            text = _frame_text(filename, line, name)  # the same few frames recur in every entry
        else:
            text = None if _is_library_frame(str(filename)) else f"{filename}:{checked_int(line, 'line')}:{name}"
        if text is None:
            continue
        out.append(text)
        if len(out) >= STACK_DEPTH:
            break
    return tuple(out)


@functools.lru_cache(maxsize=16384)
def _frame_text(filename: str, line: int, name: str) -> str | None:
    """`file:line:function`, or None for a library's frame."""
    return None if _is_library_frame(filename) else f"{filename}:{checked_int(line, 'line')}:{name}"


@functools.lru_cache(maxsize=1)
def _local_libraries() -> tuple[str, ...]:
    return package_dirs(_LIBRARIES)


@functools.lru_cache(maxsize=4096)  # a dump names few distinct files; 4,096 ranks' dumps share them
def _is_library_frame(filename: str) -> bool:
    """A frame of torch, hp_otel or typing_extensions, or a frozen module, judged by where the
    packages are installed, never by a folder's name alone: a user's checkout named `hp_otel`
    (a plain clone of this repository) holds the user's files, and its venv holds torch."""
    if filename.startswith("<frozen ") or filename.startswith(_local_libraries()) or _INSTALLED.search(filename):
        return True
    return _names_a_local_library_file(filename)


def _names_a_local_library_file(filename: str) -> bool:
    """`.../torch/distributed/c10d_logger.py` of a library installed where this process cannot see it
    (the machine that wrote the dump, a source checkout): the same relative file exists in the
    local package.  A user's own folder named `torch` or `hp_otel` holds files the package lacks."""
    folders = list(_LIBRARY_FOLDER.finditer(filename))
    if not folders:
        return False
    name = folders[-1].group(1)
    relative = re.split(r"[\\/]", filename[folders[-1].start(1) :])
    for root in _local_libraries():
        package = root.rstrip(os.sep)
        if root.endswith(os.sep) and os.path.basename(package) == name:
            if os.path.isfile(os.path.join(os.path.dirname(package), *relative)):
                return True
    return False


def align_buffers(files: Sequence[RankFile]) -> tuple[list[RankFile], list[str]]:
    """Flight Recorder rings keep the last N entries: compare each group from the newest first seq of its ranks.

    A rank whose ring dropped seqs the others still hold is not missing them; without
    this, every old collective a busier rank's ring evicted would read as a hang.
    """
    first: dict[tuple[str, str], int] = {}
    recorded = [f for f in files if _has_buffer(f)]  # spans files hold none: not walked
    for f in recorded:
        mins: dict[tuple[str, str], int] = {}
        for call in f.calls:
            if call.window in (WINDOW, P2P_WINDOW):
                key = (call.window, call.group)
                mins[key] = min(mins.get(key, call.seq), call.seq)
        for key, low in mins.items():
            first[key] = max(first.get(key, low), low)
    if not first:
        return list(files), []
    out, notes = [], []
    for f in files:
        if not _has_buffer(f):
            out.append(f)
            continue
        kept = [c for c in f.calls if c.window not in (WINDOW, P2P_WINDOW) or c.seq >= first[(c.window, c.group)]]
        if len(kept) != len(f.calls):
            notes.append(
                f"{f.path}: {len(f.calls) - len(kept)} older Flight Recorder entries not compared "
                "(other ranks' buffers no longer hold them)"
            )
            f = dataclasses.replace(f, calls=kept)
        out.append(f)
    return out, notes


def _has_buffer(f: RankFile) -> bool:
    return any(kind.window in (WINDOW, P2P_WINDOW) for kind in f.calls.kinds)
