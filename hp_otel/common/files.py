"""Writing output files: one path check and one writer for every writer in hp_otel.

The table, the JSON dump and the spans file are written through a temporary file in
the target's folder, then renamed, so a failure never leaves a partial file. On Linux the
temporary file is unnamed while it is written (`O_TMPFILE`): a process killed meanwhile,
by any signal, leaves the previous complete file and no temporary one. What is
at the path is respected:

- a symlink is followed: its target gets the output, the link stays a link;
- a FIFO, a device (`/dev/null`, `/dev/stdout`) or a socket is written in place, never replaced;
- an existing file keeps its permission bits; a new one gets 0666 less the umask in
  force when it is written (the kernel applies it: nothing is read at import);
- a read-only file is refused with an error naming the argument, not overwritten;
- the temporary file is removed on any failure, on Ctrl-C, and on SIGTERM (the process
  then still ends by SIGTERM, as it would have).

A folder other users may write too (a shared `HP_OTEL_COLLECTIVES_DIR` or
`HP_OTEL_PROMETHEUS_SD_DIR`) is written with `write_in_folder` instead: nothing planted there is
followed or written in place (see its doc).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import os
import secrets
import signal
import stat
import threading
from collections.abc import Callable, Iterator
from typing import IO, Any


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


def _error(exc: OSError, argument: str, target: str) -> OSError:
    if getattr(exc, "hp_otel_argument", None) == argument:  # named already, deeper down
        return exc
    named = type(exc)(exc.errno, f"{argument}: cannot write {target!r} ({exc.strerror or exc})")
    named.hp_otel_argument = argument  # type: ignore[attr-defined]
    return named


def write_text_atomically(
    path: str | os.PathLike[str], write: Callable[[IO[str]], Any], argument: str = "path"
) -> None:
    """Check the path, then write the text `write(handle)` produces (see the module doc for how).

    A path that cannot be written raises the OSError's own type, naming `argument`.
    """
    target = check_path(path, argument)
    real = os.path.realpath(target)  # through symlinks: the link's target gets the output
    try:
        existing = os.stat(real)
    except FileNotFoundError:
        existing = None
    except OSError as exc:
        raise _error(exc, argument, target) from exc
    if existing is not None and not stat.S_ISREG(existing.st_mode):
        if stat.S_ISDIR(existing.st_mode):
            raise IsADirectoryError(f"{argument}: {target!r} is a directory, expected a file path")
        _write_in_place(real, write, argument, target)  # a FIFO or a device: never replace it
        return
    if existing is not None and (not stat.S_IMODE(existing.st_mode) & 0o222 or not os.access(real, os.W_OK)):
        raise PermissionError(
            errno.EACCES,
            f"{argument}: {target!r} is read-only (mode {stat.S_IMODE(existing.st_mode):o}); "
            "make it writable or choose another path",
        )
    with _sigterm_cleans_up():
        _write_and_rename(real, write, existing, argument, target)


def _write_in_place(real: str, write: Callable[[IO[str]], Any], argument: str, target: str) -> None:
    try:
        with open(real, "w", encoding="utf-8") as handle:
            write(handle)
    except OSError as exc:
        raise _error(exc, argument, target) from exc


def _create_temporary(folder: str, name: str) -> tuple[int, str]:
    """A new file next to the target, created 0666 so the kernel applies the umask in force now."""
    for _ in range(100):
        tmp = os.path.join(folder, f".{name}.hp_otel-{secrets.token_hex(4)}.tmp")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, f"no free temporary name in {folder!r}")


def _create_unnamed(folder: str) -> int | None:
    """An unnamed file in `folder` (Linux `O_TMPFILE`): if the process dies while writing it, by
    any signal (SIGKILL too), it vanishes with the process. None where the system or the file
    system cannot make one (then a named temporary file is used)."""
    flag = getattr(os, "O_TMPFILE", 0)
    if not flag:
        return None
    try:
        return os.open(folder, flag | os.O_RDWR | getattr(os, "O_CLOEXEC", 0), 0o666)
    except OSError:  # EOPNOTSUPP, EISDIR (an old kernel), EINVAL: this file system cannot
        return None


@functools.cache
def _linkat() -> Any:
    """libc's `linkat` (to name an unnamed file by its descriptor), None where there is none."""
    try:
        function = ctypes.CDLL(None, use_errno=True).linkat
    except (AttributeError, OSError):
        return None
    function.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_int)
    return function


