"""What a hyper-parallel user writes: trace the forward of the design document's TP MLP.

fc1 is column-sharded and fc2 row-sharded; the one all_reduce (Partial -> Replicate)
runs in fc2's output hook.  `CommDebugMode` picks hyper-parallel by itself when it is
importable (or say `engine="hyper_parallel"`).

Run on CPU with two processes:
    HYPER_PARALLEL_PLATFORM=torch .venv/bin/torchrun --nproc-per-node 2 examples/hyper_parallel_mlp.py [OUT_DIR]
(every rank writes OUT_DIR/hyper_parallel_comm_rank<r>.json; OUT_DIR defaults to hp_otel_out)
(hp_otel's tests run it against their stand-in: PYTHONPATH=tests/stand_ins.)
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from hyper_parallel import ColwiseParallel, RowwiseParallel, init_device_mesh, parallelize_module
from torch import nn

from hp_otel import CommDebugMode


class TwoLayerMLP(nn.Module):
    def __init__(self, hidden: int = 16, intermediate: int = 32) -> None:
        super().__init__()
        self.fc1 = nn.Linear(hidden, intermediate, bias=False)
        self.fc2 = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


def main() -> None:
    dist.init_process_group("gloo")  # before the mesh: hyper-parallel's default backend is hccl
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    model = parallelize_module(TwoLayerMLP(), mesh, {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
    x = torch.randn(4, 16)

    with CommDebugMode(module=model) as mode:
        model(x)

    if dist.get_rank() == 0:
        print(mode.get_comm_counts())  # {'differentiable_all_reduce': 1}
        print(mode.get_sharding_info())  # {'fc1.weight': 'Shard(dim=0)', 'fc2.weight': 'Shard(dim=1)'}
        for level in (0, 1, 2):
            print(mode.generate_comm_debug_tracing_table(noise_level=level))
    out_dir = Path(sys.argv[1] if len(sys.argv) > 1 else "hp_otel_out")
    out_dir.mkdir(parents=True, exist_ok=True)
    mode.generate_json_dump(out_dir / f"hyper_parallel_comm_rank{dist.get_rank()}.json", noise_level=2)
    dist.barrier()  # rank 0 prints first; nobody tears the group down under it
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
