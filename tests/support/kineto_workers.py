"""Per-rank body of the Kineto/HTA test (tests/render/test_kineto_hta.py): a few collectives on
2 gloo ranks under both torch.profiler and CommDebugMode, each writing its own file.

The program is the referee for what ran: each rank issues CALLS, in that order, on a group created
as DeviceMesh creates a mesh dimension's (`group_desc="mesh_tp"`); the all_to_all is uneven.
"""

from __future__ import annotations

import os
import warnings

import torch
import torch.distributed as dist

# what each rank issues: (torch.profiler's cpu op, hp_otel's normalised op)
CALLS = (
    ("c10d::allreduce_", "all_reduce"),
    ("c10d::_allgather_base_", "all_gather"),
    ("c10d::alltoall_base_", "all_to_all"),
)
N = 8
# rows rank r sends to each peer (dim 0); what it receives from each is the peers' column
SPLITS_IN = {0: [1, 3], 1: [2, 2]}
SPLITS_OUT = {r: [SPLITS_IN[peer][r] for peer in (0, 1)] for r in (0, 1)}


def kineto_worker(rank: int, world_size: int, port: int, out_dir: str) -> None:
    from torch.profiler import ProfilerActivity, profile

    from hp_otel import CommDebugMode
    from hp_otel.workloads.process_groups import init_gloo

    warnings.simplefilter("ignore", FutureWarning)
    init_gloo(rank, world_size, port)
    try:
        group = dist.new_group(list(range(world_size)), group_desc="mesh_tp")
        x = torch.ones(N)
        rows_in = torch.ones(sum(SPLITS_IN[rank]), 2)
        rows_out = torch.empty(sum(SPLITS_OUT[rank]), 2)
        with profile(activities=[ProfilerActivity.CPU]) as profiler, CommDebugMode() as mode:
            dist.all_reduce(x, group=group)
            dist.all_gather_into_tensor(torch.empty(world_size * N), x, group=group)
            dist.all_to_all_single(rows_out, rows_in, SPLITS_OUT[rank], SPLITS_IN[rank], group=group)
        profiler.export_chrome_trace(os.path.join(out_dir, f"profiler_rank{rank}.json"))
        mode.write_spans(os.path.join(out_dir, f"spans_rank{rank}.json"))
    finally:
        dist.destroy_process_group()
