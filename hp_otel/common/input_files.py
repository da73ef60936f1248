"""The one bounded reader of every file a command reads: spans files, JSON dumps, snapshots,
Flight Recorder dumps (JSON or pickle), profiler traces.

Hostile or damaged input gets one line naming the file and what is wrong, never a traceback
or an unbounded amount of memory:

- regular files only: a device (`/dev/zero`), a FIFO, a socket or a folder is refused, also
  behind a symlink (its size reads 0, and it can be read forever);
- the size limit is checked before anything is parsed, and at most limit + 1 bytes are read
  (a file that grows meanwhile is refused too);
- JSON nested deeper than the decoder can follow is refused as such (not a RecursionError);
- a pickle is checked before the C unpickler builds anything, opcode by opcode unless its bytes
  alone bound what it can build (`_plainly_bounded`, the usual case): only what
  dicts, lists, tuples, strings, bytes and numbers need (no class, set, persistent id,
  extension or buffer), at most `MAX_PICKLE_CONTAINERS` containers, memo references to
  entries stored before, at most `MAX_NESTING` levels;
- an integer read from any of them goes through `checked_int`: NaN, Infinity, a fraction, a
  bool or a number an int64 cannot hold is refused naming the field.
"""

from __future__ import annotations

import errno
import io
import json
import os
import pickle
import pickletools
import stat
from collections.abc import Mapping
from itertools import chain, compress
from types import MappingProxyType
from typing import Any

MAX_BYTES_VARIABLE = "HP_OTEL_RENDER_MAX_BYTES"
DEFAULT_MAX_BYTES = 256 * 1024 * 1024
INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)
# Containers a pickle may build: far more than a Flight Recorder dump of its default ring builds
# (an entry's dict, its sizes' lists, its frames), far less than fills memory (the sizes on both
# sides: docs/reliability.md, bad input).
MAX_PICKLE_CONTAINERS = 2_000_000
MAX_NESTING = 100  # levels a pickle may nest (a Flight Recorder dump nests 4)

# Everything a pickle of dicts, lists, tuples, str, bytes, int, float, bool and None is made of.
_PICKLE_OPCODES = frozenset(
    "PROTO FRAME STOP MARK POP POP_MARK DUP NONE NEWTRUE NEWFALSE INT BININT BININT1 BININT2 LONG LONG1 LONG4 "
    "FLOAT BINFLOAT STRING BINSTRING SHORT_BINSTRING UNICODE SHORT_BINUNICODE BINUNICODE BINUNICODE8 "
    "BINBYTES SHORT_BINBYTES BINBYTES8 EMPTY_DICT DICT SETITEM SETITEMS EMPTY_LIST LIST APPEND APPENDS "
    "EMPTY_TUPLE TUPLE TUPLE1 TUPLE2 TUPLE3 PUT BINPUT LONG_BINPUT MEMOIZE GET BINGET LONG_BINGET".split()
)
_CONTAINERS = frozenset("EMPTY_DICT DICT EMPTY_LIST LIST EMPTY_TUPLE TUPLE TUPLE1 TUPLE2 TUPLE3".split())
_REFUSED = MappingProxyType(
    {
        **dict.fromkeys(
            "GLOBAL STACK_GLOBAL INST OBJ NEWOBJ NEWOBJ_EX REDUCE BUILD EXT1 EXT2 EXT4".split(), "names a class"
        ),
        **dict.fromkeys(("PERSID", "BINPERSID"), "a persistent id"),
        **dict.fromkeys(("EMPTY_SET", "ADDITEMS", "FROZENSET"), "a set"),
        **dict.fromkeys(("BYTEARRAY8", "NEXT_BUFFER", "READONLY_BUFFER"), "a buffer"),
    }
)
# The opcode bytes of MARK, EMPTY_TUPLE, EMPTY_LIST, EMPTY_DICT, TUPLE1-3 and EMPTY_SET (LIST, DICT,
# TUPLE and FROZENSET close a MARK).
_CONTAINER_BYTES = (b"(", b")", b"]", b"}", b"\x85", b"\x86", b"\x87", b"\x8f")
_WALKED = frozenset({dict, list, tuple})  # what the unpickler builds: exact types, never subclasses
_NOT_PLAIN = frozenset({set, frozenset, bytearray})
_GETS = frozenset({"GET", "BINGET", "LONG_BINGET"})
_PUTS = frozenset({"PUT", "BINPUT", "LONG_BINPUT"})


class InputFileError(ValueError):
    """A file a command cannot read: one line naming the file and what is wrong."""


