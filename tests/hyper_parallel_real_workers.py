"""Per-rank body of the 2-process test against the real hyper-parallel on its torch platform (gloo).

Every scenario runs under CommDebugMode and under the test's own referee
(`hyper_parallel_real.Referee`, wrapping `TorchPlatform`'s collectives and
`torch.distributed`'s functions itself), and asserts that they agree — counts, phases,
per-module forward/backward counts, group sizes, shapes — and on the absolute figures.
Each rank writes what it saw to `$HP_TEST_OUT/torch_rank<r>.json`.
"""

from __future__ import annotations

import json
import os

os.environ["HYPER_PARALLEL_PLATFORM"] = "torch"

import hp_mlp
import torch
import torch.distributed as dist
import torch.nn.functional as F
from hyper_parallel_real import Referee
from torch import nn

from hp_otel import schema

PLATFORM_NAMES = [
    "differentiable_all_gather_concat",
    "differentiable_all_to_all",
    "differentiable_all_reduce",
    "differentiable_reduce_scatter",
    "differentiable_all_to_all_single",
    "differentiable_all_to_all_single_async",
    "all_reduce",
    "all_gather_into_tensor",
    "reduce_scatter_tensor",
    "broadcast",
]
DIST_NAMES = ["all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor",
              "all_to_all", "all_to_all_single", "broadcast", "scatter", "gather", "reduce", "barrier"]  # fmt: skip


BACKWARD_ALL_REDUCE = "Collective(torch.distributed.all_reduce) group_size=2 input_shape=(4, 16) output_shape=(4, 16)"


def _eq(actual: object, expected: object, what: str = "") -> None:
    assert actual == expected, f"rank {dist.get_rank()} {what}\nactual:   {actual!r}\nexpected: {expected!r}"


def _phase() -> str:
    return "backward" if torch._C._current_graph_task_id() != -1 else "forward"


def _referee(model: nn.Module | None = None) -> Referee:
    from hyper_parallel.platform.torch.platform import TorchPlatform

    referee = Referee(_phase)
    referee.wrap(TorchPlatform, PLATFORM_NAMES)
    referee.wrap(dist, DIST_NAMES, prefix="torch.distributed.")
    if model is not None:
        referee.track_torch_modules(model)
    return referee


def _group_size(call: dict) -> int:
    """The group size of a referee call, from its own arguments (a ProcessGroup, a group_info, or None)."""
    args, kwargs = call["args"], call["kwargs"]
    group = kwargs.get("group", kwargs.get("group_info"))
    if group is None:
        name = call["name"]
        position = {"differentiable_all_reduce": 2, "differentiable_all_gather_concat": 1,
                    "differentiable_reduce_scatter": 4}.get(name)  # fmt: skip
        if position is not None and len(args) > position:
            group = args[position]
        elif name in ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor") and len(args) > 1:
            group = args[1]
    if group is None:
        return dist.get_world_size()
    if hasattr(group, "rank_size"):
        return int(group.rank_size)
    return int(group.size())


def _collective_spans(mode) -> list:
    return [s for s in mode.get_finished_spans() if s.attributes[schema.CALL_KIND] == "collective"]


def _agree(mode, referee: Referee, what: str) -> dict:
    """hp_otel and the referee agree on counts, phases, modules, group sizes and error status."""
    _eq(mode.get_comm_counts(), referee.counts(), f"{what}: counts")
    spans = sorted(_collective_spans(mode), key=lambda s: s.start_time)
    _eq([s.attributes[schema.COLLECTIVE_NAME] for s in spans], [c["name"] for c in referee.calls], f"{what}: order")
    _eq([s.attributes[schema.PHASE] for s in spans], [c["phase"] for c in referee.calls], f"{what}: phases")
    _eq([s.attributes[schema.COLLECTIVE_GROUP_SIZE] for s in spans], [_group_size(c) for c in referee.calls],
        f"{what}: group sizes")  # fmt: skip
    _eq([s.status.is_ok for s in spans], [c["error"] is None for c in referee.calls], f"{what}: status")
    _eq(mode.get_comm_module_counts(), referee.module_counts(), f"{what}: per-module counts")
    return {
        "counts": mode.get_comm_counts(),
        "forward": referee.counts("forward"),
        "backward": referee.counts("backward"),
        "modules": mode.get_comm_module_counts(),
    }


