"""hyper-parallel's `fully_shard` with explicit prefetch, checked against a referee that names the
issuing state itself: one body for the real framework (hyper_parallel_real_workers.py) and the
stand-in (hyper_parallel_workers.py), run on each rank of a 2-process gloo job."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from hp_otel.spans import schema


def _eq(actual: object, expected: object, what: str = "") -> None:
    assert actual == expected, f"rank {dist.get_rank()} {what}\nactual:   {actual!r}\nexpected: {expected!r}"


def _collective_spans(mode) -> list:
    return [s for s in mode.get_finished_spans() if s.attributes[schema.CALL_KIND] == "collective"]


_C10D_NAMES = {"c10d._allgather_base_": "torch.distributed.all_gather_into_tensor",
               "c10d._reduce_scatter_base_": "torch.distributed.reduce_scatter_tensor"}  # fmt: skip


def check_fully_shard_prefetch(world: int) -> dict:
    """hyper-parallel's fully_shard with explicit prefetch (`set_modules_to_forward_prefetch` /
    `set_modules_to_backward_prefetch`): unit i+1's all_gather is issued from unit i's forward pre-hook
    (`HSDPState.prefetch` -> `unshard`), unit i-1's from unit i's backward pre-hook; each counts, and
    nests, under the unit whose state issued it (issue 19 item 3).  The referee labels every c10d
    collective with the state method running (it wraps `HSDPState.unshard` and
    `TorchHSDPStateV2.post_backward` itself) and the module chains with its own forward hooks."""
    from hyper_parallel import init_device_mesh
    from hyper_parallel.core.fully_shard.api import fully_shard as hp_fully_shard
    from hyper_parallel.core.fully_shard.hsdp_state import HSDPState
    from hyper_parallel.platform.torch.fully_shard.state import TorchHSDPStateV2
    from referee import FsdpGroupReferee
    from span_counts import module_counts_from_spans

    from hp_otel import CommDebugMode

    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Sequential(nn.Linear(8, 8, bias=False), nn.ReLU()) for _ in range(3)))
    units = list(model)
    for unit in units:  # resharded after forward: backward all-gathers again, and prefetches
        hp_fully_shard(unit, mesh=mesh, reshard_after_forward=True)
    hp_fully_shard(model, mesh=mesh)
    for i, unit in enumerate(units):
        if i + 1 < len(units):
            unit.set_modules_to_forward_prefetch([units[i + 1]])
        if i > 0:
            unit.set_modules_to_backward_prefetch([units[i - 1]])
    x = torch.randn(4, 8)
    groups = [(HSDPState, ("unshard",), lambda state: state.cell),
              (TorchHSDPStateV2, ("post_backward",), lambda state: state.cell)]  # fmt: skip
    referee = FsdpGroupReferee(model, groups)
    before = (vars(HSDPState)["unshard"], vars(TorchHSDPStateV2)["post_backward"])
    with referee, CommDebugMode(module=model) as mode:
        model(x).sum().backward()
    assert (vars(HSDPState)["unshard"], vars(TorchHSDPStateV2)["post_backward"]) == before, "restored exactly"
    ours = mode.get_comm_module_counts()
    expected = {m: {p: {_C10D_NAMES[n]: c for n, c in ops.items()} for p, ops in phases.items()}
                for m, phases in referee.group_module_counts().items()}  # fmt: skip
    pairs = set(zip(referee.labels, referee.running, [p for _, p in referee.issued], strict=True))
    assert {("1", "0", "forward"), ("2", "1", "forward")} <= pairs, pairs  # prefetched from another unit's hook
    _eq(ours, expected, "prefetch: per-module counts by issuing state")
    _eq(ours, module_counts_from_spans(mode.get_finished_spans()), "prefetch: counts == span tree")
    issued_by = {(s.attributes[schema.COLLECTIVE_MODULE], s.attributes[schema.PHASE],
                  s.attributes[schema.COLLECTIVE_ISSUED_BY])
                 for s in _collective_spans(mode) if schema.COLLECTIVE_ISSUED_BY in s.attributes}  # fmt: skip
    assert {("1", "forward", "0"), ("2", "forward", "1")} <= issued_by, issued_by
    # backward: unit i-1's all_gather prefetched from unit i's backward pre-hook (its output's node: unit i's ReLU)
    assert {("1", "backward", "2.1"), ("0", "backward", "1.1")} <= issued_by, issued_by
    _eq(mode.get_callback_error_counts(), {})
    return {"modules": ours, "running": referee.running_module_counts(), "issued_by": sorted(issued_by)}
