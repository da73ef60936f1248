"""Issue 46: where a collective is credited on patterns users train with, each against a referee of
the test's own (tests/support/attribution_workers.py) on real gloo ranks, and the counts-add-up
invariant (`assert_counts_add_up`, checked inside each worker)."""

from __future__ import annotations

import json

import attribution_workers
import pytest
import torch.multiprocessing as mp

from hp_otel.workloads.process_groups import free_port

pytestmark = pytest.mark.multiprocess


def _run(worker, name: str, ranks: int, tmp_path) -> list[dict]:
    mp.spawn(worker, args=(ranks, free_port(), str(tmp_path)), nprocs=ranks, join=True)
    return [json.loads((tmp_path / f"{name}_rank{rank}.json").read_text()) for rank in range(ranks)]


def test_fsdp_collectives_a_pipeline_schedule_issues_count_for_the_stages(tmp_path) -> None:
    """Item 1: `unshard()` before the first micro-batch and `post_backward()` after the last, called
    by `ScheduleLoopedBFS` outside every module, count for the stage whose parameters move (s0, s2 on
    one rank), named by its path in the traced model (not "(outside)" and FSDP's "(root)")."""
    for seen in _run(attribution_workers.pipeline_fsdp_worker, "pipeline_fsdp", 4, tmp_path):
        assert seen["ours"] == seen["referee"]
        for stage in seen["mine"]:  # before: none for the stages, all for "(outside)"
            assert seen["ours"][stage] == {
                "forward": {"c10d._allgather_base_": 1},
                "backward": {"c10d._reduce_scatter_base_": 1},
            }
        # before: {"(root)": 4}, the same name for both stages
        assert seen["param_modules"] == {seen["mine"][0]: 2, seen["mine"][1]: 2, "": 24}


def test_one_fully_shard_group_over_several_modules_counts_for_each(tmp_path) -> None:
    """Item 2: `fully_shard([model.norm, model.lm_head])`: the group's all_gathers and reduce_scatter
    count for both modules (lm_head holds most of its parameters) and the calls enclosing each."""
    for seen in _run(attribution_workers.multi_module_group_worker, "multi_module", 2, tmp_path):
        assert seen["ours"] == seen["referee"]
        group = {
            "forward": {"c10d._allgather_base_": 1},
            "backward": {"c10d._allgather_base_": 1, "c10d._reduce_scatter_base_": 1},
        }
        assert seen["ours"]["norm"] == seen["ours"]["lm_head"] == group  # before: lm_head had none
        assert seen["param_modules"]["norm, lm_head"] == 3


def test_a_compiled_block_is_listed_once_as_the_user_named_it(tmp_path) -> None:
    """Item 6: `model.layers[i] = torch.compile(block)`: `layers.i` only, not also `layers.i._orig_mod`
    (before: both, the wrapper with the forward all_gather only, the block with all three)."""
    for seen in _run(attribution_workers.compiled_blocks_worker, "compiled_blocks", 2, tmp_path):
        assert seen["ours"] == seen["referee"]
        assert seen["span_modules"] == ["(root)", "layers.0", "layers.1", "out"]


def test_compiled_ddp_bucket_all_reduce_counts_for_the_parameters_module(tmp_path) -> None:
    """Item 4: `torch.compile(DDP(model))`: the bucket all_reduce counts for the module of the parameter
    whose AccumulateGrad issued it and the modules enclosing it, as in eager DDP (before: "(root)" only)."""
    for seen in _run(attribution_workers.compiled_ddp_worker, "compiled_ddp", 2, tmp_path):
        assert seen["buckets"] and all(b.startswith("module.") for b in seen["buckets"])
        assert seen["ours"] == seen["referee"]


def test_replicate_over_tensor_parallel_bucket_counts_for_the_original_parameters_module(tmp_path) -> None:
    """Item 3: 2-D TP × `replicate` (4 ranks): the bucket all_reduce run in the AccumulateGrad of the
    local Parameter replicate put in place of a DTensor parameter counts for the module that owned
    that parameter (fc1, fc2) and the root, in the first window (replicate's lazy init inside it)
    and a later one (before: for no module)."""
    for seen in _run(attribution_workers.replicate_2d_worker, "replicate_2d", 4, tmp_path):
        assert seen["registered"] == ["tok.bias", "tok.weight"]  # fc1's and fc2's are registered by none
        for window in ("first", "later"):
            ours, referee = seen[window]["ours"], seen[window]["referee"]
            assert ours == referee, window

            def buckets(fqn: str, ours: dict = ours) -> int:
                return ours.get(fqn, {}).get("backward", {}).get("c10d.allreduce_", 0)

            # every bucket counts for the root (before: those of fc1's and fc2's stand-ins for none)
            assert buckets("(root)") == seen[window]["buckets"], (window, ours)
            # the first step has one bucket (DDP's first bucket is 1 MB), later steps one a parameter
            owners = [fqn for fqn in ("tok", "fc1", "fc2") if buckets(fqn)]
            assert owners == (["fc1"] if window == "first" else ["tok", "fc1", "fc2"]), (window, ours)
