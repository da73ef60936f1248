"""Writing output files: one path check and one atomic writer for every writer in hp_otel.

The table, the JSON dump and the spans file are all written through a temporary file
in the target's folder, then renamed, so a failure never leaves a partial file.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from typing import IO, Any

_UMASK = os.umask(0o022)  # read once (reading it means setting it), then put it back
os.umask(_UMASK)


def check_path(path: Any, argument: str = "path") -> str:
    """The path as a string, or a clear error naming `argument` (wrong type, missing folder, a directory)."""
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
        raise TypeError(f"{argument} must be a non-empty path (str or os.PathLike), got {path!r}")
    target = os.fspath(path)
    if not isinstance(target, str):
        raise TypeError(f"{argument} must be a text path, got bytes {target!r}")
    folder = os.path.dirname(os.path.abspath(target))
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"{argument}: folder {folder!r} does not exist")
    if os.path.isdir(target):
        raise IsADirectoryError(f"{argument}: {target!r} is a directory, expected a file path")
    return target


def write_text_atomically(
    path: str | os.PathLike[str], write: Callable[[IO[str]], Any], argument: str = "path"
) -> None:
    """Check the path, write through a temporary file in the same folder, then rename.

    A path that cannot be written raises the OSError's own type, naming `argument`.
    """
    target = check_path(path, argument)
    folder = os.path.dirname(os.path.abspath(target))
    try:
        fd, tmp = tempfile.mkstemp(prefix=".hp_otel.", dir=folder)
    except OSError as exc:
        raise type(exc)(exc.errno, f"{argument}: cannot write {target!r} ({exc.strerror})") from exc
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            write(handle)
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; give the file the usual permissions
        try:
            os.replace(tmp, target)
        except OSError as exc:
            raise type(exc)(exc.errno, f"{argument}: cannot write {target!r} ({exc.strerror})") from exc
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
