"""FSDP2 (`fully_shard`) on each block and the root: every all_gather and reduce_scatter it
issues, with the module whose parameters it moves (`hp_otel.collective.param.module`).

One process on torch's fake process group (rank 0 of 2); under torchrun, init the group with
"nccl" (or "gloo") instead and build the mesh the same way:

    .venv/bin/python examples/fsdp2.py
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from hp_otel import CommDebugMode


class Model(nn.Module):
    def __init__(self, dim: int = 16, layers: int = 2) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim)) for _ in range(layers)
        )
        self.head = nn.Linear(dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = x + layer(x)
        return self.head(x)


def shard(model: Model, mesh) -> Model:
    """The plan: one FSDP unit per block (all-gathered just before it runs), the rest in the root's."""
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def main() -> None:
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    torch.manual_seed(0)
    model = shard(Model(), init_device_mesh("cpu", (2,)))

    with CommDebugMode(module=model) as mode:
        model(torch.randn(8, 16)).sum().backward()

    print(mode.get_comm_counts(normalized=True))
    collectives = [s for s in mode.get_finished_spans() if s.attributes["hp_otel.call.kind"] == "collective"]
    for span in sorted(collectives, key=lambda s: s.start_time):  # in issue order
        attributes = span.attributes
        print(
            f"{attributes['hp_otel.phase']:9} {span.name:15} params of {attributes['hp_otel.collective.param.module']}"
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
