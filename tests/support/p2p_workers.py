"""Per-rank bodies of the point-to-point and pipeline-parallel tests (2 gloo ranks).

Each rank checks hp_otel against the referee's dispatch-mode count and writes what it
saw to `out_dir` for the test to report.
"""

from __future__ import annotations

import json
import os

import torch
import torch.distributed as dist
from referee import Referee
from torch import nn

TAG = 7


def _p2p_calls(rank: int) -> None:
    """Every point-to-point path: eager isend/irecv, batch_isend_irecv, functional isend/irecv/batch."""
    peer = 1 - rank
    group_name = dist.group.WORLD.group_name
    t = torch.full((4, 2), float(rank))
    if rank == 0:
        dist.isend(t, peer, tag=TAG).wait()
    else:
        dist.irecv(t, peer, tag=TAG).wait()
    ops = [dist.P2POp(dist.isend, t, peer, tag=TAG + 1), dist.P2POp(dist.irecv, torch.empty(4, 2), peer, tag=TAG + 1)]
    for work in dist.batch_isend_irecv(ops if rank == 0 else ops[::-1]):
        work.wait()
    functional = torch.ops._c10d_functional
    if rank == 0:
        functional.wait_tensor(functional.isend(t, peer, TAG + 2, group_name))
    else:
        functional.wait_tensor(functional.irecv(torch.empty(4, 2), peer, TAG + 2, group_name))
    kinds = ["isend", "irecv"] if rank == 0 else ["irecv", "isend"]
    for out in functional.batch_p2p_ops(kinds, [peer, peer], [TAG + 3, TAG + 3], [t, torch.empty(4, 2)], group_name):
        functional.wait_tensor(out)


def p2p_worker(rank: int, world_size: int, port: int, out_dir: str) -> None:
    from torch.distributed.tensor.debug import CommDebugMode as TorchCommDebugMode

    from hp_otel import CommDebugMode
    from hp_otel.spans import schema
    from hp_otel.workloads.process_groups import init_gloo

    init_gloo(rank, world_size, port)
    try:
        _p2p_calls(rank)  # warm up (first calls connect)
        dist.barrier()
        referee = Referee()
        with CommDebugMode() as mode, TorchCommDebugMode() as torch_mode, referee:
            _p2p_calls(rank)
        assert mode.get_comm_counts() == dict(referee.counts), (mode.get_comm_counts(), referee.counts)
        assert mode.get_callback_error_counts() == {}
        spans = sorted(
            (s for s in mode.get_finished_spans() if s.attributes[schema.CALL_KIND] == schema.KIND_COLLECTIVE),
            key=lambda s: s.start_time,
        )
        seen = [
            (
                s.attributes[schema.COLLECTIVE_NAME],
                list(s.attributes[schema.COLLECTIVE_PEERS]),
                list(s.attributes[schema.COLLECTIVE_TAGS]),
                s.attributes[schema.COLLECTIVE_BYTES],
            )
            for s in spans
        ]
        result = {
            "ours": mode.get_comm_counts(),
            "referee": dict(referee.counts),
            "torch": {str(k): v for k, v in torch_mode.get_comm_counts().items()},
            "spans": seen,
        }
        with open(os.path.join(out_dir, f"p2p_rank{rank}.json"), "w") as f:
            json.dump(result, f)
        dist.barrier()
    finally:
        dist.destroy_process_group()


class _Stage(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x))


def pipeline_worker(rank: int, world_size: int, port: int, out_dir: str) -> None:
    """A 2-stage GPipe schedule (torch.distributed.pipelining), 4 microbatches, one stage per rank."""
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    from hp_otel import CommDebugMode
    from hp_otel.spans import schema
    from hp_otel.workloads.process_groups import init_gloo

    init_gloo(rank, world_size, port)
    try:
        torch.manual_seed(0)
        stage_module = _Stage()
        microbatches = 4
        stage = PipelineStage(stage_module, rank, world_size, torch.device("cpu"), input_args=(torch.randn(2, 16),))
        schedule = ScheduleGPipe(stage, microbatches, loss_fn=lambda out, target: ((out - target) ** 2).mean())
        x, target = torch.randn(8, 16), torch.randn(8, 16)

        def step() -> None:
            if rank == 0:
                schedule.step(x)
            else:
                schedule.step(target=target, losses=[])

        step()  # warm up: the first step sets up buffers and connections
        dist.barrier()
        referee = Referee(stage_module)
        # (torch's CommDebugMode cannot watch this: the stage runs once per microbatch, and its
        # module tracker raises IndexError on a module run twice in one window, pytorch#191392)
        with CommDebugMode(module=stage_module) as mode, referee:
            step()
        assert mode.get_comm_counts() == dict(referee.counts), (mode.get_comm_counts(), referee.counts)
        assert mode.get_callback_error_counts() == {}
        spans = [s for s in mode.get_finished_spans() if s.attributes[schema.CALL_KIND] == schema.KIND_COLLECTIVE]
        peers = sorted({p for s in spans for p in s.attributes.get(schema.COLLECTIVE_PEERS, ())})
        result = {
            "ours": mode.get_comm_counts(normalized=True),
            "ours_by_name": mode.get_comm_counts(),
            "referee": dict(referee.counts),
            "peers": peers,
            "bytes": sorted({s.attributes[schema.COLLECTIVE_BYTES] for s in spans}),
        }
        with open(os.path.join(out_dir, f"pipeline_rank{rank}.json"), "w") as f:
            json.dump(result, f)
        dist.barrier()
    finally:
        dist.destroy_process_group()