class TwoLayerMLP(nn.Module):
    def __init__(self, hidden: int = 16, intermediate: int = 32) -> None:
        super().__init__()
        self.fc1 = nn.Linear(hidden, intermediate, bias=False)
        self.fc2 = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


def tp_mlp(rank: int, world: int) -> dict:
    """The design's MLP, sharded with shard_module (fc1 column-, fc2 row-parallel), forward and backward."""
    from hyper_parallel import DTensor, init_device_mesh, shard_module
    from hyper_parallel.core.placement_types import Replicate, Shard
    from hyper_parallel.core.shard.sharding_plan import ShardingPlan

    from hp_otel import CommDebugMode

    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    torch.manual_seed(0)
    reference = TwoLayerMLP()
    model = TwoLayerMLP()
    model.load_state_dict(reference.state_dict())
    plan = ShardingPlan(
        plan={"fc1.weight": (Shard(0),), "fc2.weight": (Shard(1),)},
        input_plan={"input": (Replicate(),)},
        output_plan={"fc2.output": (Replicate(),)},
    )
    model = shard_module(model, mesh, plan)
    x = torch.randn(4, 16)
    referee = _referee(model)
    try:
        with CommDebugMode(module=model) as mode:
            out = model(DTensor.from_local(x, mesh, (Replicate(),)))
            out.sum().backward()
            referee.end_backward()
    finally:
        referee.restore()
    expected = reference(x)
    expected.sum().backward()
    torch.testing.assert_close(out.to_local(), expected)  # the all_reduce summed both ranks' partials
    # The backward all_reduce (torch.distributed.nn.functional's) sums the replicated loss's gradient over the
    # ranks: hyper-parallel's own tests scale the loss by 1/repeat_num for that; unscaled, grads are world x.
    torch.testing.assert_close(model.fc2.weight.grad, world * reference.fc2.weight.grad.chunk(world, 1)[rank])
    torch.testing.assert_close(model.fc1.weight.grad, world * reference.fc1.weight.grad.chunk(world, 0)[rank])
    result = _agree(mode, referee, "tp_mlp")
    _eq(result["forward"], {"differentiable_all_reduce": 1})
    _eq(result["backward"], {"torch.distributed.all_reduce": 1})
    _eq(
        mode.get_comm_module_counts(),
        {
            "(root)": {"forward": {"differentiable_all_reduce": 1}, "backward": {"torch.distributed.all_reduce": 1}},
            "fc2": {"forward": {"differentiable_all_reduce": 1}, "backward": {"torch.distributed.all_reduce": 1}},
        },
    )
    tables = {level: mode.generate_comm_debug_tracing_table(noise_level=level).splitlines() for level in (0, 1, 2)}
    # the design's printed examples (section 3.5), forward part; then the backward all_reduce
    design = hp_mlp.TABLES
    _eq(tables[0], [*design[0], "Collective           " + BACKWARD_ALL_REDUCE], "table 0")
    _eq(tables[1], [*design[1], "Op                   Op(sum) inputs=[DTensor[4, 16]] outputs=[DTensor[]]",
                    "Collective           " + BACKWARD_ALL_REDUCE], "table 1")  # fmt: skip
    _eq(tables[2][: len(design[2])], design[2], "table 2")
    _eq(mode.get_sharding_info(), {"fc1.weight": "Shard(dim=0)", "fc2.weight": "Shard(dim=1)"})
    _eq(mode.get_callback_error_counts(), {})
    result["tables"] = {level: mode.generate_comm_debug_tracing_table(noise_level=level) for level in (0, 1, 2, 3)}
    result["sharding"] = mode.get_sharding_info()
    result["errors"] = mode.get_callback_error_counts()
    return result


def worker(rank: int, world: int, port: int, out_dir: str) -> None:
    from hp_otel.demo import init_gloo

    init_gloo(rank, world, port)
    try:
        results = {"tp_mlp": tp_mlp(rank, world)}
        with open(os.path.join(out_dir, f"torch_rank{rank}.json"), "w") as handle:
            json.dump(results, handle, indent=1, default=str)
        dist.barrier()
    finally:
        dist.destroy_process_group()
