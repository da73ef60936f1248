"""A tiny net whose collectives run where Lightning's automatic optimization puts them: its forward
all-reduces an activation, and its `sync` layer all-reduces the gradient in backward, so inside
`optimizer.step(closure)` there is a forward and a backward collective to attribute. Shared by the
closure test (tests/sources/pytorch/test_closure_backward.py) and the Lightning callback's worker."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn


class SyncGrad(torch.autograd.Function):
    """Identity forward; its backward all-reduces the gradient (a collective a dispatch mode sees)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


class Sync(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return SyncGrad.apply(x)


class SyncNet(nn.Module):
    """fc1 -> relu -> sync -> fc2, then a forward all_reduce of the output."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 8)
        self.sync = Sync()
        self.fc2 = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc2(self.sync(torch.relu(self.fc1(x))))
        dist.all_reduce(y.detach().clone())  # a forward collective, inside the closure too
        return y
