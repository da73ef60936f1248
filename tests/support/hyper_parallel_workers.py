"""Per-rank body of the 2-process hyper-parallel (stand-in) test over real gloo, for every release variant.

Assertions run in the children; torch.multiprocessing.spawn re-raises a failure in the
test with the child's traceback.
"""

from __future__ import annotations

import importlib
import json
import os
import tempfile

import hp_mlp
import torch
import torch.distributed as dist
from fully_shard_prefetch import check_fully_shard_prefetch
from stand_in import RELEASES, hyper_parallel_release

from hp_otel.testing import metric_points


def _eq(actual: object, expected: object) -> None:
    assert actual == expected, f"\nactual:   {actual!r}\nexpected: {expected!r}"


def _slots() -> dict:
    owners = [
        importlib.import_module("hyper_parallel.platform.torch.platform").TorchPlatform,
        importlib.import_module("hyper_parallel.core.dtensor._utils"),
        importlib.import_module("hyper_parallel.core.shard._op_dispatch").OpDispatcher,
    ]
    return {(owner, name): value for owner in owners for name, value in vars(owner).items() if callable(value) or
            isinstance(value, staticmethod)}  # fmt: skip


def _design_mlp(rank: int, world_size: int, release: str) -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from hp_otel import CommDebugMode
    from hp_otel.spans import schema

    model = hp_mlp.build(world_size)
    torch.manual_seed(0)
    reference = hp_mlp.TwoLayerMLP()  # the same initial weights, unsharded
    x = torch.randn(4, 16)
    slots = _slots()
    reader = InMemoryMetricReader()
    with CommDebugMode(module=model, meter_provider=MeterProvider(metric_readers=[reader])) as mode:
        out = model(x)
    torch.testing.assert_close(out.to_local(), reference(x))  # the all_reduce really summed both ranks
    _eq(mode.get_comm_counts(), {"differentiable_all_reduce": 1})
    for level, expected in hp_mlp.TABLES.items():
        _eq(mode.generate_comm_debug_tracing_table(noise_level=level).splitlines(), expected)
    _eq(mode.get_callback_error_counts(), {})
    calls = [(dict(p.attributes), p.value) for p in metric_points(reader, schema.METRIC_CALLS)]
    _eq(
        calls,
        [
            (
                {
                    schema.COLLECTIVE_NAME: "differentiable_all_reduce",
                    schema.COLLECTIVE_OP: "all_reduce",
                    schema.COLLECTIVE_BACKEND: "gloo",  # init_gloo below: init_process_group("gloo")
                    schema.COLLECTIVE_GROUP_SIZE: 2,
                    schema.COLLECTIVE_DTYPE: "torch.float32",
                    schema.PHASE: "forward",
                    schema.MODULE_FQN: "fc2",
                },
                1,
            )
        ],
    )
    _eq(sum(p.value for p in metric_points(reader, schema.METRIC_BYTES)), 4 * 16 * 4)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "dump.json")
        mode.generate_json_dump(path, noise_level=2)
        with open(path) as handle:
            dump = json.load(handle)
    _eq(dump["comm_counts"], {"differentiable_all_reduce": 1})
    _eq(dump["sharding_info"], {"fc1.weight": "Shard(dim=0)", "fc2.weight": "Shard(dim=1)"})
    fc2 = dump["records"][0]["children"][2]
    _eq([c["type"] for c in fc2["children"]], ["op", "collective"])
    _eq(fc2["children"][1]["collective_type"], "differentiable_all_reduce")
    after = _slots()
    _eq(after.keys(), slots.keys())
    assert all(after[k] is v for k, v in slots.items()), f"{release}: not restored"


def _backward(rank: int, world_size: int, release: str) -> None:
    """Backward communicates as in the real release: torch.distributed.nn.functional's all_reduce backward."""
    from hp_otel import CommDebugMode

    model = hp_mlp.build(world_size)
    with CommDebugMode(module=model) as mode:
        model(torch.randn(4, 16)).sum().backward()
    _eq(mode.get_comm_counts(), {"differentiable_all_reduce": 1, "torch.distributed.all_reduce": 1})
    _eq(
        mode.get_comm_module_counts()["fc2"],
        {"forward": {"differentiable_all_reduce": 1}, "backward": {"torch.distributed.all_reduce": 1}},
    )
    _eq(mode.get_callback_error_counts(), {})


def _redistributions(rank: int, world_size: int, release: str) -> None:
    from hyper_parallel.core.dtensor import DTensor, Partial, Replicate, Shard, init_device_mesh
    from hyper_parallel.platform import GroupInfo, get_platform

    from hp_otel import CommDebugMode

    mesh = init_device_mesh("cpu", (world_size,))
    full = torch.arange(16.0).reshape(4, 4)
    row = DTensor.from_local(full.chunk(world_size, 0)[rank], mesh, [Shard(0)])
    partial = DTensor.from_local(full / world_size, mesh, [Partial("sum")])
    info = GroupInfo(group=dist.group.WORLD, rank_size=world_size, group_name="world")
    platform = get_platform()
    with CommDebugMode() as mode:
        torch.testing.assert_close(row.redistribute(mesh, [Replicate()]).to_local(), full)
        torch.testing.assert_close(row.redistribute(mesh, [Shard(1)]).to_local(), full.chunk(world_size, 1)[rank])
        torch.testing.assert_close(partial.redistribute(mesh, [Shard(0)]).to_local(), full.chunk(world_size, 0)[rank])
        gathered, _ = platform.all_gather_into_tensor(torch.full((1, 2), float(rank)), info)
        torch.testing.assert_close(gathered, torch.tensor([[0.0, 0.0], [1.0, 1.0]]))
        summed, _ = platform.all_reduce(torch.ones(2), info)
        torch.testing.assert_close(summed, torch.full((2,), float(world_size)))
        platform.broadcast(torch.ones(2), 0, group=dist.group.WORLD)
        if release != "snapshot":
            functions = (
                importlib.import_module("hyper_parallel.core.dtensor._utils") if release == "newest" else platform
            )
            out, work = functions.differentiable_all_to_all_single_async(torch.full((2,), float(rank)), [1, 1], [1, 1],
                                                                         group=dist.group.WORLD)  # fmt: skip
            work.wait()
            torch.testing.assert_close(out, torch.tensor([0.0, 1.0]))
    expected = {
        "differentiable_all_gather_concat": 1,
        "differentiable_all_to_all": 1,
        "differentiable_reduce_scatter": 1,
        "all_gather_into_tensor": 1,
        "all_reduce": 1,
        "broadcast": 1,
    }
    if release != "snapshot":
        expected["differentiable_all_to_all_single_async"] = 1
    _eq(mode.get_comm_counts(), expected)
    _eq(
        mode.get_comm_counts(normalized=True),
        {
            "all_gather": 2,
            "all_to_all": 2 if release != "snapshot" else 1,
            "reduce_scatter": 1,
            "all_reduce": 1,
            "broadcast": 1,
        },
    )
    _eq(mode.get_callback_error_counts(), {})


def hyper_parallel_worker(rank: int, world_size: int, port: int) -> None:
    from hp_otel.workloads.process_groups import init_gloo

    init_gloo(rank, world_size, port)
    try:
        for release in RELEASES:
            with hyper_parallel_release(release):
                _design_mlp(rank, world_size, release)
                _backward(rank, world_size, release)
                _redistributions(rank, world_size, release)
        with hyper_parallel_release("newest"):  # fully_shard is the same in every variant
            check_fully_shard_prefetch(world_size)
        dist.barrier()  # no rank tears gloo down while its peer still talks to it
    finally:
        dist.destroy_process_group()
