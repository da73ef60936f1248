"""Sampling keeps the same steps on every rank, so a kept step's trace is whole across ranks (issue 30
item 4), proven on 4 real gloo ranks: each rank samples on its own (a ratio sampler, no talk between
ranks), and the test, as the referee, compares what every rank exported."""

from __future__ import annotations

import json

import pytest
import sampling_workers
import torch.multiprocessing as mp

from hp_otel.workloads.process_groups import free_port

pytestmark = pytest.mark.multiprocess

WORLD = 4


def test_four_ranks_keep_the_same_steps_and_each_kept_trace_is_whole(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HP_OTEL_RUN_ID", "sampling-proof")  # the launcher's run id: the same on every rank
    mp.spawn(sampling_workers.sampling_worker, args=(WORLD, free_port(), str(tmp_path)), nprocs=WORLD, join=True)
    ranks = [json.loads((tmp_path / f"sampling_rank{r}.json").read_text()) for r in range(WORLD)]
    kept = ranks[0]["kept"]
    print("\nkept steps on rank 0:", sorted(kept, key=int))
    # a ratio of 0.5 keeps some steps and drops others (fixed run id: the same steps every run)
    assert 0 < len(kept) < sampling_workers.STEPS, kept
    for rank, result in enumerate(ranks):
        assert result["kept"] == kept, (rank, result["kept"], kept)  # the same steps, the same trace ids
        # nothing of a dropped step was exported: every trace a rank sent is a kept step's
        assert set(result["trace_ids"]) == set(kept.values()), rank
        # each kept step's trace holds this rank's all_reduce: the trace is whole across the ranks
        assert result["collective_spans"] == {trace_id: 1 for trace_id in kept.values()}, rank
        # counts are kept for every step, sampled or not
        assert result["calls_counted"] == sampling_workers.STEPS, rank