def max_bytes_limit(max_bytes: int | None = None, environ: Mapping[str, str] = os.environ) -> int:
    """The size limit for reading an input file: the argument, else HP_OTEL_RENDER_MAX_BYTES, else 256 MiB."""
    if max_bytes is not None:
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
            raise ValueError(f"max_bytes must be a positive int, got {max_bytes!r}")
        return max_bytes
    text = environ.get(MAX_BYTES_VARIABLE, "").strip()
    if text:
        if not text.isdigit() or int(text) < 1:
            raise InputFileError(f"{MAX_BYTES_VARIABLE} must be a positive number of bytes, got {text!r}")
        return int(text)
    return DEFAULT_MAX_BYTES


def read_bytes(path: str | os.PathLike[str], what: str = "file", max_bytes: int | None = None) -> bytes:
    """The file's bytes, at most the limit: a missing, non-regular or too large file is an InputFileError."""
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):  # an int would be read as a descriptor
        raise TypeError(f"path must be a non-empty path (str or os.PathLike), got {path!r}")
    name = os.fspath(path)
    limit = max_bytes_limit(max_bytes)
    try:  # O_NONBLOCK: opening a FIFO must not wait for a writer
        fd = os.open(name, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise InputFileError(f"{what} {name!r} does not exist") from None
    except OSError as exc:
        if exc.errno == errno.EISDIR:
            raise InputFileError(f"{what} {name!r} cannot be read: it is a folder, not a file") from None
        raise InputFileError(f"{what} {name!r} cannot be read: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = "a folder" if stat.S_ISDIR(info.st_mode) else "a device, FIFO or socket"
            raise InputFileError(f"{what} {name!r} cannot be read: it is {kind}, not a regular file")
        if info.st_size > limit:
            raise InputFileError(_too_large(what, name, info.st_size, limit))
        with open(fd, "rb", closefd=False) as handle:
            data = handle.read(min(limit, info.st_size) + 1)  # never a buffer of the limit's size: it may be huge
            while len(data) <= limit:  # the file grew since fstat: the rest, up to the limit
                more = handle.read(min(limit + 1 - len(data), 1 << 26))
                if not more:
                    break
                data += more
    except OSError as exc:
        raise InputFileError(f"{what} {name!r} cannot be read: {exc.strerror}") from None
    finally:
        os.close(fd)
    if len(data) > limit:
        raise InputFileError(_too_large(what, name, len(data), limit, grew=True))
    return data


def _too_large(what: str, name: str, size: int, limit: int, grew: bool = False) -> str:
    size_text = f"over {limit:,} bytes (it grew while read)" if grew else f"{size:,} bytes"
    return (
        f"{what} {name!r} is {size_text}, over the limit of {limit:,} bytes (reading needs about 10x the file "
        f"size in memory); raise it with --max-bytes or {MAX_BYTES_VARIABLE}"
    )


def parse_json(data: bytes, name: str, what: str = "file") -> Any:
    """`data` as JSON; not UTF-8, not JSON or nested deeper than the decoder follows: an InputFileError."""
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise InputFileError(
            f"{what} {name!r} cannot be read: not UTF-8 text ({exc.reason} at byte {exc.start})"
        ) from None
    except json.JSONDecodeError as exc:
        raise InputFileError(f"{what} {name!r} is not JSON: {exc}") from None
    except RecursionError:
        raise InputFileError(
            f"{what} {name!r} nests values deeper than can be read; hp_otel's files nest about 10"
        ) from None


def read_json(path: str | os.PathLike[str], what: str = "file", max_bytes: int | None = None) -> Any:
    """The file parsed as JSON, within the size limit (see `read_bytes`, `parse_json`)."""
    return parse_json(read_bytes(path, what, max_bytes), os.fspath(path), what)


class _NoClasses(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"names a class ({module}.{name})")


def parse_pickle(data: bytes, name: str, what: str = "pickle") -> Any:
    """A pickle of plain data only, checked before it is built (see the module doc); else an InputFileError."""
    if not _plainly_bounded(data):
        _check_pickle(data, name, what)
    try:
        payload = _NoClasses(io.BytesIO(data)).load()
    except Exception as exc:  # a damaged pickle (or one naming a class): the scan says why where it can
        _check_pickle(data, name, what)
        raise InputFileError(f"{what} {name!r} is a pickle that cannot be read ({type(exc).__name__}: {exc})") from None
    depth, not_plain = _shape(payload)
    if not_plain:  # a set or bytearray the byte bound let through: the scan names it
        _check_pickle(data, name, what)
    if depth > MAX_NESTING:  # the unpickler builds any depth; str() of it would recurse
        raise InputFileError(f"{what} {name!r} is refused: it nests more than {MAX_NESTING} levels")
    return payload


def _plainly_bounded(data: bytes) -> bool:
    """True when the bytes alone show the C unpickler may build `data` without the opcode scan.

    Every container opcode is one of `_CONTAINER_BYTES` (the MARK-based ones need a MARK), so their
    count bounds the containers built (those bytes also occur in strings and binary numbers, which
    only loosens the bound). Classes, persistent ids and extensions need `find_class` or
    `persistent_load`, which the unpickler refuses; out-of-band buffers need `buffers`, which it is
    not given; the unpickler checks the memo itself; a set or bytearray is found after the build
    (`_shape`), and the exact scan then names it.
    """
    return sum(data.count(byte) for byte in _CONTAINER_BYTES) <= MAX_PICKLE_CONTAINERS


def _shape(value: Any) -> tuple[int, bool]:
    """(how deep lists, tuples and dicts nest in `value`, whether a set or bytearray is in it);
    stops past MAX_NESTING.

    Level by level, each level's children gathered, typed and filtered by C builtins (a dump's
    thousands of containers hold mostly leaves). A container shared by reference (the memo) is
    walked once per level it is reached on: at most MAX_NESTING times."""
    if type(value) in _NOT_PLAIN:
        return 0, True
    level = [value] if type(value) in _WALKED else []
    depth = 0
    while level:
        depth += 1
        if depth > MAX_NESTING:
            return depth, False
        children = list(chain.from_iterable(item.values() if type(item) is dict else item for item in level))
        kinds = set(map(type, children))
        if not kinds.isdisjoint(_NOT_PLAIN):
            return depth, True
        if kinds.isdisjoint(_WALKED):
            break
        inner = list(compress(children, map(_WALKED.__contains__, map(type, children))))
        level = list(dict(zip(map(id, inner), inner, strict=True)).values())  # each shared one once a level
    return depth, False


def _check_pickle(data: bytes, name: str, what: str) -> None:
    containers = 0
    memo: set[int] = set()
    next_memo = 0
    try:
        for opcode, arg, position in pickletools.genops(data):
            op = opcode.name
            if op not in _PICKLE_OPCODES:
                raise InputFileError(
                    f"{what} {name!r} is refused: {_REFUSED.get(op, 'an opcode plain data never uses')} "
                    f"(opcode {op} at byte {position}); only dicts, lists, tuples, strings and numbers are read"
                )
            if op in _CONTAINERS:
                containers += 1
                if containers > MAX_PICKLE_CONTAINERS:
                    raise InputFileError(
                        f"{what} {name!r} is refused: it builds more than {MAX_PICKLE_CONTAINERS:,} lists, dicts "
                        "and tuples (a memory bomb, or not a Flight Recorder dump)"
                    )
            if op == "MEMOIZE":
                memo.add(next_memo)
                next_memo += 1
            elif op in _PUTS:
                memo.add(int(arg))
                next_memo = max(next_memo, int(arg) + 1)
            elif op in _GETS and int(arg) not in memo:
                raise InputFileError(
                    f"{what} {name!r} is refused: opcode {op} at byte {position} refers to memo entry {arg}, "
                    "which was never stored"
                )
    except InputFileError:
        raise
    except Exception as exc:  # truncated, an unknown opcode, a length beyond the data
        raise InputFileError(f"{what} {name!r} is a damaged pickle ({exc})") from None


def checked_int(value: Any, field: str) -> int:
    """`value` as an integer field of a file: an int, an integral float or decimal text within int64.

    NaN, Infinity, a fraction, a bool, None or anything beyond int64 raises a ValueError naming `field`
    (`int(float("inf"))` raises OverflowError, which readers catching ValueError let through).
    """
    if type(value) is int and INT64_MIN <= value <= INT64_MAX:  # nearly every call: a plain int in range
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"{field} must be an integer, got {value!r}")
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")) or not value.is_integer():
            raise ValueError(f"{field} must be an integer, got {value!r}")
    try:
        number = int(value)
    except (ValueError, OverflowError):
        raise ValueError(f"{field} must be an integer, got {value!r}") from None
    if not INT64_MIN <= number <= INT64_MAX:
        raise ValueError(f"{field} must be an integer an int64 can hold, got {value!r}")
    return number
