"""Workers for tests/sources/pytorch/test_attribution_paths.py (issue 46): where a collective is
credited on patterns users train with, each against a referee of the test's own."""

from __future__ import annotations

import json
import os
from collections import Counter, defaultdict
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from referee import COLLECTIVES
from span_counts import assert_counts_add_up
from torch import nn
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode


class CollectiveLog(TorchDispatchMode):
    """The referee's dispatch mode: every collective op, in order, with a label its caller sets."""

    def __init__(self) -> None:
        super().__init__()
        self.label: list[str] = []  # the innermost label set now ("" none)
        self.seen: list[tuple[str, str]] = []  # (namespace.op, label)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if DTensor in types:
            return NotImplemented
        if (func.namespace, func._schema.name.split("::")[-1]) in COLLECTIVES:
            self.seen.append(
                (f"{func.namespace}.{func._schema.name.split('::')[-1]}", self.label[-1] if self.label else "")
            )
        return func(*args, **(kwargs or {}))


class FsdpGroups:
    """The referee's own view of FSDP2's parameter groups: while entered, `unshard` and `post_backward`
    of `FSDPParamGroup` label each collective issued inside them with every module of the group (by
    `named_modules()` of the traced model) and the group method's phase where autograd is not running
    (a pipeline schedule calls them outside it); its own forward hooks (`CallChains`) give the calls
    enclosing each module's latest call.  Enter it before hp_otel's window."""

    _PHASE: ClassVar[dict[str, str]] = {"unshard": "forward", "post_backward": "backward"}

    def __init__(self, model: nn.Module, log: CollectiveLog, names: dict[int, str] | None = None) -> None:
        self._names = {id(m): fqn or "(root)" for fqn, m in model.named_modules()}
        self._names.update(names or {})  # the test's own names for some modules
        self._log = log
        self._model = model
        self._saved: list[tuple[str, Any]] = []
        self.calls: Any = None

    def __enter__(self) -> FsdpGroups:
        from referee import CallChains
        from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

        self.calls = CallChains(self._model)
        for name in self._PHASE:
            original = vars(FSDPParamGroup)[name]
            self._saved.append((name, original))
            setattr(FSDPParamGroup, name, self._wrap(name, original))
        return self

    def __exit__(self, *exc: Any) -> None:
        from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

        for name, original in self._saved:
            setattr(FSDPParamGroup, name, original)
        self.calls.remove()

    def _wrap(self, method: str, original: Any) -> Any:
        def wrapper(group: Any, *args: Any, **kwargs: Any) -> Any:
            modules = ",".join(self._names[id(m)] for m in group.modules)
            in_autograd = torch._C._current_graph_task_id() != -1
            phase = "backward" if in_autograd else self._PHASE[method]
            # each module's latest call chain (itself alone when not called yet in this window)
            owners = {fqn for m in modules.split(",") for fqn in self.calls.latest.get(m, (m,))}
            self._log.label.append(f"{phase}|{modules}|{','.join(sorted(owners))}")
            try:
                return original(group, *args, **kwargs)
            finally:
                self._log.label.pop()

        return wrapper

    def expected(self, log: CollectiveLog) -> dict[str, dict[str, dict[str, int]]]:
        """Module counts: an FSDP collective for its group's modules and the calls enclosing each, in its
        phase; any other collective, outside every module, for "(outside)" (what these workers run)."""
        counts: dict[str, dict[str, Counter[str]]] = defaultdict(lambda: defaultdict(Counter))
        for name, label in log.seen:
            if not label:
                counts["(outside)"]["outside"][name] += 1
                continue
            phase, _modules, owners = label.split("|")
            for fqn in owners.split(","):
                counts[fqn][phase][name] += 1
        return {f: {p: dict(c) for p, c in v.items()} for f, v in counts.items()}


def _dump(out_dir: str, name: str, rank: int, result: dict[str, Any]) -> None:
    with open(os.path.join(out_dir, f"{name}_rank{rank}.json"), "w") as f:
        json.dump(result, f)


class _Stage(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x))


class _Staged(nn.Module):
    """The model a pipeline is cut from: stage i is `s{i}` (the schedule calls the stages, never this)."""

    def __init__(self, stages: int) -> None:
        super().__init__()
        for i in range(stages):
            self.add_module(f"s{i}", _Stage())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for stage in self.children():
            x = stage(x)
        return x


