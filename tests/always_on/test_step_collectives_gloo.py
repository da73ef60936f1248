"""A step loop leaves the collectives file `hp-otel ranks` compares: on 4 real gloo ranks under the
always-on instrumentor, each rank's `collectives-rank<R>.json` holds its last sampled steps (a bounded
ring), every collective of them that an independent referee saw, and `ranks` says of those files what
it says of the spans the ranks exported for the same steps."""

from __future__ import annotations

import itertools
import json

import collectives_ring_workers as w
import pytest
import torch.multiprocessing as mp

from hp_otel.analysis import compare_files, report_to_json
from hp_otel.workloads.process_groups import free_port

pytestmark = pytest.mark.multiprocess

WORLD = 4
REFEREE_OPS = {"c10d.allreduce_": 2, "c10d._allgather_base_": 1}


def _without_paths(report: dict) -> dict:  # type: ignore[type-arg]
    for f in report["files"]:
        f.pop("path")
    return report


def test_four_ranks_step_loops_keep_their_last_sampled_steps_for_ranks(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HP_OTEL_RUN_ID", "sampling-proof")  # the same sampled steps on every rank, every run
    mp.spawn(w.ring_worker, args=(WORLD, free_port(), str(tmp_path)), nprocs=WORLD, join=True)
    results = [json.loads((tmp_path / f"ring_rank{r}.json").read_text()) for r in range(WORLD)]
    kept = results[0]["kept"]
    assert len(kept) > w.KEEP, kept  # more steps were sampled than the file keeps: the ring dropped some
    rings = [tmp_path / "collectives" / f"collectives-rank{r}.json" for r in range(WORLD)]
    for rank, (result, ring) in enumerate(zip(results, rings, strict=True)):
        assert result["kept"] == kept and result["faults"] == 0, (rank, result)
        # the referee saw the same collectives in every step, and the step issued what it meant to
        assert all(counts == REFEREE_OPS for counts in result["referee"].values()), result["referee"]
        payload = json.loads(ring.read_text())
        assert payload["resource"]["hp_otel.rank"] == rank and payload["keep"] == w.KEEP
        assert w.KEEP <= len(payload["windows"]) <= 2 * w.KEEP  # appended, rewritten to KEEP at twice that
        windows = payload["windows"][-w.KEEP :]  # the steps kept: the last KEEP sampled, oldest first
        for window, step in zip(windows, kept[-w.KEEP :], strict=True):
            by_kind = [(window["kinds"][k], own) for k, _, _, _, own in window["calls"]]
            assert [kind["hp_otel.collective.window"] for kind, _ in by_kind] == [f"step {step}"] * 3
            ops = [[kind["hp_otel.collective.op"], kind["hp_otel.collective.input.shape"]] for kind, _ in by_kind]
            assert ops == result["issued"][str(step)], (rank, step, ops)
            assert sum(REFEREE_OPS.values()) == len(by_kind)
        # bounded: never more than 2 x KEEP steps (the first size: one step and the header), and
        # rewritten smaller once it held them (the steps alternate two shapes)
        sizes = [s for s in result["sizes"] if s]
        assert max(sizes) < 2 * w.KEEP * sizes[0], sizes
        assert len(kept) <= 2 * w.KEEP or any(b < a for a, b in itertools.pairwise(sizes)), sizes
    from_rings = compare_files([str(r) for r in rings])
    from_spans = compare_files([str(tmp_path / f"spans_rank{r}.json") for r in range(WORLD)])
    assert _without_paths(report_to_json(from_rings)) == _without_paths(report_to_json(from_spans))
    assert from_rings.agree and from_rings.complete and len(from_rings.groups) == 3 * w.KEEP
    assert from_rings.stragglers[0].rank == w.LATE_RANK  # late to every world all_reduce
