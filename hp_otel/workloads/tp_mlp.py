"""The tensor-parallel MLP that the demo, the benchmark and the tests run.

fc1 is column-sharded and fc2 row-sharded (torch's ColwiseParallel/RowwiseParallel),
so one step issues exactly two all_reduce: fc2's forward output (Partial -> Replicate)
and the gradient of fc1's replicated input in backward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class MLP(nn.Module):
    def __init__(self, hidden: int = 16, intermediate: int = 32) -> None:
        super().__init__()
        self.fc1 = nn.Linear(hidden, intermediate)
        self.fc2 = nn.Linear(intermediate, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


def build_tp_mlp(world_size: int, hidden: int = 16, intermediate: int = 32, seed: int = 0) -> nn.Module:
    """An MLP parallelised over a 1-D CPU mesh of the default process group (which must exist)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    torch.manual_seed(seed)
    mesh = init_device_mesh("cpu", (world_size,))
    return parallelize_module(MLP(hidden, intermediate), mesh, {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})


def train_step(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """One forward+backward; returns the loss."""
    loss = model(x).sum()
    loss.backward()
    return loss