def pipeline_fsdp_worker(rank: int, world_size: int, port: int, out_dir: str) -> None:
    """Issue 46 item 1: `ScheduleLoopedBFS` on 4 ranks, pipeline 2 × FSDP 2, 2 stages a rank (s0, s2 |
    s1, s3), each stage `fully_shard`ed over its data-parallel pair: the schedule calls `unshard()` before
    the first micro-batch and each group's `post_backward()` and the root's final callback after the
    last, outside every module.  The referee labels each collective with the stage whose FSDP group
    issued it (its own wrappers of the group methods, named by the traced model's `named_modules()`)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.pipelining import PipelineStage, ScheduleLoopedBFS

    from hp_otel import CommDebugMode
    from hp_otel.spans import schema
    from hp_otel.workloads.process_groups import init_gloo

    init_gloo(rank, world_size, port)
    try:
        torch.manual_seed(0)
        pp = world_size // 2
        stages_total = 2 * pp
        model = _Staged(stages_total)
        mesh = init_device_mesh("cpu", (pp, 2), mesh_dim_names=("pp", "dp"))
        pp_rank = mesh.get_local_rank("pp")
        mine = [i for i in range(stages_total) if i % pp == pp_rank]
        stages = []
        for i in mine:
            sub = getattr(model, f"s{i}")
            fully_shard(sub, mesh=mesh["dp"])
            sub.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM
            stages.append(
                PipelineStage(
                    sub,
                    i,
                    stages_total,
                    torch.device("cpu"),
                    group=mesh.get_group("pp"),
                    input_args=(torch.randn(2, 16),),
                )
            )
        schedule = ScheduleLoopedBFS(stages, 4, loss_fn=lambda out, target: ((out - target) ** 2).mean())
        x, target = torch.randn(8, 16), torch.randn(8, 16)

        def step() -> None:
            if pp_rank == 0:
                schedule.step(x)
            elif pp_rank == pp - 1:
                schedule.step(target=target, losses=[])
            else:
                schedule.step()

        step()
        step()
        dist.barrier()
        log = CollectiveLog()
        with FsdpGroups(model, log) as groups, log, CommDebugMode(module=model) as mode:
            step()
        assert mode.get_callback_error_counts() == {}
        ours = mode.get_comm_module_counts()
        expected = groups.expected(log)
        assert_counts_add_up(mode)
        spans = [s for s in mode.get_finished_spans() if s.attributes[schema.CALL_KIND] == schema.KIND_COLLECTIVE]
        params = Counter(s.attributes.get(schema.COLLECTIVE_PARAM_MODULE, "") for s in spans)
        _dump(
            out_dir,
            "pipeline_fsdp",
            rank,
            {
                "ours": ours,
                "referee": expected,
                "param_modules": dict(params),
                "mine": [f"s{i}" for i in mine],
            },
        )
        dist.barrier()
    finally:
        dist.destroy_process_group()


class _Llama(nn.Module):
    """The shape accelerate shards a Llama in: blocks, then the final norm and the head."""

    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(32, 16)
        self.layers = nn.ModuleList([nn.Linear(16, 16) for _ in range(2)])
        self.norm = nn.LayerNorm(16)
        self.lm_head = nn.Linear(16, 64)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok(tokens)
        for layer in self.layers:
            h = torch.relu(layer(h))
        return self.lm_head(self.norm(h))


def multi_module_group_worker(rank: int, world_size: int, port: int, out_dir: str) -> None:
    """Issue 46 item 2: `fully_shard([model.norm, model.lm_head])` (one group over two modules, as
    accelerate does for a Llama's last modules), each block and the root sharded too; one step."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from hp_otel import CommDebugMode
    from hp_otel.workloads.process_groups import init_gloo

    init_gloo(rank, world_size, port)
    try:
        torch.manual_seed(0)
        model = _Llama()
        mesh = init_device_mesh("cpu", (world_size,))
        for layer in model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard([model.norm, model.lm_head], mesh=mesh)
        fully_shard(model, mesh=mesh)
        model.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM
        tokens = torch.randint(32, (4, 8))
        model(tokens).sum().backward()
        log = CollectiveLog()
        with FsdpGroups(model, log) as groups, log, CommDebugMode(module=model) as mode:
            model(tokens).sum().backward()
        assert mode.get_callback_error_counts() == {}
        assert_counts_add_up(mode)
        from hp_otel.spans import schema

        spans = [s for s in mode.get_finished_spans() if s.attributes[schema.CALL_KIND] == schema.KIND_COLLECTIVE]
        params = Counter(s.attributes.get(schema.COLLECTIVE_PARAM_MODULE, "") for s in spans)
        _dump(
            out_dir,
            "multi_module",
            rank,
            {
                "ours": mode.get_comm_module_counts(),
                "referee": groups.expected(log),
                "param_modules": dict(params),
            },
        )
        dist.barrier()
    finally:
        dist.destroy_process_group()


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x))


