"""Migrating from torch's CommDebugMode: change one import, keep every line.

torch's MLPModule (net1 column-, net2 row-parallel) on torch's fake process group, rank 0
of 2; the window also holds a `dist.barrier()`:

    .venv/bin/python examples/migrate_from_torch.py
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.testing._internal.distributed.fake_pg import FakeStore

from hp_otel.testing import assert_collective_counts
from hp_otel.torch import CommDebugMode  # was: from torch.distributed.tensor.debug import CommDebugMode


class MLPModule(nn.Module):  # as torch's tests define it
    def __init__(self) -> None:
        super().__init__()
        self.net1 = nn.Linear(10, 16)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net2(self.relu(self.net1(x)))


dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
mesh = init_device_mesh("cpu", (2,))
model = parallelize_module(MLPModule(), mesh, {"net1": ColwiseParallel(), "net2": RowwiseParallel()})
x = torch.randn(4, 10, requires_grad=True)

comm_mode = CommDebugMode()
with comm_mode:
    model(x).sum().backward()
    dist.barrier()

# Every line written against torch 2.13's CommDebugMode keeps working, with torch's types:
all_reduce = torch.ops.c10d_functional.all_reduce
assert comm_mode.get_comm_counts() == {all_reduce: 2}  # the barrier is not one of torch's counted ops
assert comm_mode.get_comm_counts()[torch.ops.c10d_functional.reduce_scatter_tensor] == 0  # no KeyError
assert comm_mode.get_total_counts() == 2
assert dict(comm_mode.comm_module_counts["MLPModule.net1"]["backward"]) == {all_reduce: 1}
assert dict(comm_mode.comm_module_counts["MLPModule.net2"]["forward"]) == {all_reduce: 1}
assert comm_mode.get_sharding_info()["MLPModule.net1.weight"] == (torch.distributed.tensor.Shard(0),)
print(comm_mode.generate_comm_debug_tracing_table(noise_level=0))  # torch's table, torch's levels 0-3

# What you gain: the same window is also an hp_otel.CommDebugMode (comm_mode.otel), which
# counts the barrier too, kept apart so torch-shaped counts stay torch's:
assert comm_mode.get_extra_comm_counts() == {torch.ops.c10d.barrier: 1}
assert comm_mode.get_total_counts(include_extra=True) == 3
assert_collective_counts(comm_mode.otel, {"all_reduce": 2, "barrier": 1}, normalized=True)
for span in comm_mode.get_finished_spans():  # OpenTelemetry spans: modules, ops and collectives
    if span.attributes["hp_otel.call.kind"] == "collective":
        print(
            span.name, span.attributes["hp_otel.phase"], span.attributes.get("hp_otel.collective.input.size"), "bytes"
        )
dist.destroy_process_group()
