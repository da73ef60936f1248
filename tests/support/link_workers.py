"""Per-rank body of the gloo jobs whose span links must resolve (test_links_gloo.py).

Each rank runs two steps under `hp_otel.step`, issuing all-reduces on the world group and on a
group of its own half (ranks [0, 1] and [2, 3] of 4; the world is the only group of 2), and
writes its spans file."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

import hp_otel
from hp_otel import CommDebugMode
from hp_otel.workloads.process_groups import init_gloo


def linked_steps_worker(rank: int, world_size: int, port: int, out_dir: str) -> None:
    os.environ["HP_OTEL_RUN_ID"] = "links-run"
    init_gloo(rank, world_size, port)
    try:
        halves = [dist.new_group(list(range(i, i + 2))) for i in range(0, world_size, 2)] if world_size > 2 else []
        mine = halves[rank // 2] if halves else None
        mode = CommDebugMode()
        for step in range(2):
            with hp_otel.step(step, rank=rank), mode:
                t = torch.ones(4)
                dist.all_reduce(t)
                if mine is not None:
                    dist.all_reduce(t, group=mine)
                dist.all_reduce(t)
            mode.write_spans(os.path.join(out_dir, f"spans_rank{rank}_step{step}.json"))
        dist.barrier()
    finally:
        dist.destroy_process_group()
