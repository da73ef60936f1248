"""Workers for tests/sources/pytorch/test_window_trace.py (issue 46 item 5): a plain `CommDebugMode`
window (no `hp_otel.step`) on the patterns that issue collectives outside every module, each in a
window of its own, with the referee's dispatch-mode count beside it.  Each rank writes, per
pattern, the trace ids and parent links of the window's finished spans and both counts."""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from p2p_workers import _p2p_calls
from referee import Referee
from torch import nn


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def _window(model: nn.Module | None, body: Callable[[], None]) -> dict[str, Any]:
    """One plain window around `body` with the referee inside it; what its spans say."""
    from hp_otel import CommDebugMode
    from hp_otel.spans import schema

    referee = Referee()
    with CommDebugMode(module=model) as mode, referee:
        body()
    assert mode.get_callback_error_counts() == {}
    spans = mode.get_finished_spans()
    ids = {s.context.span_id for s in spans}
    collectives = [s for s in spans if s.attributes[schema.CALL_KIND] == schema.KIND_COLLECTIVE]
    return {
        "traces": len({s.context.trace_id for s in spans}),
        "trace_id": f"{spans[0].context.trace_id:032x}" if spans else "",
        "spans": len(spans),
        "roots": sum(1 for s in spans if s.parent is None),
        # a parent no span of the window is (a root made a child of an invented span would be one)
        "missing_parents": sum(1 for s in spans if s.parent is not None and s.parent.span_id not in ids),
        "referee": dict(referee.counts),
        "collective_spans": dict(Counter(s.attributes[schema.COLLECTIVE_NAME] for s in collectives)),
    }


def _loss_parallel(rank: int, world_size: int) -> tuple[nn.Module, Callable[[], None]]:
    """A column-parallel head whose sharded logits go to `loss_parallel`'s cross entropy, outside the model."""
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, loss_parallel, parallelize_module

    mesh = init_device_mesh("cpu", (world_size,))
    model = parallelize_module(_Net(), mesh, {"fc2": ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)})
    x, target = torch.randn(4, 16), torch.randint(16, (4,))

    def body() -> None:
        with loss_parallel():
            F.cross_entropy(model(x), target).backward()

    return model, body


def _gpipe(rank: int, world_size: int) -> tuple[nn.Module, Callable[[], None]]:
    """A GPipe schedule over two stages, one a rank: its sends and receives run outside the stage."""
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    stage_module = _Net()
    stage_module.fc2 = nn.Linear(32, 16)
    stage = PipelineStage(stage_module, rank, world_size, torch.device("cpu"), input_args=(torch.randn(2, 16),))
    schedule = ScheduleGPipe(stage, 4, loss_fn=lambda out, target: ((out - target) ** 2).mean())
    x, target = torch.randn(8, 16), torch.randn(8, 16)

    def body() -> None:
        if rank == 0:
            schedule.step(x)
        else:
            schedule.step(target=target, losses=[])

    return stage_module, body


def _manual_all_reduce(rank: int, world_size: int) -> tuple[nn.Module, Callable[[], None]]:
    """Gradients all-reduced by hand after backward, one call a parameter, outside the model."""
    model = _Net()
    x = torch.randn(4, 16)

    def body() -> None:
        model(x).sum().backward()
        for param in model.parameters():
            dist.all_reduce(param.grad)

    return model, body


def _ddp(rank: int, world_size: int) -> tuple[nn.Module, Callable[[], None]]:
    """DDP with small buckets: each bucket's all_reduce runs in a parameter's AccumulateGrad."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(_Net(), bucket_cap_mb=0.001)
    x = torch.randn(4, 16)

    def body() -> None:
        model(x).sum().backward()

    return model, body


def _p2p(rank: int, world_size: int) -> tuple[None, Callable[[], None]]:
    """Every point-to-point path (p2p_workers), no model: each send and receive is a root."""
    return None, lambda: _p2p_calls(rank)


PATTERNS: dict[str, Callable[[int, int], tuple[Any, Callable[[], None]]]] = {
    "p2p": _p2p,
    "manual_all_reduce": _manual_all_reduce,
    "loss_parallel": _loss_parallel,
    "ddp": _ddp,
    "gpipe": _gpipe,
}


def window_trace_worker(rank: int, world_size: int, port: int, out_dir: str) -> None:
    """Each pattern once to warm up (connections, DDP's bucket rebuild), then once in a window."""
    from hp_otel.workloads.process_groups import init_gloo

    init_gloo(rank, world_size, port)
    try:
        results = {}
        for name, make in PATTERNS.items():
            torch.manual_seed(0)
            model, body = make(rank, world_size)
            body()
            body()
            dist.barrier()
            results[name] = _window(model, body)
            dist.barrier()
        with open(os.path.join(out_dir, f"window_trace_rank{rank}.json"), "w") as f:
            json.dump(results, f)
        dist.barrier()
    finally:
        dist.destroy_process_group()
