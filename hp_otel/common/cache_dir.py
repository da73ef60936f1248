"""Where hp_otel keeps what it builds once per machine (the callgrind client library, the native gate).

What is loaded from there runs inside the trainer, so it is trusted only when nobody else could
have put it there: each folder from the cache folder down, and the file, owned by this user (or
root) and writable by no group or other user (`open_private`). A relative `XDG_CACHE_HOME` is
refused (the XDG spec allows only absolute paths): it would make the job's working directory
the cache.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

CACHE_ENV = "XDG_CACHE_HOME"


class UntrustedCache(PermissionError):
    """A folder or file in the cache that another user could have written: never loaded."""


def cache_folder() -> Path:
    """$XDG_CACHE_HOME/hp_otel, else ~/.cache/hp_otel (read at each call: tests move it).

    Raises ValueError naming the variable when it (or the home folder) is a relative path."""
    value = os.environ.get(CACHE_ENV)
    if value and not os.path.isabs(value):
        raise ValueError(f"{CACHE_ENV}={value!r} is a relative path; it must be absolute (or unset: ~/.cache)")
    base = value or os.path.join(os.path.expanduser("~"), ".cache")
    if not os.path.isabs(base):
        raise ValueError(f"the home folder {os.path.expanduser('~')!r} is not absolute; set {CACHE_ENV}")
    return Path(base) / "hp_otel"


def _trusted(st: os.stat_result) -> str | None:
    """Why this folder or file could have been written by another user, or None when it could not."""
    if st.st_uid not in (os.geteuid(), 0):
        return f"owned by uid {st.st_uid}, not this user (uid {os.geteuid()}) nor root"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"writable by its group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def check_private(fd: int, path: str | os.PathLike[str]) -> None:
    """Raise UntrustedCache naming `path` unless what `fd` is open on is private to this user."""
    why = _trusted(os.fstat(fd))
    if why is not None:
        raise UntrustedCache(f"{os.fspath(path)} is {why}: not loaded; remove it or `chmod go-w` it")


def open_private(path: Path) -> int:
    """Open the file `path` under `cache_folder()` read-only, checking it and each folder from the
    cache folder down (each opened relative to the one checked before it: nothing can be swapped in
    between). Returns its descriptor; raises UntrustedCache, or an OSError (FileNotFoundError...)."""
    root = cache_folder()
    parts = Path(path).relative_to(root).parts
    flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
    folder = os.open(root, flags | os.O_DIRECTORY)
    where = root
    try:
        check_private(folder, where)
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            fd = os.open(part, flags | (0 if last else os.O_DIRECTORY) | getattr(os, "O_NOFOLLOW", 0), dir_fd=folder)
            os.close(folder)
            folder, where = fd, where / part
            check_private(folder, where)
        if not stat.S_ISREG(os.fstat(folder).st_mode):
            raise UntrustedCache(f"{where} is not a regular file: not loaded")
        return folder
    except BaseException:
        os.close(folder)
        raise


def make_private_folders(path: Path) -> Path:
    """Create `path` under `cache_folder()` with each missing folder from the cache folder down made
    0700, and check every one of them (one made by another user is refused: UntrustedCache)."""
    root = cache_folder()
    root.parent.mkdir(parents=True, exist_ok=True)
    folder = root
    for part in ("", *Path(path).relative_to(root).parts):
        folder = folder / part if part else folder
        try:
            os.mkdir(folder, 0o700)
        except FileExistsError:
            pass
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
        try:
            check_private(fd, folder)
        finally:
            os.close(fd)
    return Path(path)
