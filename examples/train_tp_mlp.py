"""A plain tensor-parallel training loop that knows nothing of hp_otel: run it zero-code.

    .venv/bin/opentelemetry-instrument .venv/bin/torchrun --nproc-per-node 2 examples/train_tp_mlp.py

hp_otel's instrumentor (entry point `opentelemetry_instrumentor`) records every step
between two `optimizer.step()` calls and attributes collectives to the modules of the
model the optimizer trains. `TRAIN_STEPS` (default 5) sets the steps; `TRAIN_LINGER_S`
keeps the ranks alive that long after training (for a Prometheus scrape).
"""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module


class MLP(nn.Module):
    def __init__(self, hidden: int = 16, intermediate: int = 32) -> None:
        super().__init__()
        self.fc1 = nn.Linear(hidden, intermediate)
        self.fc2 = nn.Linear(intermediate, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


def main() -> None:
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model = parallelize_module(MLP(), mesh, {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(int(os.environ.get("TRAIN_STEPS", "5"))):
        loss = model(torch.randn(8, 16)).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    if dist.get_rank() == 0:
        print(f"trained; last loss {loss.item():.4f}", flush=True)
    time.sleep(float(os.environ.get("TRAIN_LINGER_S", "0")))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
