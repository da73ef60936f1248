"""Real 2-process gloo jobs for `hp-otel diff`: one FSDP2 step, with reshard_after_forward on or off.

Each rank writes its spans into the run's folder (`spans_rank<r>.json`, what `hp-otel diff`
reads) and, beside the folder, the referee's per-module counts and the profiler's list of
whose parameters each FSDP collective moved (independent witnesses for the test).
"""

from __future__ import annotations

import datetime
import json
import os

import torch
import torch.distributed as dist
from referee import Referee, fsdp_collectives_from_profile
from torch import nn

GLOO_TIMEOUT_S = 60


class TwoLayers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(16, 16) for _ in range(2)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x


def fsdp_steps_worker(rank: int, world_size: int, port: int, runs: list[tuple[str, bool]]) -> None:
    """Per (folder, reshard_after_forward): a fresh FSDP2 model, one forward+backward, its files."""
    from torch.distributed.device_mesh import init_device_mesh

    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
    )  # fmt: skip
    timeout = datetime.timedelta(seconds=GLOO_TIMEOUT_S)
    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=timeout)
    mesh = init_device_mesh("cpu", (world_size,))
    for out_dir, reshard_after_forward in runs:
        _fsdp_step(rank, mesh, out_dir, reshard_after_forward)
    dist.barrier()
    dist.destroy_process_group()


def _fsdp_step(rank: int, mesh: object, out_dir: str, reshard_after_forward: bool) -> None:
    """fully_shard each layer (reshard_after_forward as given) and the root; one forward+backward."""
    from torch.distributed.fsdp import fully_shard
    from torch.profiler import ProfilerActivity, profile

    from hp_otel import CommDebugMode

    torch.manual_seed(0)
    model = TwoLayers()
    for layer in model.layers:
        fully_shard(layer, mesh=mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh)
    x = torch.randn(4, 16)
    referee = Referee(model)
    with profile(activities=[ProfilerActivity.CPU]) as prof, CommDebugMode(module=model) as mode, referee:
        model(x).sum().backward()
    os.makedirs(out_dir, exist_ok=True)
    mode.write_spans(os.path.join(out_dir, f"spans_rank{rank}.json"))
    witness = {"module_counts": referee.module_counts_dict(), "fsdp_param_modules": fsdp_collectives_from_profile(prof)}
    with open(f"{out_dir}.referee_rank{rank}.json", "w") as handle:
        json.dump(witness, handle)
