"""Bandwidth with known sizes and a controlled delay on 2 real gloo processes.

Rank 1 sleeps DELAY_S before each collective, so rank 0 waits in each for about that
long.  The numbers are checked against hand-computed ones: the NCCL-tests size S and bus
factor of each op for n = 2, written out below, over durations bounded by the sleep and
by each rank's own timing of the call (the referee).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import bandwidth_workers as bw
import pytest
import torch.multiprocessing as mp

from hp_otel.workloads.process_groups import free_port

pytestmark = pytest.mark.multiprocess  # two gloo processes

WORLD_SIZE = 2
TENSOR = bw.N * bw.ITEM  # 262144 bytes
# op -> (this rank's input bytes, S, bus factor for n = 2), by hand from nccl-tests' PERFORMANCE.md
HAND = {
    "all_reduce": (TENSOR, TENSOR, 2 * (2 - 1) / 2),  # S = input, 2(n-1)/n = 1
    "all_gather": (TENSOR, 2 * TENSOR, (2 - 1) / 2),  # S = output = n x input, (n-1)/n
    "reduce_scatter": (2 * TENSOR, 2 * TENSOR, (2 - 1) / 2),  # S = input (the whole array)
    "all_to_all": (2 * TENSOR, 2 * TENSOR, (2 - 1) / 2),  # S = input (the send buffer)
    "broadcast": (TENSOR, TENSOR, 1.0),  # S = input, 1
}


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bandwidth")
    mp.spawn(bw.bandwidth_worker, args=(WORLD_SIZE, free_port(), str(out)), nprocs=WORLD_SIZE)
    return out


def _result(out: Path, rank: int) -> dict:  # type: ignore[type-arg]
    return json.loads((out / f"bandwidth_rank{rank}.json").read_text())


def test_span_bandwidths_match_the_hand_computed_ones(job: Path) -> None:
    results = {rank: _result(job, rank) for rank in range(WORLD_SIZE)}
    for rank, result in results.items():
        recorded, referee = result["recorded"], result["referee"]
        assert [r["op"] for r in recorded] == [r["op"] for r in referee] == list(HAND)
        for rec, ref in zip(recorded, referee, strict=True):
            nbytes, size, factor = HAND[rec["op"]]
            seconds = rec["duration_ns"] / 1e9
            print(
                f"rank {rank} {rec['op']:>14}: t={seconds * 1e3:8.3f} ms (referee {ref['duration_ns'] / 1e6:8.3f} ms)"
                f"  algbw={rec['algbw'] / 1e6:9.3f} MB/s (hand {size / seconds / 1e6:9.3f})"
                f"  busbw={rec['busbw'] / 1e6:9.3f} MB/s (hand {size * factor / seconds / 1e6:9.3f})"
            )
            assert rec["bytes"] == nbytes and rec["group_size"] == 2 and rec["bw_bytes"] == size
            assert rec["completion"] in ("call", "work", "wait")
            assert rec["algbw"] == pytest.approx(size / seconds, rel=1e-9)
            assert rec["busbw"] == pytest.approx(size * factor / seconds, rel=1e-9)
            # the span lies inside the referee's timing of the call (different clocks: 2 ms of slack)
            assert rec["duration_ns"] <= ref["duration_ns"] + 2_000_000
            if rank == 0:  # waited for rank 1's sleep: busbw at most S * factor / (half the sleep)
                assert rec["duration_ns"] >= 0.5 * bw.DELAY_S * 1e9, rec
                assert rec["busbw"] <= size * factor / (0.5 * bw.DELAY_S)
        metric = result["metric"]  # the busbw histogram got every call's busbw
        assert metric["count"] == len(HAND)
        assert metric["sum"] == pytest.approx(sum(r["busbw"] for r in recorded), rel=1e-9)
        assert "busbw=" in result["table"] and "algbw=" in result["table"]
    for late, early in zip(results[1]["recorded"], results[0]["recorded"], strict=True):
        assert late["busbw"] > early["busbw"], (late, early)  # the rank that arrived last did not wait


def test_ranks_reports_the_skew_free_bandwidth_and_the_slowest(job: Path) -> None:
    files = [str(job / f"spans_rank{r}.json") for r in range(WORLD_SIZE)]
    run = subprocess.run(
        [sys.executable, "-m", "hp_otel.cli", "ranks", *files, "--json", "--per-collective"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads(run.stdout)["bandwidth"]
    late = {r["op"]: r["busbw"] for r in _result(job, 1)["recorded"]}
    early = {r["op"]: r["busbw"] for r in _result(job, 0)["recorded"]}
    timed = [c for c in report["collectives"] if c["seq"] > 0]  # seq 0: the warm-up, 1: the barrier (no bandwidth)
    assert sorted(c["op"] for c in timed) == sorted(HAND)
    for c in timed:  # skew-free = the last arriver's, rank 1's
        assert c["skew_free_busbw_bytes_per_s"] == pytest.approx(late[c["op"]])
        assert c["busbw_bytes_per_s"] == {"0": pytest.approx(early[c["op"]]), "1": pytest.approx(late[c["op"]])}
    own = {row["label"]: row["median_own_busbw_bytes_per_s"] for row in report["ranks"]}
    assert own["rank 0"] < own["rank 1"]
    text = subprocess.run(
        [sys.executable, "-m", "hp_otel.cli", "ranks", *files], capture_output=True, text=True, timeout=60
    ).stdout
    print(text)
    assert "bandwidth (NCCL-tests busbw" in text and "slowest collectives:" in text
    # the barrier on each rank: counted nowhere in the section, and the section says so
    assert "  left out: 2 with no bandwidth recorded (a barrier, 0 bytes, torch's fake group)" in text.splitlines()


def test_staleness_gauges_while_a_rank_waits_in_a_counts_only_window(job: Path) -> None:
    from hp_otel.spans import schema

    gauges = _result(job, 0)["gauges"]
    waiting, after = gauges["waiting"], gauges["after"]
    print(json.dumps(gauges, indent=1))
    # read at 2 x DELAY_S into an all_reduce rank 1 joins after 4 x DELAY_S
    assert [p["value"] for p in waiting[schema.METRIC_IN_FLIGHT]] == [1]
    (oldest,) = waiting[schema.METRIC_OLDEST_IN_FLIGHT]
    assert 1.5 * bw.DELAY_S <= oldest["value"] <= 4 * bw.DELAY_S + 1.0
    assert (
        oldest["attributes"][schema.COLLECTIVE_OP] == "all_reduce" and schema.COLLECTIVE_GROUP in oldest["attributes"]
    )
    (since,) = waiting[schema.METRIC_SINCE_COMPLETION]
    assert since["value"] >= 1.5 * bw.DELAY_S
    assert [p["value"] for p in after[schema.METRIC_IN_FLIGHT]] == [0]
    assert after[schema.METRIC_OLDEST_IN_FLIGHT] == []
    assert after[schema.METRIC_SINCE_COMPLETION][0]["value"] < 1.0