class _Blocks(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([_Block() for _ in range(2)])
        self.out = nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.out(x)


def compiled_blocks_worker(rank: int, world_size: int, port: int, out_dir: str) -> None:
    """Issue 46 item 6: FSDP2 blocks each replaced by `torch.compile(block)` in the model
    (`model.layers[i] = torch.compile(block)`); the referee names block i `layers.i`, as the user did."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from hp_otel import CommDebugMode
    from hp_otel.spans import schema
    from hp_otel.workloads.process_groups import init_gloo

    init_gloo(rank, world_size, port)
    try:
        torch.manual_seed(0)
        model = _Blocks()
        mesh = init_device_mesh("cpu", (world_size,))
        blocks = list(model.layers)
        for i, block in enumerate(blocks):
            fully_shard(block, mesh=mesh)
            model.layers[i] = torch.compile(block, backend="aot_eager")
        fully_shard(model, mesh=mesh)
        model.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM
        x = torch.randn(4, 16)
        for _ in range(2):
            model(x).sum().backward()
        log = CollectiveLog()
        names = {id(block): f"layers.{i}" for i, block in enumerate(blocks)}
        with FsdpGroups(model, log, names) as groups, log, CommDebugMode(module=model) as mode:
            model(x).sum().backward()
        assert mode.get_callback_error_counts() == {}
        assert_counts_add_up(mode)
        modules = sorted(
            {s.attributes[schema.MODULE_FQN] for s in mode.get_finished_spans() if schema.MODULE_FQN in s.attributes}
        )
        _dump(
            out_dir,
            "compiled_blocks",
            rank,
            {
                "ours": mode.get_comm_module_counts(),
                "referee": groups.expected(log),
                "span_modules": modules,
            },
        )
        dist.barrier()
    finally:
        dist.destroy_process_group()


class _Tok(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(32, 16)
        self.layers = nn.ModuleList([nn.Linear(16, 16) for _ in range(2)])
        self.head = nn.Linear(16, 8)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok(tokens)
        for layer in self.layers:
            h = torch.relu(layer(h))
        return self.head(h)


def _called_chain(model: nn.Module, fqn: str) -> list[str]:
    """The modules a call of `fqn` sits in, by name: each ancestor that has a forward (a ModuleList has none)."""
    modules = dict(model.named_modules())
    parts = fqn.split(".") if fqn else []
    chain = ["(root)"]
    for i in range(len(parts)):
        name = ".".join(parts[: i + 1])
        if type(modules[name]).forward is not nn.Module.forward:
            chain.append(name)
    return chain


def compiled_ddp_worker(rank: int, world_size: int, port: int, out_dir: str) -> None:
    """Issue 46 item 4: `torch.compile(DDP(model))`; the referee is a DDP comm hook that all-reduces each
    bucket and names the parameter whose AccumulateGrad runs it (as eager DDP attributes it), the
    expected modules that parameter's module and the modules enclosing it.  No dispatch mode: it would
    make dynamo run the graph eagerly."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from hp_otel import CommDebugMode
    from hp_otel.workloads.process_groups import init_gloo

    init_gloo(rank, world_size, port)
    try:
        torch.manual_seed(0)
        model = _Tok()
        ddp = DDP(model, bucket_cap_mb=1)
        owner = {id(p): name.rpartition(".")[0] for name, p in ddp.named_parameters()}
        buckets: list[str] = []

        def hook(state: object, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
            node = torch._C._current_autograd_node()
            buckets.append(owner.get(id(getattr(node, "variable", None)), "?"))
            return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(lambda fut: fut.value()[0])

        # DDP checks the annotations themselves (this file's are strings: `from __future__ import annotations`)
        hook.__annotations__ = {
            "state": object,
            "bucket": dist.GradBucket,
            "return": torch.futures.Future[torch.Tensor],
        }
        ddp.register_comm_hook(None, hook)
        compiled = torch.compile(ddp, backend="aot_eager")
        tokens = torch.randint(32, (4, 8))
        for _ in range(3):  # DDP rebuilds its buckets in the second iteration
            compiled(tokens).sum().backward()
        buckets.clear()
        with CommDebugMode(module=compiled) as mode:
            compiled(tokens).sum().backward()
        assert mode.get_callback_error_counts() == {}
        assert_counts_add_up(mode)
        expected: dict[str, Counter[str]] = defaultdict(Counter)
        for fqn in buckets:
            for name in _called_chain(ddp, fqn):
                expected[name]["c10d.allreduce_"] += 1
        result = {
            "ours": mode.get_comm_module_counts(),
            "referee": {f: {"backward": dict(c)} for f, c in expected.items()},
            "buckets": list(buckets),
        }
        _dump(out_dir, "compiled_ddp", rank, result)
        dist.barrier()
    finally:
        dist.destroy_process_group()


class _TpNet(nn.Module):
    """A plain embedding-like input layer, then a tensor-parallel pair (fc1 column-, fc2 row-wise)."""

    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Linear(8, 16)
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(self.tok(x))))


