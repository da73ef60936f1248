"""The design document's MLP (section 3.5) on hyper-parallel: fc1 ColwiseParallel, fc2 RowwiseParallel.

hidden=16, intermediate=32, batch 4; the linears have no bias, as in the design's
table (its `linear` rows list two inputs).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class TwoLayerMLP(nn.Module):
    def __init__(self, hidden: int = 16, intermediate: int = 32) -> None:
        super().__init__()
        self.fc1 = nn.Linear(hidden, intermediate, bias=False)
        self.fc2 = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


def build(world_size: int, seed: int = 0) -> nn.Module:
    import hyper_parallel as hp

    torch.manual_seed(seed)
    mesh = hp.init_device_mesh("cpu", (world_size,))
    return hp.parallelize_module(TwoLayerMLP(), mesh, {"fc1": hp.ColwiseParallel(), "fc2": hp.RowwiseParallel()})


COLLECTIVE = "Collective(differentiable_all_reduce) group_size=2 input_shape=(4, 16) output_shape=(4, 16)"
LINEAR1 = "Op(linear) inputs=[DTensor[4, 16], DTensor[32, 16]] outputs=[DTensor[4, 32]]"
GELU = "Op(gelu) inputs=[DTensor[4, 32]] outputs=[DTensor[4, 32]]"
LINEAR2 = "Op(linear) inputs=[DTensor[4, 32], DTensor[16, 32]] outputs=[DTensor[4, 16]]"
HEADER = ["Type                 Detail", "-" * 80]
# What the real flow gives: the all_reduce runs in fc2's forward hook after `linear`
# exited, so it is a sibling after the op (under Module(fc2) at level 2), not its child.
TABLES = {
    0: [*HEADER, "Collective           " + COLLECTIVE],
    1: [
        *HEADER,
        "Op                   " + LINEAR1,
        "Op                   " + GELU,
        "Op                   " + LINEAR2,
        "Collective           " + COLLECTIVE,
    ],
    2: [
        *HEADER,
        "Module               Module((root)) [enter]",
        "  Module             Module(fc1) [enter]",
        "    Op               " + LINEAR1,
        "  Op                 " + GELU,
        "  Module             Module(fc2) [enter]",
        "    Op               " + LINEAR2,
        "    Collective       " + COLLECTIVE,
    ],
}
