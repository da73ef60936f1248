"""Writing output files respects what is at the path (hp_otel.common.files).

Each case is a kind of thing a user points an output path at: a symlink, a FIFO, a
device, a read-only file, a private file, a new file under an unusual umask; and the
failures a write can meet (an error in the writer, SIGTERM half-way). No temporary file
may be left behind by any of them.
"""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from hp_otel.common.files import write_text_atomically

pytestmark = pytest.mark.torch_free  # needs no torch: not rerun on torch 2.14.1 (tests/support/markers.py)


def _write(path: str | Path, text: str = "hello\n") -> None:
    write_text_atomically(path, lambda handle: handle.write(text), argument="file_name")


def _leftovers(folder: Path) -> list[str]:
    return [name for name in os.listdir(folder) if ".hp_otel" in name]


def test_a_symlink_stays_a_link_and_its_target_gets_the_output(tmp_path: Path) -> None:
    real = tmp_path / "real.txt"
    real.write_text("old")
    link = tmp_path / "link.txt"
    link.symlink_to(real)
    _write(link)
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert real.read_text() == "hello\n"
    assert _leftovers(tmp_path) == []


def test_a_dangling_symlink_creates_its_target(tmp_path: Path) -> None:
    link = tmp_path / "link.txt"
    link.symlink_to(tmp_path / "new.txt")
    _write(link)
    assert link.is_symlink() and (tmp_path / "new.txt").read_text() == "hello\n"


def test_a_fifo_is_written_in_place_not_replaced(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received: list[str] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_text()))
    reader.start()
    _write(fifo)
    reader.join(10)
    assert received == ["hello\n"]
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert _leftovers(tmp_path) == []


def test_a_device_is_written_in_place_not_replaced(tmp_path: Path) -> None:
    # As root a writer that renames would replace the device: use our own node of /dev/null's
    # kind, never the system's. Without root, /dev/null itself (its folder is not writable).
    if os.geteuid() == 0:
        device = tmp_path / "null"
        os.mknod(device, stat.S_IFCHR | 0o666, os.stat("/dev/null").st_rdev)
    else:
        device = Path("/dev/null")
    before = os.stat(device)
    _write(device)
    after = os.stat(device)
    assert stat.S_ISCHR(after.st_mode) and after.st_ino == before.st_ino and after.st_rdev == before.st_rdev


def test_an_existing_file_keeps_its_mode(tmp_path: Path) -> None:
    private = tmp_path / "private.txt"
    private.write_text("old")
    private.chmod(0o600)
    _write(private)
    assert stat.S_IMODE(private.stat().st_mode) == 0o600 and private.read_text() == "hello\n"


def test_a_new_file_gets_the_umask_in_force_when_it_is_written(tmp_path: Path) -> None:
    previous = os.umask(0o077)
    try:
        _write(tmp_path / "new.txt")
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "new.txt").stat().st_mode) == 0o600
    previous = os.umask(0o002)
    try:
        _write(tmp_path / "shared.txt")
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "shared.txt").stat().st_mode) == 0o664


def test_a_read_only_file_is_refused_not_overwritten(tmp_path: Path) -> None:
    locked = tmp_path / "locked.txt"
    locked.write_text("keep me")
    locked.chmod(0o444)
    with pytest.raises(PermissionError, match=r"file_name: .*locked.txt' is read-only \(mode 444\)"):
        _write(locked)
    assert locked.read_text() == "keep me" and _leftovers(tmp_path) == []


def test_an_error_in_the_writer_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "out.txt"
    target.write_text("old")

    def fail(handle):  # type: ignore[no-untyped-def]
        handle.write("partial")
        raise RuntimeError("writer failed")

    with pytest.raises(RuntimeError, match="writer failed"):
        write_text_atomically(target, fail)
    assert target.read_text() == "old" and _leftovers(tmp_path) == []


def test_sigterm_half_way_removes_the_temporary_and_still_ends_the_process(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import sys, time
        from hp_otel.common.files import write_text_atomically

        def slow(handle):
            handle.write("x" * 1000)
            handle.flush()
            print("writing", flush=True)
            time.sleep(30)

        write_text_atomically({str(tmp_path / "out.txt")!r}, slow)
        """
    )
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdout.readline() == "writing\n"
    # the temporary is unnamed while it is written where the system has O_TMPFILE
    assert len(_leftovers(tmp_path)) == (0 if hasattr(os, "O_TMPFILE") else 1)
    child.send_signal(signal.SIGTERM)
    started = time.monotonic()
    assert child.wait(20) == -signal.SIGTERM  # still ends by SIGTERM
    assert time.monotonic() - started < 10
    assert _leftovers(tmp_path) == [] and not (tmp_path / "out.txt").exists()
