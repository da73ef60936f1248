"""Real 2-process gloo jobs, compared by `hp-otel ranks`: consistent, divergent, and a hang.

Each job's workers write their spans files (and a referee's list of what they really
issued); the CLI is then run as a user would, and its report must name exactly the
divergence, the missing rank and the straggler the workers were written to produce.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import rank_workers
import torch.multiprocessing as mp

from hp_otel.workloads.process_groups import free_port

pytestmark = pytest.mark.multiprocess  # two gloo processes each

WORLD_SIZE = 2


def _ranks_cli(out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    files = [str(out / f"spans_rank{r}.json") for r in range(WORLD_SIZE)]
    return subprocess.run(
        [sys.executable, "-m", "hp_otel.cli", "ranks", *files, *extra], capture_output=True, text=True, timeout=60
    )


def _referee(out: Path, rank: int) -> list[list[object]]:
    return json.loads((out / f"referee_rank{rank}.json").read_text())


def test_consistent_ranks_agree_and_the_late_rank_is_the_straggler(tmp_path: Path) -> None:
    mp.spawn(rank_workers.consistent_worker, args=(WORLD_SIZE, free_port(), str(tmp_path)), nprocs=WORLD_SIZE)
    assert _referee(tmp_path, 0) == _referee(tmp_path, 1) == [["c10d.allreduce_", [4, 8]]] * 4
    result = _ranks_cli(tmp_path)
    print(result.stdout)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "agree (4 collectives reached by every rank)" in result.stdout
    assert "waiting" not in result.stdout and "in_flight" not in (tmp_path / "spans_rank0.json").read_text()
    report = json.loads(_ranks_cli(tmp_path, "--json", "--per-collective").stdout)  # each group's skews
    (group,) = report["groups"]
    assert group["agree"] and group["compared"] == 4 and group["divergence"] is None and group["missing"] == []
    skews = {k["seq"]: k for k in group["skews"]}
    assert skews[2]["last_rank"] == 1 and skews[2]["module"] == "layers.2"
    assert skews[2]["skew_ns"] >= 0.95e9 * rank_workers.LATE_S  # rank 1 slept LATE_S before it
    assert all(skews[seq]["skew_ns"] < skews[2]["skew_ns"] for seq in (0, 1, 3))
    assert report["stragglers"][0]["rank"] == 1  # the table leads with the rank that was last most


def test_a_different_shape_all_gather_is_the_first_divergence(tmp_path: Path) -> None:
    mp.spawn(rank_workers.divergent_worker, args=(WORLD_SIZE, free_port(), str(tmp_path)), nprocs=WORLD_SIZE)
    referee = {r: _referee(tmp_path, r) for r in range(WORLD_SIZE)}
    assert referee[0][1] == ["c10d._allgather_base_", [8, 8]] and referee[1][1] == ["c10d._allgather_base_", [16, 4]]
    result = _ranks_cli(tmp_path)
    print(result.stdout)
    assert result.returncode == 3, result.stdout + result.stderr
    assert "first divergence at seq #1:" in result.stdout
    assert "rank 0: all_gather input (4, 8) output (8, 8) torch.float32 in Module(layers.1)" in result.stdout
    assert "rank 1: all_gather input (8, 4) output (16, 4) torch.float32 in Module(layers.1)" in result.stdout
    report = json.loads(_ranks_cli(tmp_path, "--json").stdout)
    divergences = [g["divergence"] for g in report["groups"] if g["divergence"]]
    assert [d["seq"] for d in divergences] == [1]


def test_a_skipped_collective_leaves_watchdog_files_that_name_the_missing_rank(tmp_path: Path) -> None:
    mp.spawn(rank_workers.skipping_worker, args=(WORLD_SIZE, free_port(), str(tmp_path)), nprocs=WORLD_SIZE)
    # what really happened: rank 1 never issued the third all_reduce, rank 0 never the barrier
    assert [name for name, _ in _referee(tmp_path, 0)] == ["c10d.allreduce_"] * 3
    assert [name for name, _ in _referee(tmp_path, 1)] == ["c10d.allreduce_"] * 2 + ["c10d.barrier"]
    for rank in range(WORLD_SIZE):  # written by the watchdog: the in-flight collective is in the file
        text = (tmp_path / f"spans_rank{rank}.json").read_text()
        assert "hp_otel.collective.in_flight" in text and "hp_otel.watchdog.dump" in text
        print((tmp_path / f"watchdog_log_rank{rank}.txt").read_text())
    result = _ranks_cli(tmp_path)
    print(result.stdout)
    assert result.returncode == 3, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert (
        "  hang suspect: rank 1 never reached all_reduce #2 in Module(layers.2) "
        "(issued by rank 0; rank 0 waiting in it)" in lines
    )
    assert (
        "  hang suspect: rank 0 never reached barrier #0 in Module(layers.2) (issued by rank 1; rank 1 waiting in it)"
        in lines
    )
    assert "first divergence" not in result.stdout
