"""Per-rank programs over torch's fake process group, one rank after the other in one process.

`python fake_rank_programs.py OUT_DIR CASE...` plays, for each case, rank 0 then rank 1 (each a fresh fake
world of 2 with that rank): the same TP MLP forward+backward, except that in CASE
"divergent" rank 1's fc2 all-gathers a tensor of another shape first, and in CASE
"skipping" rank 1 never runs its backward. The fake group returns at once, so divergent
ranks are made without hanging. Each rank writes OUT_DIR/CASE/spans_rank<r>.json.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from opentelemetry.sdk.trace import TracerProvider
from torch.testing._internal.distributed.fake_pg import FakeStore

from hp_otel import CommDebugMode
from hp_otel.export.providers import build_resource
from hp_otel.workloads.tp_mlp import build_tp_mlp, train_step


def _gather_first(rows: int):  # type: ignore[no-untyped-def]
    def hook(module, args) -> None:  # type: ignore[no-untyped-def]
        funcol.all_gather_tensor(torch.ones(rows, 16), 0, dist.group.WORLD).wait()

    return hook


def play(rank: int, out_dir: str, case: str) -> None:
    os.environ["RANK"] = str(rank)
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=2)
    try:
        model = build_tp_mlp(2)
        x = torch.randn(4, 16, requires_grad=True)
        if case == "divergent":
            model.fc2.register_forward_pre_hook(_gather_first(4 if rank == 0 else 3))
        # one provider per rank, as one process per rank would have: its resource names the rank
        provider = TracerProvider(resource=build_resource())
        with CommDebugMode(module=model, tracer_provider=provider, live_spans=False) as mode:
            if case == "skipping" and rank == 1:
                model(x)  # forward only: its backward all_reduce never comes
            else:
                train_step(model, x)
        mode.write_spans(os.path.join(out_dir, f"spans_rank{rank}.json"))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    for case in sys.argv[2:]:
        os.makedirs(os.path.join(sys.argv[1], case))
        for r in (0, 1):
            play(r, os.path.join(sys.argv[1], case), case)
