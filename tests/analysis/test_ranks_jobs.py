"""`hp-otel ranks --jobs N`: never more reading processes than cores, and none outlives the reading
(issue 43: `--jobs 999999999` over 10,000 files forked a worker per file and left thousands orphaned)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from events import ALL_REDUCE

from hp_otel import CommDebugMode
from hp_otel.analysis import compare_files, reading_pool
from hp_otel.cli import main


def rank_files(folder: Path, ranks: int) -> list[str]:
    """`ranks` collectives files of one all_reduce each (a real window's file, its rank rewritten)."""
    with CommDebugMode() as mode:
        start = time.time_ns()
        mode.observer.on_collective(ALL_REDUCE, start, start + 1000, None, None)
    template = folder / "template.json"
    mode.write_collectives(template)
    payload = json.loads(template.read_text())
    template.unlink()
    paths = []
    for rank in range(ranks):
        payload["resource"]["hp_otel.rank"] = rank
        path = folder / f"collectives_rank{rank}.json"
        path.write_text(json.dumps(payload))
        paths.append(str(path))
    return paths


def _children(pid: int) -> set[int]:
    """The live (not zombie) processes whose parent is `pid`."""
    out = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            out.add(int(entry))
    return out


def _alive(pids: set[int]) -> set[int]:
    alive = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            alive.add(pid)
    return alive


def test_jobs_beyond_the_cores_start_only_the_cores(tmp_path, monkeypatch):
    cores = reading_pool.default_jobs()
    paths = rank_files(tmp_path, 2 * cores + 8)  # more files than cores: the old cap was the files
    started = []
    real = reading_pool.ProcessPoolExecutor

    def spy(max_workers, **kwargs):
        started.append(max_workers)
        return real(max_workers, **kwargs)

    monkeypatch.setattr(reading_pool, "ProcessPoolExecutor", spy)
    before = _children(os.getpid())  # earlier tests' helpers (a resource tracker, a server) are not ours
    report = compare_files(paths, jobs=999_999_999)
    assert len(report.files) == len(paths)
    assert started in ([], [cores]) and all(n <= cores for n in started)
    assert not _children(os.getpid()) - before


def test_jobs_beyond_the_stated_maximum_are_refused(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["ranks", "--jobs", "999999999", "x.json"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "argument --jobs: must be 1-1024" in err


def test_ctrl_c_while_reading_leaves_no_worker(tmp_path):
    paths = rank_files(tmp_path, 200)

    def interrupt(done, total):
        if done == 1:
            raise KeyboardInterrupt

    before = _children(os.getpid())
    with pytest.raises(KeyboardInterrupt):
        compare_files(paths, jobs=2, on_read=interrupt)
    assert not _children(os.getpid()) - before


def test_a_killed_ranks_command_leaves_no_worker(tmp_path):
    """SIGKILL (the OOM killer, a job's time limit) ends the parent with no chance to clean up: its
    workers end with it (parent-death signal), not left waiting on its queue forever."""
    paths = rank_files(tmp_path, 3000)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    command = [sys.executable, "-m", "hp_otel.cli", "ranks", "--jobs", "2", *paths]
    parent = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    workers: set[int] = set()
    deadline = time.monotonic() + 60
    while not workers and parent.poll() is None and time.monotonic() < deadline:
        workers = _children(parent.pid)
        time.sleep(0.005)
    assert workers, "the command ended before its workers could be seen: give it more files"
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while _alive(workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = _alive(workers)
    for pid in left:  # do not leave them to the next test
        os.kill(pid, signal.SIGKILL)
    assert not left, f"{len(left)} workers outlived the killed command"