def storage_chains(model: nn.Module) -> dict[int, list[str]]:
    """Each parameter's storage (data pointer; a DTensor's local shard) -> the calls its module sits
    in, read from the model as `parallelize_module` left it, before `replicate` swaps any parameter."""
    return {
        (p.to_local() if isinstance(p, DTensor) else p).data_ptr(): _called_chain(model, fqn.rpartition(".")[0])
        for fqn, p in model.named_parameters()
    }


def bucket_referee(model: nn.Module, chains: dict[int, list[str]]) -> Any:
    """The referee's module counts (`referee.Referee`), plus what it leaves to no module: a collective
    run in a parameter's AccumulateGrad (DDP's bucket all_reduce) counts, in backward, for the module
    that held that parameter's storage (`chains`) and the modules enclosing it."""
    from referee import Referee

    class _Referee(Referee):
        def _count(self, name: str) -> None:
            node = torch._C._current_autograd_node()
            if node is None or not node.name().endswith("AccumulateGrad"):
                super()._count(name)
                return
            self.counts[name] += 1
            for fqn in chains[node.variable.data_ptr()]:
                self.module_counts[fqn]["backward"][name] += 1

    return _Referee(model)


def replicate_2d_worker(rank: int, world_size: int, port: int, out_dir: str) -> None:
    """Issue 46 item 3: 2-D TP × `replicate` on 4 ranks (dp 2 × tp 2): fc1/fc2 tensor-parallel,
    the model replicated over dp with small buckets.  replicate swaps each DTensor parameter for a
    local Parameter that no module registers, whose AccumulateGrad runs the bucket all_reduce.
    Two windows: the first step (replicate's lazy init inside it), and a later one."""
    from torch.distributed._composable.replicate import replicate
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from hp_otel import CommDebugMode
    from hp_otel.workloads.process_groups import init_gloo

    init_gloo(rank, world_size, port)
    try:
        torch.manual_seed(0)
        model = _TpNet()
        mesh = init_device_mesh("cpu", (2, world_size // 2), mesh_dim_names=("dp", "tp"))
        parallelize_module(model, mesh["tp"], {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
        chains = storage_chains(model)
        replicate(model, device_mesh=mesh["dp"], bucket_cap_mb=0.0001)
        x = torch.randn(4, 8)
        result: dict[str, Any] = {}
        for window in ("first", "later"):
            if window == "later":
                model(x).sum().backward()
            referee = bucket_referee(model, chains)
            with referee, CommDebugMode(module=model) as mode:
                model(x).sum().backward()
            assert mode.get_callback_error_counts() == {}
            assert_counts_add_up(mode)
            assert mode.get_comm_counts() == dict(referee.counts), (mode.get_comm_counts(), referee.counts)
            result[window] = {
                "ours": mode.get_comm_module_counts(),
                "referee": referee.module_counts_dict(),
                "buckets": mode.get_comm_counts().get("c10d.allreduce_", 0),
            }
        result["registered"] = sorted(name for name, _ in model.named_parameters())
        _dump(out_dir, "replicate_2d", rank, result)
        dist.barrier()
    finally:
        dist.destroy_process_group()