_AT_FDCWD, _AT_EMPTY_PATH = -100, 0x1000


def _link_unnamed(fd: int, tmp: str) -> None:
    """Give the unnamed file of `fd` the name `tmp`: `linkat(fd, "", AT_EMPTY_PATH)`, else through /proc."""
    linkat = _linkat()
    if linkat is not None and linkat(fd, b"", _AT_FDCWD, os.fsencode(tmp), _AT_EMPTY_PATH) == 0:
        return
    os.link(f"/proc/self/fd/{fd}", tmp, follow_symlinks=True)


def _name_unnamed(fd: int, folder: str, name: str) -> str:
    """Give the finished unnamed file a temporary name next to the target (renamed over it next).

    Where neither way of naming it is allowed, its text is copied into a named temporary file."""
    for _ in range(100):
        tmp = os.path.join(folder, f".{name}.hp_otel-{secrets.token_hex(4)}.tmp")
        try:
            _link_unnamed(fd, tmp)
            return tmp
        except FileExistsError:
            continue
        except OSError:
            break
    copy, tmp = _create_temporary(folder, name)
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        while chunk := os.read(fd, 1 << 20):
            os.write(copy, chunk)
        os.fchmod(copy, stat.S_IMODE(os.fstat(fd).st_mode))
    except BaseException:
        os.close(copy)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    os.close(copy)
    return tmp


def _write_and_rename(
    real: str, write: Callable[[IO[str]], Any], existing: os.stat_result | None, argument: str, target: str
) -> None:
    """Write into an unnamed file where the system has them, else a named temporary one, then rename.

    With an unnamed file, the name exists only between the link and the rename (two system
    calls), so a process killed while writing leaves neither a partial nor a temporary file:
    the target is the previous complete file or the new complete one."""
    folder, name = os.path.split(real)
    tmp = None
    try:
        fd = _create_unnamed(folder)
        unnamed = fd is not None
        if fd is None:
            try:
                fd, tmp = _create_temporary(folder, name)
            except OSError as exc:
                raise _error(exc, argument, target) from exc
        try:  # a full disk (ENOSPC) shows in a write or the final flush: name the path there too
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                write(handle)
                if existing is not None:  # the file keeps its permissions
                    os.fchmod(handle.fileno(), stat.S_IMODE(existing.st_mode))
                if unnamed:
                    handle.flush()
                    tmp = _name_unnamed(handle.fileno(), folder, name)
        except OSError as exc:
            raise _error(exc, argument, target) from exc
        try:
            os.replace(tmp, real)  # type: ignore[arg-type]
        except OSError as exc:
            raise _error(exc, argument, target) from exc
        tmp = None
    finally:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


class _Terminated(BaseException):
    """SIGTERM arrived while a temporary file existed."""


@contextlib.contextmanager
def _sigterm_cleans_up() -> Iterator[None]:
    """While writing, a SIGTERM left at the OS default unwinds (removing the temporary file), then ends the process.

    Only on the main thread (the only one Python runs handlers on) and only when SIGTERM
    has no handler of yours (yours runs as usual; if it raises, the file is removed too).
    """
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return

    def unwind(signum: int, frame: Any) -> None:
        raise _Terminated()

    previous = signal.signal(signal.SIGTERM, unwind)
    try:
        yield
    except _Terminated:
        signal.signal(signal.SIGTERM, previous)
        os.kill(os.getpid(), signal.SIGTERM)  # end the way SIGTERM ends a process
        raise  # pragma: no cover - not reached
    finally:
        signal.signal(signal.SIGTERM, previous)


