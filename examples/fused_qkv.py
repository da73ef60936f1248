"""Attention with one fused q/k/v projection (as nn.MultiheadAttention's in_proj), tensor-parallel.

A fused projection is one Linear whose output holds q, k and v side by side. Sharded
column-wise it leaves each rank a slice of that output that holds parts of all three,
so splitting it into q, k and v cannot stay local: DTensor gathers it first. The table
shows where: an all_gather under `Op(split)` in the attention module, not under the
projection. The attention's out projection is row-sharded as usual (one all_reduce).
One process, rank 0 of 2 on torch's fake process group, as the README's snippet.
"""

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.testing._internal.distributed.fake_pg import FakeStore

from hp_otel import CommDebugMode


class FusedAttention(nn.Module):
    def __init__(self, dim: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)  # q, k, v in one matmul: nn.MultiheadAttention's in_proj
        self.out = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        batch, seq, dim = q.shape
        q, k, v = (t.reshape(batch, seq, self.heads, dim // self.heads).transpose(1, 2) for t in (q, k, v))
        weights = torch.softmax(q @ k.transpose(-2, -1) / (dim // self.heads) ** 0.5, dim=-1)
        attended = (weights @ v).transpose(1, 2).reshape(batch, seq, dim)
        return self.out(attended)


def parallelize(model: FusedAttention, mesh) -> nn.Module:  # type: ignore[no-untyped-def]
    # use_local_output=False: qkv's output stays a DTensor, so chunk() knows it is sharded
    return parallelize_module(model, mesh, {"qkv": ColwiseParallel(use_local_output=False), "out": RowwiseParallel()})


if __name__ == "__main__":
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    torch.manual_seed(0)
    model = parallelize(FusedAttention(), init_device_mesh("cpu", (2,)))
    x = torch.randn(2, 4, 16, requires_grad=True)

    with CommDebugMode(module=model) as mode:
        model(x).sum().backward()

    print(mode.get_comm_counts(normalized=True))
    print(mode.get_comm_module_counts())
    print(mode.generate_comm_debug_tracing_table(noise_level=3))
    dist.destroy_process_group()
