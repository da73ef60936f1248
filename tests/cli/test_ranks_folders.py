"""`hp-otel ranks DIR...`: a folder stands for the rank files a run writes in it, recognised by name.

The referee is the same command given the files themselves, picked by the test: a folder's
report must be that report, whatever else lies in the folder (decoys that would change it or
fail it if read). The progress line is checked on a real terminal (a pty as stderr) and off one.
"""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
import time
from pathlib import Path

from events import ALL_REDUCE

from hp_otel import CommDebugMode
from hp_otel.cli import main
from hp_otel.spans.collectives_file import RING_NAME

RANKS = 12  # past 10: a name order (rank10 before rank2) differs from the rank order


def _window() -> CommDebugMode:
    with CommDebugMode() as mode:
        start = time.time_ns()
        mode.observer.on_collective(ALL_REDUCE, start, start + 1000, None, None)
    return mode


def _collectives(folder: Path, ranks: range, mode: CommDebugMode) -> list[str]:
    """The ring's files (`RING_NAME`) of `ranks`: one window's collectives file, its rank rewritten."""
    template = folder / "template.tmp"
    mode.write_collectives(template)
    payload = json.loads(template.read_text())
    template.unlink()
    paths = []
    for rank in ranks:
        payload["resource"]["hp_otel.rank"] = rank
        payload["resource"]["hp_otel.world.size"] = RANKS
        path = folder / RING_NAME.format(rank=rank)
        path.write_text(json.dumps(payload))
        paths.append(str(path))
    return paths


def _decoys(folder: Path) -> None:
    """Files a run's folder may hold beside its rank files; each would fail or change the report if read."""
    (folder / "notes.txt").write_text("not a rank file")
    (folder / "volume_rank0.json").write_text("{}")
    (folder / f"{RING_NAME.format(rank=0)}.tmp").write_text("{")
    (folder / "collectives-rank99.json.partial").write_text("{")
    (folder / "spans_rank50.json").mkdir()  # a folder named like a rank file


def _report(argv: list[str], capsys) -> tuple[int, dict, str]:  # type: ignore[no-untyped-def]
    status = main(["ranks", "--json", *argv])
    out, err = capsys.readouterr()
    return status, json.loads(out) if out.strip() else {}, err


def test_a_folder_reads_its_rank_files_and_nothing_else(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    mode = _window()
    files = _collectives(tmp_path, range(RANKS), mode)
    for rank in (0, 1):  # the demo's JSON dumps beside them: another kind, for the same ranks
        mode.generate_json_dump(tmp_path / f"comm_rank{rank}.json")
    _decoys(tmp_path)
    status, by_folder, err = _report([str(tmp_path)], capsys)
    expected_status, by_files, _ = _report(files, capsys)
    assert (status, by_folder) == (expected_status, by_files)
    assert len(by_folder["files"]) == RANKS
    assert err == f"hp-otel ranks: {tmp_path}: read its {RANKS} collectives files; it also holds 2 JSON dumps " \
        "(give those as files to compare them)\n"  # fmt: skip


def test_a_folder_of_json_dumps_alone_is_read(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    mode = _window()
    dumps = [str(tmp_path / f"comm_rank{rank}.json") for rank in range(3)]
    for path in dumps:
        mode.generate_json_dump(path)
    _decoys(tmp_path)
    status, by_folder, err = _report([str(tmp_path)], capsys)
    assert (status, by_folder) == _report(dumps, capsys)[:2]
    assert len(by_folder["files"]) == 3 and err == ""


def test_several_folders_and_files_together(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    mode = _window()
    halves = [tmp_path / "node0", tmp_path / "node1", tmp_path / "loose"]
    for folder in halves:
        folder.mkdir()
    files = _collectives(halves[0], range(5), mode) + _collectives(halves[1], range(5, 11), mode)
    files += _collectives(halves[2], range(11, 12), mode)
    status, report, _ = _report([str(halves[0]), str(halves[1]), files[-1]], capsys)
    assert (status, report) == _report(files, capsys)[:2]
    assert len(report["files"]) == RANKS


def test_a_folder_without_rank_files_is_named_in_one_line(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    _decoys(tmp_path)
    assert main(["ranks", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (
        f"hp-otel ranks: {tmp_path}: no rank file in this folder (looked for collectives-rank<N>.json, "
        "spans_rank<N>.json, comm_rank<N>.json, nccl_trace_rank_<N>); give the files themselves\n"
    )


def _run_with_stderr(argv: list[str], stderr_tty: bool) -> tuple[int, str]:
    """The command in a child process, its stderr a pty (a terminal) or a pipe; (status, stderr)."""
    command = [sys.executable, "-c", "import sys; from hp_otel.cli import main; sys.exit(main(sys.argv[1:]))", *argv]
    if not stderr_tty:
        done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=120)
        return done.returncode, done.stderr
    parent, child = pty.openpty()
    try:
        process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=child)
        os.close(child)
        chunks = []
        while True:
            try:
                chunk = os.read(parent, 4096)
            except OSError:  # EIO: the child closed its side
                break
            if not chunk:
                break
            chunks.append(chunk)
        return process.wait(timeout=120), b"".join(chunks).decode()
    finally:
        os.close(parent)


def test_the_progress_line_shows_on_a_terminal_only(tmp_path: Path) -> None:
    _collectives(tmp_path, range(RANKS), _window())
    status, on_terminal = _run_with_stderr(["ranks", "--jobs", "1", str(tmp_path)], stderr_tty=True)
    assert status == 0
    assert f"hp-otel ranks: read {RANKS} of {RANKS} files, " in on_terminal, on_terminal
    status, piped = _run_with_stderr(["ranks", "--jobs", "1", str(tmp_path)], stderr_tty=False)
    assert (status, piped) == (0, "")