def _open_folder(folder: str, argument: str) -> int:
    """The folder's descriptor. A symlink as its last part is followed only when it is this user's or
    root's (what Linux's fs.protected_symlinks allows in a sticky folder): another user's link is refused."""
    flags = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0)
    try:
        return os.open(folder, flags | getattr(os, "O_NOFOLLOW", 0))
    except OSError as exc:
        try:
            link = os.lstat(folder)
        except OSError:
            link = None
        if link is None or not stat.S_ISLNK(link.st_mode):
            raise _error(exc, argument, folder) from exc
        if link.st_uid not in (os.geteuid(), 0):
            raise PermissionError(
                errno.EPERM, f"{argument}: {folder!r} is a symlink owned by uid {link.st_uid}, not followed"
            ) from None
    try:
        fd = os.open(folder, flags)
    except OSError as exc:
        raise _error(exc, argument, folder) from exc
    if os.lstat(folder).st_ino != link.st_ino:  # swapped for another link meanwhile
        os.close(fd)
        raise PermissionError(errno.EPERM, f"{argument}: {folder!r} changed while it was opened")
    return fd


def write_in_folder(folder: str | os.PathLike[str], name: str, write: Callable[[IO[str]], Any], argument: str) -> str:
    """Write the text `write(handle)` produces as `folder/name`, where other users may write `folder`.

    The folder is opened once (`_open_folder`) and everything after is relative to it (`dir_fd`):
    a new file is created (`O_EXCL | O_NOFOLLOW`, 0644 less the umask: only its owner can write
    it), written, and renamed over `name`, which replaces whatever is there (a symlink, a FIFO,
    another user's file) rather than following or opening it. So a link planted at `name` never
    makes this write a file elsewhere, and a FIFO never blocks it. Returns the path written; an
    OSError names `argument`.
    """
    if not name or os.sep in name or name in (".", ".."):
        raise ValueError(f"{argument}: {name!r} is not a file name")
    path = os.path.join(os.fspath(folder), name)
    dir_fd = _open_folder(os.fspath(folder), argument)
    try:
        with _sigterm_cleans_up():
            tmp = None
            try:
                for _ in range(100):
                    candidate = f".{name}.hp_otel-{secrets.token_hex(4)}.tmp"
                    try:
                        fd = os.open(candidate, _EXCLUSIVE, 0o644, dir_fd=dir_fd)
                    except FileExistsError:
                        continue
                    tmp = candidate
                    break
                else:
                    raise FileExistsError(errno.EEXIST, f"no free temporary name in {path!r}")
                with os.fdopen(fd, "w", encoding="utf-8") as handle:
                    write(handle)
                os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
                tmp = None
            except OSError as exc:
                raise _error(exc, argument, path) from exc
            finally:
                if tmp is not None:
                    with contextlib.suppress(OSError):
                        os.unlink(tmp, dir_fd=dir_fd)
    finally:
        os.close(dir_fd)
    return path


_EXCLUSIVE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


FileId = tuple[int, int, int]  # (st_dev, st_ino, st_size) of a file this process wrote
_APPEND = os.O_WRONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)


def file_id(fd: int) -> FileId:
    """The identity and size of an open file, to find it unchanged at the next `append_in_folder`."""
    st = os.fstat(fd)
    return st.st_dev, st.st_ino, st.st_size


def append_in_folder(
    folder: str | os.PathLike[str], name: str, offset: int, data: bytes, expect: FileId, argument: str
) -> FileId | None:
    """Write `data` at `offset` of `folder/name` if it is still the file this process left (`expect`:
    same inode, same size, a regular file it owns), where other users may write `folder`: a link,
    a FIFO or another file put at `name` since is never followed, opened blocking nor written
    (None then: the caller rewrites with `write_in_folder`). Returns the file's new identity.

    Writing at an offset rather than appending lets a writer overwrite its own closing bytes (a
    JSON document stays whole after each complete write). An OSError names `argument`."""
    path = os.path.join(os.fspath(folder), name)
    dir_fd = _open_folder(os.fspath(folder), argument)
    try:
        try:
            fd = os.open(name, _APPEND, dir_fd=dir_fd)
        except OSError:  # gone, a link (ELOOP), a FIFO without reader (ENXIO): not the file left
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or file_id(fd) != expect:
                return None
            view = memoryview(data)
            while view:  # a torn write (a crash meanwhile) is the reader's to recover: no temporary file
                done = os.pwrite(fd, view, offset)
                view, offset = view[done:], offset + done
            return file_id(fd)
        except OSError as exc:
            raise _error(exc, argument, path) from exc
        finally:
            os.close(fd)
    finally:
        os.close(dir_fd)
