"""A recompute counts, in phase recompute, for the modules recomputed and for the calls whose
backward spans hold it (the node that asked for it), as the span tree nests it: every call's
counts add up to the collectives inside it, the root's to the window's.

Non-reentrant checkpointing stops the recomputed forward once backward has what it needs:
in a checkpointed block of two TP MLPs, only mlp1.down's all_reduce is recomputed (mlp2's
recompute stops before its down projection reduces).
"""

from __future__ import annotations

import pytest
import torch
from referee import Referee
from span_counts import assert_counts_add_up, module_counts_from_spans
from torch import nn
from torch.utils.checkpoint import checkpoint

from hp_otel import CommDebugMode


class _MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(8, 16)
        self.down = nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mlp1 = _MLP()
        self.mlp2 = _MLP()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp2(self.mlp1(x))


class _Model(nn.Module):
    def __init__(self, reentrant: bool) -> None:
        super().__init__()
        self.block = _Block()
        self.reentrant = reentrant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(self.block, x, use_reentrant=self.reentrant)


def _tp_model(world: int, reentrant: bool) -> nn.Module:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    torch.manual_seed(0)
    model = _Model(reentrant)
    plan = {f"block.{m}.up": ColwiseParallel() for m in ("mlp1", "mlp2")}
    plan |= {f"block.{m}.down": RowwiseParallel() for m in ("mlp1", "mlp2")}
    return parallelize_module(model, init_device_mesh("cpu", (world,)), plan)


@pytest.mark.parametrize("reentrant", [False, True], ids=["non_reentrant", "reentrant"])
@pytest.mark.filterwarnings("ignore:.*use_reentrant")
def test_recompute_counts_agree_with_span_tree_and_referee(fake_world, reentrant) -> None:
    model = _tp_model(fake_world, reentrant)
    x = torch.randn(4, 8, requires_grad=True)
    referee = Referee(model)
    with CommDebugMode(module=model) as mode, referee:
        model(x).sum().backward()
    ours = mode.get_comm_module_counts()
    assert mode.get_callback_error_counts() == {}
    assert mode.get_comm_counts() == dict(referee.counts)
    assert ours == module_counts_from_spans(mode.get_finished_spans())
    assert ours == referee.module_counts_dict()
    assert_counts_add_up(mode)  # every call's counts are the collectives inside it; the root's, the window's
    recomputed = {fqn: phases["recompute"] for fqn, phases in ours.items() if "recompute" in phases}
    ar = "_c10d_functional.all_reduce"
    # reentrant: the whole block runs again (one all_reduce per down projection), asked for by the
    # checkpoint's node under the root; non-reentrant: stopped early (mlp2.down's all_reduce never
    # runs again), asked for by mlp2.down's node, whose calls hold mlp1.down's recomputed all_reduce
    whole = 2 if reentrant else 1
    assert recomputed == {
        "(root)": {ar: whole},
        "block": {ar: whole},
        "block.mlp1": {ar: 1},
        "block.mlp1.down": {ar: 1},
        "block.mlp2": {ar: 1},
        "block.mlp2.down": {ar: 1},
    }
