"""Per-rank body of the 2-process test against the real hyper-parallel on its torch platform (gloo).

Every scenario runs under CommDebugMode and under the test's own referee
(`hyper_parallel_real.Referee`, wrapping `TorchPlatform`'s collectives and
`torch.distributed`'s functions itself), and asserts that they agree — counts, phases,
per-module forward/backward counts, group sizes, shapes — and on the absolute figures.
Each rank writes what it saw to `$HP_TEST_OUT/torch_rank<r>.json`.
"""

from __future__ import annotations

import contextlib
import json
import os

os.environ["HYPER_PARALLEL_PLATFORM"] = "torch"

import hp_mlp
import torch
import torch.distributed as dist
import torch.nn.functional as F
from hyper_parallel_real import Referee
from torch import nn

from hp_otel.spans import schema

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


def _phase_only(counts: dict, phase: str) -> dict:
    return {m: {phase: p[phase]} for m, p in counts.items() if phase in p}


def _agree(mode, referee: Referee, what: str, module_phases: tuple[str, ...] = ("forward", "backward")) -> dict:
    """hp_otel and the referee agree on counts, phases, modules, group sizes and error status."""
    _eq(mode.get_comm_counts(), referee.counts(), f"{what}: counts")
    spans = sorted(_collective_spans(mode), key=lambda s: s.start_time)
    _eq([s.attributes[schema.COLLECTIVE_NAME] for s in spans], [c["name"] for c in referee.calls], f"{what}: order")
    _eq([s.attributes[schema.PHASE] for s in spans], [c["phase"] for c in referee.calls], f"{what}: phases")
    _eq([s.attributes[schema.COLLECTIVE_GROUP_SIZE] for s in spans], [_group_size(c) for c in referee.calls],
        f"{what}: group sizes")  # fmt: skip
    _eq([s.status.is_ok for s in spans], [c["error"] is None for c in referee.calls], f"{what}: status")
    for phase in module_phases:
        _eq(_phase_only(mode.get_comm_module_counts(), phase), _phase_only(referee.module_counts(), phase),
            f"{what}: per-module {phase} counts")  # fmt: skip
    return {
        "counts": mode.get_comm_counts(),
        "forward": referee.counts("forward"),
        "backward": referee.counts("backward"),
        "modules": mode.get_comm_module_counts(),
        "referee_modules": referee.module_counts(),
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


class Attention(nn.Module):
    def __init__(self, dim: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.q, self.k, self.v = (nn.Linear(dim, dim, bias=False) for _ in range(3))
        self.o = nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        seq = x.shape[0]
        q, k, v = (proj(x).view((seq, self.heads, self.head_dim)).transpose(0, 1) for proj in (self.q, self.k, self.v))
        scores = torch.softmax(torch.matmul(q, k.transpose(1, 2)) / self.head_dim**0.5, dim=-1)
        return self.o(torch.matmul(scores, v).transpose(0, 1).reshape((seq, self.heads * self.head_dim)))


class Block(nn.Module):
    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.attn = Attention(dim)
        self.mlp = TwoLayerMLP(dim, 2 * dim)

    def forward(self, x):
        x = x + self.attn(x)
        return x + self.mlp(x)


class Transformer(nn.Module):
    def __init__(self, layers: int = 2) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Block() for _ in range(layers))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def transformer(rank: int, world: int) -> dict:
    """Two transformer blocks, attention heads and MLP tensor-parallel (q/k/v/fc1 column-, o/fc2 row-wise)."""
    from hyper_parallel import DTensor, init_device_mesh, shard_module
    from hyper_parallel.core.placement_types import Replicate, Shard
    from hyper_parallel.core.shard.sharding_plan import ShardingPlan

    from hp_otel import CommDebugMode

    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    torch.manual_seed(0)
    reference = Transformer()
    model = Transformer()
    model.load_state_dict(reference.state_dict())
    plan, outputs = {}, {}
    for i in range(2):
        for name in ("attn.q", "attn.k", "attn.v", "mlp.fc1"):
            plan[f"layers.{i}.{name}.weight"] = (Shard(0),)
        for name in ("attn.o", "mlp.fc2"):
            plan[f"layers.{i}.{name}.weight"] = (Shard(1),)
            outputs[f"layers.{i}.{name}.output"] = (Replicate(),)
    model = shard_module(
        model, mesh, ShardingPlan(plan=plan, input_plan={"input": (Replicate(),)}, output_plan=outputs)
    )
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
    torch.testing.assert_close(out.to_local(), expected)
    result = _agree(mode, referee, "transformer")
    _eq(result["forward"], {"differentiable_all_reduce": 4})  # attn.o and mlp.fc2 of each layer
    _eq(result["backward"], {"torch.distributed.all_reduce": 4})
    for i in range(2):
        for name in ("attn.o", "mlp.fc2"):
            _eq(result["modules"][f"layers.{i}.{name}"]["forward"], {"differentiable_all_reduce": 1}, name)
    _eq(mode.get_callback_error_counts(), {})
    result["table"] = mode.generate_comm_debug_tracing_table(noise_level=2)
    return result


def all_to_all(rank: int, world: int) -> dict:
    """Shard(0) -> Shard(1): hyper-parallel's differentiable_all_to_all (called with keywords only), fwd and bwd."""
    from hyper_parallel import DTensor, init_device_mesh
    from hyper_parallel.core.placement_types import Shard

    from hp_otel import CommDebugMode

    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    full = torch.arange(32.0).reshape(4, 8)
    local = full.chunk(world, 0)[rank].clone().requires_grad_(True)
    referee = _referee()
    try:
        with CommDebugMode() as mode:
            moved = DTensor.from_local(local, mesh, (Shard(0),)).redistribute(mesh, (Shard(1),))
            moved.to_local().sum().backward()
    finally:
        referee.restore()
    torch.testing.assert_close(moved.to_local(), full.chunk(world, 1)[rank])
    torch.testing.assert_close(local.grad, torch.ones_like(local))
    result = _agree(mode, referee, "all_to_all")
    _eq(result["forward"], {"differentiable_all_to_all": 1})
    _eq(result["backward"], {"torch.distributed.all_to_all_single": 1})
    (call, backward) = referee.calls
    _eq((call["args"], sorted(call["kwargs"])), ((), ["group", "input_data", "output_shape"]), "keywords only")
    spans = sorted(_collective_spans(mode), key=lambda s: s.start_time)
    shapes = [tuple(call["kwargs"]["input_data"].shape), tuple(backward["args"][1].shape)]  # (output, input, ...)
    _eq([s.attributes[schema.COLLECTIVE_INPUT_SHAPE] for s in spans], shapes, "a2a shapes")
    _eq(shapes, [(4, 4), (4, 4)], "a2a shapes")
    _eq(spans[0].attributes[schema.COLLECTIVE_OP], "all_to_all")
    return result


def fully_shard(rank: int, world: int) -> dict:
    """hyper-parallel's FSDP (fully_shard on each Linear and the root), forward and backward."""
    from hyper_parallel import init_device_mesh
    from hyper_parallel.core.fully_shard.api import fully_shard as hp_fully_shard

    from hp_otel import CommDebugMode

    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    torch.manual_seed(0)
    reference = nn.Sequential(nn.Linear(8, 16, bias=False), nn.ReLU(), nn.Linear(16, 4, bias=False))
    model = nn.Sequential(nn.Linear(8, 16, bias=False), nn.ReLU(), nn.Linear(16, 4, bias=False))
    model.load_state_dict(reference.state_dict())
    for unit in (model[0], model[2], model):
        hp_fully_shard(unit, mesh=mesh)
    x = torch.randn(4, 8)  # the same batch on both ranks: the averaged gradient is the unsharded one
    referee = _referee(model)
    try:
        with CommDebugMode(module=model) as mode:
            out = model(x)
            out.sum().backward()
            referee.end_backward()
    finally:
        referee.restore()
    expected = reference(x)
    expected.sum().backward()
    torch.testing.assert_close(out, expected)
    for index in (0, 2):
        grad = model[index].weight.grad
        torch.testing.assert_close(grad.to_local(), reference[index].weight.grad.chunk(world, 0)[rank])
    # Backward: unit "2" reduce-scatters in its post-backward hook; unit "0", whose input needs no gradient,
    # gets no post-backward hook and is reduce-scattered by the root's end-of-backward callback
    # (TorchHSDPSchedulerV2._root_backward_hook -> TorchHSDPStateV2.post_backward): both count for the unit
    # whose state issued them and "(root)" (issue 19 item 3), the callback's with issued_by "".  This referee's
    # backward module stack says otherwise by definition (unit "2"'s full backward hook has run before its
    # post-backward function reduce-scatters), so backward is checked here by hand and, against a referee
    # that names the issuing state itself, in `fully_shard_prefetch`.
    result = _agree(mode, referee, "fully_shard", module_phases=("forward",))
    _eq(
        _phase_only(mode.get_comm_module_counts(), "backward"),
        {
            "0": {"backward": {"torch.distributed.reduce_scatter_tensor": 1}},
            "2": {"backward": {"torch.distributed.reduce_scatter_tensor": 1}},
            "(root)": {"backward": {"torch.distributed.reduce_scatter_tensor": 2}},
        },
    )
    unit0_backward = [
        s
        for s in _collective_spans(mode)
        if s.attributes[schema.COLLECTIVE_MODULE] == "0" and s.attributes[schema.PHASE] == "backward"
    ]
    _eq([s.attributes.get(schema.COLLECTIVE_ISSUED_BY) for s in unit0_backward], [""], "issued by the callback")
    _eq(result["forward"], {"torch.distributed.all_gather_into_tensor": 2})  # one per unit with parameters
    _eq(result["backward"], {"torch.distributed.reduce_scatter_tensor": 2})
    spans = sorted(_collective_spans(mode), key=lambda s: s.start_time)
    # (output, input, ...) for both; the flat shard of 16x8 and 4x16 weights, then their full flat gradients
    referee_in = [tuple(c["args"][1].shape) for c in referee.calls]
    referee_out = [tuple(c["args"][0].shape) for c in referee.calls]
    _eq([s.attributes[schema.COLLECTIVE_INPUT_SHAPE] for s in spans], referee_in, "input shapes")
    _eq([s.attributes[schema.COLLECTIVE_OUTPUT_SHAPE] for s in spans], referee_out, "output shapes")
    _eq((referee_in, referee_out), ([(64,), (32,), (64,), (128,)], [(128,), (64,), (32,), (64,)]), "shapes")
    _eq([s.attributes[schema.COLLECTIVE_REDUCE_OP] for s in spans[2:]], ["avg", "avg"])
    _eq([s.attributes[schema.COLLECTIVE_ASYNC] for s in spans], [False, False, True, True])
    _eq(mode.get_callback_error_counts(), {})
    return result


def fully_shard_prefetch(rank: int, world: int) -> dict:
    """hyper-parallel's fully_shard with explicit forward and backward prefetch (fully_shard_prefetch.py)."""
    from fully_shard_prefetch import check_fully_shard_prefetch

    return check_fully_shard_prefetch(world)


def failing_paths(rank: int, world: int) -> dict:
    """Paths that fail inside hyper-parallel: the error reaches the caller unchanged, a failed collective errs."""
    from hyper_parallel import DTensor, init_device_mesh
    from hyper_parallel.core.placement_types import Partial, Replicate, Shard

    from hp_otel import CommDebugMode

    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    out: dict = {}
    # Partial -> Shard(1): TensorRedistribution._reduce_scatter_along_dev_dim_with_axis uses `self.platform`,
    # which it does not have (the audit's P0 #2): AttributeError before any collective runs.
    errors = []
    for traced in (False, True):
        partial = DTensor.from_local(torch.ones(4, 4), mesh, (Partial(),))
        referee = _referee()
        try:
            with CommDebugMode() if traced else contextlib.nullcontext() as mode:
                partial.redistribute(mesh, (Shard(1),))
        except AttributeError as error:
            errors.append((type(error), str(error)))
        finally:
            referee.restore()
    _eq(len(errors), 2, "both runs raise")
    _eq(errors[0], errors[1], "same error with and without hp_otel")
    _eq(mode.get_total_counts(), 0)
    _eq(referee.calls, [])
    out["partial_to_shard1"] = errors[1][1]
    # A collective that fails inside hyper-parallel: Partial(max) -> Replicate of a complex tensor; hyper-parallel's
    # differentiable_all_reduce runs torch.distributed.all_reduce, which refuses MAX on complex tensors (ValueError,
    # on every rank, before any data moves).
    referee = _referee()
    raised = None
    partial = DTensor.from_local(torch.ones(4, 4, dtype=torch.complex64), mesh, (Partial("max"),))
    try:
        with CommDebugMode() as mode:
            partial.redistribute(mesh, (Replicate(),))
    except ValueError as error:
        raised = error
    finally:
        referee.restore()
    out["all_reduce_complex_max"] = repr(raised)
    assert raised is not None, "MAX over complex should fail"
    (call,) = referee.calls
    assert call["error"] is raised, "hp_otel re-raised the very exception"
    (span,) = _collective_spans(mode)
    _eq(span.status.is_ok, False)
    assert type(raised).__name__ in (span.status.description or ""), span.status.description
    _eq(_agree(mode, referee, "all_reduce")["counts"], {"differentiable_all_reduce": 1})
    return out


def worker(rank: int, world: int, port: int, out_dir: str) -> None:
    from hp_otel.workloads.process_groups import init_gloo

    init_gloo(rank, world, port)
    try:
        results = {"tp_mlp": tp_mlp(rank, world), "transformer": transformer(rank, world),
                   "all_to_all": all_to_all(rank, world), "fully_shard": fully_shard(rank, world),
                   "fully_shard_prefetch": fully_shard_prefetch(rank, world),
                   "failing": failing_paths(rank, world)}  # fmt: skip
        with open(os.path.join(out_dir, f"torch_rank{rank}.json"), "w") as handle:
            json.dump(results, handle, indent=1, default=str)
        dist.barrier()
    finally:
        dist.destroy_process_group()
