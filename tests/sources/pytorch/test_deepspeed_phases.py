"""DeepSpeed ZeRO 1/2/3 on 2 gloo ranks (issue 44 item 7): the gradient reduction of `engine.backward()`
(or of `loss.backward()`) counts as `backward` and the collectives of `engine.step()` (ZeRO's all_gather
of the updated partitions, its overflow all_reduce) as `optimizer`, as the training loop's own referee
labels them (tests/support/deepspeed_workers.py); before, all of them were `outside`. Every count adds up
to the span tree (`assert_counts_add_up`, in the workers), DeepSpeed is never imported by hp_otel, and the
two engine methods it wraps are DeepSpeed's own objects again once the window closes."""

from __future__ import annotations

import importlib.util
import json

import deepspeed_workers
import pytest
import servers
import torch.multiprocessing as mp

from hp_otel.workloads.process_groups import free_port

pytestmark = pytest.mark.multiprocess

# Per stage, each rank's collectives of one step: (phase, op) -> calls, the referee's (checked equal in the
# test); before this change every one of them but ZeRO-3's forward broadcasts was "outside".
EXPECTED = {
    1: {"backward c10d.allreduce_": 1, "optimizer c10d.allreduce_": 1, "optimizer c10d._allgather_base_": 1},
    2: {"backward c10d.allreduce_": 1, "optimizer c10d.allreduce_": 1, "optimizer c10d._allgather_base_": 1},
    3: {
        "forward c10d.broadcast_": 6,
        "backward c10d._reduce_scatter_base_": 1,
        "optimizer c10d.allreduce_": 1,
        "optimizer c10d._allgather_base_": 4,
    },
}


# "tensor": `loss.backward()`, whose epilogue ZeRO's gradient hooks run inside autograd (ZeRO 1 runs the same
# epilogue as ZeRO 2)
@pytest.mark.parametrize(
    ("stage", "backward"), [(1, "engine"), (2, "engine"), (3, "engine"), (2, "tensor"), (3, "tensor")]
)
def test_zero_gradient_reduction_is_backward_and_the_engine_step_optimizer(stage: int, backward: str, tmp_path) -> None:
    if importlib.util.find_spec("deepspeed") is None:
        servers.missing("DeepSpeed is not installed (the test extra pins it)")
    mp.spawn(
        deepspeed_workers.zero_phases_worker, args=(2, free_port(), str(tmp_path), stage, backward), nprocs=2, join=True
    )
    for rank in range(2):
        seen = json.loads((tmp_path / f"zero{stage}_{backward}_rank{rank}.json").read_text())
        assert seen["ours"] == seen["referee"], seen
        assert seen["referee"] == EXPECTED[stage], seen["referee"]  # the figures docs/attribution.md gives
        optimizer = "DeepSpeedZeroOptimizer_Stage3" if stage == 3 else "DeepSpeedZeroOptimizer"
        # one optimizer span a step, named by DeepSpeed's optimizer (the SGD inside it opens none), and the
        # epilogue's backward span of the root besides the root's own backward call
        assert seen["module_spans"][f"(optimizer) optimizer {optimizer}"] == 1
        assert not any(k.startswith("(optimizer)") and optimizer not in k for k in seen["module_spans"]), seen
        assert seen["module_spans"]["(root) backward DeepSpeedEngine backward"] == 2
        reduced = {k.split(" ", 1)[1]: n for k, n in EXPECTED[stage].items() if k.startswith("backward")}
        step = {k.split(" ", 1)[1]: n for k, n in EXPECTED[stage].items() if k.startswith("optimizer")}
        assert seen["module_counts"]["(root)"]["backward"] == reduced
        assert seen["module_counts"]["(optimizer)"] == {"optimizer": step}
        assert "(outside)" not in seen["module_counts"]
        assert seen["imported_by_window"] is False  # a window before `import deepspeed` did not import it
        assert seen["patched"] == ["_backward_epilogue", "step"] and seen["not_restored"] == [], seen
        assert seen["added"] == []
