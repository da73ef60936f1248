"""What a hyper-parallel user writes: trace forward and backward of the design document's TP MLP.

fc1 is column-sharded and fc2 row-sharded with hyper-parallel's `shard_module`; the one
forward all_reduce (Partial -> Replicate) runs in fc2's output hook, its backward
counterpart (torch.distributed.nn.functional's all_reduce backward) in fc2's backward.
`CommDebugMode` picks hyper-parallel by itself when it is importable (or say
`engine="hyper_parallel"`).

Run on CPU with two processes, hyper-parallel's source on PYTHONPATH (it is not on PyPI);
every rank writes OUT_DIR/hyper_parallel_comm_rank<r>.json (OUT_DIR defaults to hp_otel_out):
    HYPER_PARALLEL_PLATFORM=torch PYTHONPATH=/path/to/hyper-parallel \\
        .venv/bin/torchrun --nproc-per-node 2 examples/hyper_parallel_mlp.py [OUT_DIR]
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from hyper_parallel import DTensor, init_device_mesh, shard_module
from hyper_parallel.core.placement_types import Replicate, Shard
from hyper_parallel.core.shard.sharding_plan import ShardingPlan
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
    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("tp",))
    torch.manual_seed(0)
    plan = ShardingPlan(
        plan={"fc1.weight": (Shard(0),), "fc2.weight": (Shard(1),)},
        input_plan={"input": (Replicate(),)},
        output_plan={"fc2.output": (Replicate(),)},
    )
    model = shard_module(TwoLayerMLP(), mesh, plan)
    x = DTensor.from_local(torch.randn(4, 16), mesh, (Replicate(),))

    with CommDebugMode(module=model) as mode:
        model(x).sum().backward()

    if dist.get_rank() == 0:
        print(mode.get_comm_counts())
        print(mode.get_comm_module_counts())
        print(mode.get_sharding_info())
        for level in (0, 1, 2, 3):
            print(f"--- noise_level={level}")
            print(mode.generate_comm_debug_tracing_table(noise_level=level))
    out_dir = Path(sys.argv[1] if len(sys.argv) > 1 else "hp_otel_out")
    out_dir.mkdir(parents=True, exist_ok=True)
    mode.generate_json_dump(out_dir / f"hyper_parallel_comm_rank{dist.get_rank()}.json", noise_level=2)
    dist.barrier()  # rank 0 prints first; nobody tears the group down under it
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
