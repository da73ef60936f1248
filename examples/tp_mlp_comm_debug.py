"""What a PyTorch DTensor user writes: trace one training step of a TP MLP.

Run on CPU with two processes:
    torchrun --nproc-per-node 2 examples/tp_mlp_comm_debug.py
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from hp_otel import CommDebugMode
from hp_otel.cli.tp_mlp import build_tp_mlp


def main() -> None:
    dist.init_process_group("gloo")
    world_size = dist.get_world_size()
    model = build_tp_mlp(world_size)
    x = torch.randn(4, 16, requires_grad=True)

    with CommDebugMode(module=model) as mode:
        loss = model(x).sum()
        loss.backward()

    if dist.get_rank() == 0:
        print(mode.get_comm_counts())  # {'_c10d_functional.all_reduce': 2}
        print(mode.get_comm_counts(normalized=True))  # {'all_reduce': 2}
        print(mode.get_comm_module_counts())  # fc2 forward, fc1 backward
        print(mode.generate_comm_debug_tracing_table(noise_level=2))
        mode.generate_json_dump(f"comm_rank{os.environ.get('RANK', 0)}.json")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
