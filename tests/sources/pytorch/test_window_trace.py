"""Issue 46 item 5: a plain `CommDebugMode` window (no `hp_otel.step`) is one trace.  On each pattern
that issues collectives outside every module (2 gloo ranks, tests/support/window_trace_workers.py),
every span the window finished has the window's trace id, its roots stay roots (no invented parent,
no parent missing), and every collective the referee's dispatch mode saw has a span."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch.multiprocessing as mp
import window_trace_workers

from hp_otel.workloads.process_groups import free_port

pytestmark = pytest.mark.multiprocess

RANKS = 2


@pytest.fixture(scope="module")
def windows(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """Each rank's windows, one a pattern, from one spawn (the patterns run one after the other)."""
    out = tmp_path_factory.mktemp("window_trace")
    mp.spawn(window_trace_workers.window_trace_worker, args=(RANKS, free_port(), str(out)), nprocs=RANKS, join=True)
    return [json.loads((out / f"window_trace_rank{rank}.json").read_text()) for rank in range(RANKS)]


# the roots of a window, per rank: each was a trace of its own before (5, 6, 3, 2 and 16 trace ids a window)
ROOTS = {"p2p": 5, "manual_all_reduce": 6, "loss_parallel": 3, "ddp": 2, "gpipe": 16}


@pytest.mark.parametrize("pattern", sorted(window_trace_workers.PATTERNS))
def test_a_plain_window_is_one_trace(windows: list[dict[str, Any]], pattern: str) -> None:
    for rank, seen in enumerate(windows):
        window = seen[pattern]
        assert window["referee"], (rank, pattern)  # the pattern issued collectives
        assert window["collective_spans"] == window["referee"], (rank, pattern)
        assert window["traces"] == 1, (rank, pattern, window)
        assert window["roots"] == ROOTS[pattern], (rank, pattern, window)  # the tree kept: several roots
        assert window["missing_parents"] == 0, (rank, pattern, window)


def test_each_window_is_a_trace_of_its_own(windows: list[dict[str, Any]]) -> None:
    """One trace a window, not one a process: the five windows of a rank, and the ranks, differ."""
    ids = [w["trace_id"] for seen in windows for w in seen.values()]
    assert len(set(ids)) == len(ids) == RANKS * len(window_trace_workers.PATTERNS), ids
