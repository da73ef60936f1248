"""A torchrun job that sends every step to an OTLP endpoint: one trace per step across ranks.

A TP MLP (fc1 column-, fc2 row-parallel) trained for a few steps; `hp_otel.configure()` reads
the OTEL_* variables (endpoint, protocol, service name; the reference lists them all) and
puts the rank on every span and series; `hp_otel.step(n)` makes step n one trace on every
rank. Start a receiver (`deploy/`'s collector, Jaeger or Tempo; 4318 is OTLP/HTTP), then:

    OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318 OTEL_SERVICE_NAME=tp-mlp \\
        .venv/bin/torchrun --nproc-per-node 2 examples/torchrun_otlp.py

`TRAIN_STEPS` (default 3) sets the steps.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

import hp_otel


class MLP(nn.Module):
    def __init__(self, hidden: int = 16, intermediate: int = 32) -> None:
        super().__init__()
        self.fc1 = nn.Linear(hidden, intermediate)
        self.fc2 = nn.Linear(intermediate, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


def main() -> None:
    dist.init_process_group("gloo")  # "nccl" on GPUs
    torch.manual_seed(0)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model = parallelize_module(MLP(), mesh, {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    hp_otel.configure()  # OTLP export from OTEL_EXPORTER_OTLP_ENDPOINT; the rank on the resource
    for n in range(int(os.environ.get("TRAIN_STEPS", "3"))):
        with hp_otel.step(n), hp_otel.CommDebugMode(module=model) as mode:
            loss = model(torch.randn(8, 16, requires_grad=True)).pow(2).mean()
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if dist.get_rank() == 0:
            print(f"step {n}: loss {loss.item():.4f}, {mode.get_comm_counts(normalized=True)}", flush=True)
    hp_otel.shutdown()  # flushes the spans and metrics (bounded, even with the endpoint down)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
