"""What a PyTorch DTensor user writes: trace one training step of a TP MLP.

fc1 is column-sharded and fc2 row-sharded (torch's ColwiseParallel / RowwiseParallel), so
one step issues exactly two all_reduce: fc2's forward output (Partial -> Replicate) and the
gradient of fc1's replicated input in backward.

Run on CPU with two processes (every rank writes hp_otel_out/comm_rank<r>.json; pass
another folder as the first argument):
    .venv/bin/torchrun --nproc-per-node 2 examples/tp_mlp_comm_debug.py [OUT_DIR]
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from hp_otel import CommDebugMode


class MLP(nn.Module):
    def __init__(self, hidden: int = 16, intermediate: int = 32) -> None:
        super().__init__()
        self.fc1 = nn.Linear(hidden, intermediate)
        self.fc2 = nn.Linear(intermediate, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


def main(out_dir: Path) -> None:
    dist.init_process_group("gloo")  # "nccl" on GPUs
    torch.manual_seed(0)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model = parallelize_module(MLP(), mesh, {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
    x = torch.randn(4, 16, requires_grad=True)

    with CommDebugMode(module=model) as mode:
        loss = model(x).sum()
        loss.backward()

    if dist.get_rank() == 0:
        print(mode.get_comm_counts())  # {'_c10d_functional.all_reduce': 2}
        print(mode.get_comm_counts(normalized=True))  # {'all_reduce': 2}
        print(mode.get_comm_module_counts())  # fc2 forward, fc1 backward
        print(mode.generate_comm_debug_tracing_table(noise_level=2))
    out_dir.mkdir(parents=True, exist_ok=True)
    mode.generate_json_dump(out_dir / f"comm_rank{dist.get_rank()}.json")  # every rank its own file
    dist.barrier()
    if dist.get_rank() == 0:
        print(f"wrote {out_dir}/comm_rank<r>.json for {dist.get_world_size()} ranks")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "hp_otel_out"))
