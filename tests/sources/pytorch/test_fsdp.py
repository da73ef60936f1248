"""FSDP2 (`fully_shard`): every all_gather / reduce_scatter counted, with the module whose
parameters it moves — checked against the dispatch-mode referee (counts) and against
FSDP's own profiler labels (which module), in one process over torch's fake process group.
"""

from __future__ import annotations

import pytest
import torch
from referee import FsdpReferee, Referee, fsdp_collectives_from_profile
from span_counts import module_counts_from_spans

from hp_otel import CommDebugMode
from hp_otel.spans import schema

common_dtensor = pytest.importorskip(
    "torch.testing._internal.distributed._tensor.common_dtensor",
    reason="torch's test Transformer needs the `expecttest` package (pip install expecttest)",
)


def _ours_in_order(mode: CommDebugMode) -> list[tuple[str, str]]:
    spans = [s for s in mode.get_finished_spans() if s.attributes[schema.CALL_KIND] == schema.KIND_COLLECTIVE]
    spans.sort(key=lambda s: s.start_time)
    return [(s.attributes[schema.COLLECTIVE_NAME], s.attributes.get(schema.COLLECTIVE_PARAM_MODULE, "")) for s in spans]


def _split(counts: dict, fsdp: bool) -> dict:
    """Module counts of FSDP's eager c10d collectives only (fsdp=True) or of the others (TP's)."""
    out = {}
    for fqn, phases in counts.items():
        kept = {p: {n: c for n, c in ops.items() if n.startswith("c10d.") == fsdp} for p, ops in phases.items()}
        kept = {p: ops for p, ops in kept.items() if ops}
        if kept:
            out[fqn] = kept
    return out


def check_fsdp_module_counts(mode: CommDebugMode, referee: Referee, fsdp_referee: FsdpReferee, prof) -> None:
    """Issue 19 item 3: an FSDP collective counts for the module whose parameter group issued it and
    the calls enclosing it, both phases (the referee's own labels and hooks); the rest as before;
    the counts are those of the span tree; who ran it is kept in hp_otel.collective.issued_by."""
    ours = mode.get_comm_module_counts()
    assert _split(ours, fsdp=True) == fsdp_referee.module_counts(prof)
    assert _split(ours, fsdp=False) == _split(referee.module_counts_dict(), fsdp=False)
    assert ours == module_counts_from_spans(mode.get_finished_spans())
    issued_by = {
        (sp.attributes[schema.COLLECTIVE_PARAM_MODULE], sp.attributes[schema.COLLECTIVE_ISSUED_BY])
        for sp in mode.get_finished_spans()
        if schema.COLLECTIVE_ISSUED_BY in sp.attributes
    }
    # layers.0's backward all_gather is prefetched from layers.1's pre-backward hook; the root
    # reduce-scatters from its final callback, outside every module's backward work
    assert ("layers.0", "layers.1") in issued_by and ("(root)", "") in issued_by, issued_by
    # set only where someone else issued it: never the module the collective counts for
    same = [sp.attributes[schema.COLLECTIVE_MODULE] for sp in mode.get_finished_spans()
            if schema.COLLECTIVE_ISSUED_BY in sp.attributes
            and sp.attributes[schema.COLLECTIVE_ISSUED_BY] == sp.attributes[schema.COLLECTIVE_MODULE]]  # fmt: skip
    assert same == [], same


def run_fsdp_step(mesh, *, tp: bool = False, hsdp: bool = False) -> None:
    """fully_shard each layer and the root of torch's test Transformer; one forward+backward,
    checked against the referee and the profile.  Runs in this process's fake world."""
    from torch.distributed.fsdp import fully_shard
    from torch.profiler import ProfilerActivity, profile

    torch.manual_seed(0)
    args = common_dtensor.ModelArgs(dropout_p=0.0)
    model = common_dtensor.Transformer(args)
    dp_mesh = mesh
    if tp:
        model = common_dtensor.Transformer.parallelize(model, mesh["tp"], False, local_output_for_attn=True)
        dp_mesh = mesh["dp"]
    for layer in model.layers:
        fully_shard(layer, mesh=dp_mesh)
    fully_shard(model, mesh=dp_mesh)
    tokens = torch.randint(args.vocab_size, (8, 8))
    referee = Referee(model)
    fsdp_referee = FsdpReferee(model)
    from torch.distributed.tensor.debug import CommDebugMode as TorchCommDebugMode

    with (
        profile(activities=[ProfilerActivity.CPU]) as prof,
        CommDebugMode(module=model) as mode,
        TorchCommDebugMode() as torch_mode,
        referee,
        fsdp_referee,
    ):
        model(tokens).sum().backward()

    counts = mode.get_comm_counts()
    assert counts == dict(referee.counts)
    assert counts == {
        str(k).replace("c10d_functional.", "_c10d_functional."): n for k, n in torch_mode.get_comm_counts().items()
    }
    assert mode.get_callback_error_counts() == {}
    check_fsdp_module_counts(mode, referee, fsdp_referee, prof)
    with CommDebugMode(module=model, record_spans=False) as counts_only:  # the same rule without spans
        model(tokens).sum().backward()
    assert counts_only.get_comm_module_counts() == mode.get_comm_module_counts()
    normalized = mode.get_comm_counts(normalized=True)
    assert normalized["all_gather"] >= 3 and normalized["reduce_scatter"] >= 3
    if hsdp:
        assert normalized["all_reduce"] >= 3
    # which module's parameters: the FSDP collectives in issue order, against FSDP's own labels
    ours = [(name, module) for name, module in _ours_in_order(mode) if name.startswith("c10d.")]
    theirs = fsdp_collectives_from_profile(prof)
    assert ours == theirs
    assert {m for _, m in ours} == {"(root)", "layers.0", "layers.1"}
    # backward all_gathers are prefetched: issued while another module's backward runs
    prefetched = [
        s
        for s in mode.get_finished_spans()
        if s.attributes.get(schema.COLLECTIVE_PARAM_MODULE) == "layers.0"
        and s.attributes[schema.PHASE] == "backward"
        and s.attributes[schema.COLLECTIVE_OP] == "all_gather"
    ]
    assert prefetched


@pytest.mark.filterwarnings("ignore:FSDP2-wrapped module", "ignore:Full backward hook")
def test_fully_shard_collectives_and_their_modules(fake_world) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

    before = {name: vars(FSDPParamGroup)[name] for name in ("unshard", "post_backward")}
    run_fsdp_step(init_device_mesh("cpu", (fake_world,)))
    assert all(vars(FSDPParamGroup)[name] is original for name, original in before.items())  # restored exactly


def _two_d_worker(rank: int, kind: str) -> None:
    import warnings

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    warnings.simplefilter("ignore")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
    try:
        if kind == "tp":
            run_fsdp_step(init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp")), tp=True)
        else:  # HSDP: replicate over one mesh dim, shard over the other
            run_fsdp_step(init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard")), hsdp=True)
    finally:
        dist.destroy_process_group()


@pytest.mark.multiprocess  # a process of its own: a 4-rank fake world
@pytest.mark.parametrize("kind", ["tp", "hsdp"])
def test_fsdp_on_a_2d_mesh(kind) -> None:
    import torch.multiprocessing as mp

    mp.spawn(_two_d_worker, args=(kind,), nprocs=1, join=True)


def _gloo_worker(rank: int, world_size: int, port: int) -> None:
    import warnings

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from hp_otel.workloads.process_groups import init_gloo

    warnings.simplefilter("ignore")
    init_gloo(rank, world_size, port)
    try:
        run_fsdp_step(init_device_mesh("cpu", (world_size,)))
    finally:
        dist.destroy_process_group()


@pytest.mark.multiprocess  # two gloo processes
def test_fsdp_collectives_count_for_the_issuing_group_on_two_gloo_ranks() -> None:
    """Issue 19 item 3 on real gloo ranks: prefetched all_gathers and the root's final-callback
    reduce-scatter count (and nest) under the module whose parameter group issued them."""
    import torch.multiprocessing as mp

    from hp_otel.workloads.process_groups import free_port

    mp.spawn(_gloo_worker, args=(2, free_port()), nprocs=2, join=True)


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 8)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class _Stack(torch.nn.Module):
    def __init__(self, depth: int) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(_Block() for _ in range(depth))
        self.head = torch.nn.Linear(8, 4)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def _prefetch_worker(rank: int, world_size: int, port: int) -> None:
    import warnings
    from collections import Counter

    import torch.distributed as dist
    from gloo_workers import _eq
    from referee import FsdpGroupReferee
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from hp_otel.workloads.process_groups import init_gloo

    warnings.simplefilter("ignore")
    init_gloo(rank, world_size, port)
    try:
        mesh = init_device_mesh("cpu", (world_size,))
        torch.manual_seed(0)
        model = _Stack(3)
        layers = list(model.layers)
        for layer in layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        for i, layer in enumerate(layers):  # explicit prefetch: the next layer forward, the previous backward
            if i + 1 < len(layers):
                layer.set_modules_to_forward_prefetch([layers[i + 1]])
            if i > 0:
                layer.set_modules_to_backward_prefetch([layers[i - 1]])
        x = torch.randn(4, 8)
        model(x).sum().backward()  # FSDP's lazy init outside the windows
        referee = FsdpGroupReferee(model)
        with referee, CommDebugMode(module=model) as mode:
            model(x).sum().backward()
        ours = mode.get_comm_module_counts()
        expected = referee.group_module_counts()
        if rank == 0:
            print("referee, by issuing group:", expected)
            print("referee, forward by running module:", referee.running_module_counts())
            print("hp_otel:", ours)
        # the referee saw prefetches from another module's pre-forward and pre-backward hooks
        pairs = set(zip(referee.labels, referee.running, [p for _, p in referee.issued], strict=True))
        assert {("layers.1", "layers.0", "forward"), ("layers.2", "layers.1", "forward")} <= pairs, pairs
        _eq(mode.get_comm_counts(), dict(Counter(name for name, _ in referee.issued)))
        _eq(ours, expected)
        _eq(ours, module_counts_from_spans(mode.get_finished_spans()))
        issued_by = {
            (sp.attributes[schema.COLLECTIVE_PARAM_MODULE], sp.attributes[schema.PHASE],
             sp.attributes[schema.COLLECTIVE_ISSUED_BY])
            for sp in mode.get_finished_spans()
            if schema.COLLECTIVE_ISSUED_BY in sp.attributes
        }  # fmt: skip
        assert {("layers.1", "forward", "layers.0"), ("layers.2", "forward", "layers.1")} <= issued_by, issued_by
        assert {m for m, p, _ in issued_by if p == "backward"} >= {"layers.0", "layers.1"}, issued_by
        assert not [t for t in issued_by if t[0] == t[2]], issued_by  # set only when another module issued it
        with CommDebugMode(module=model, record_spans=False) as counts_only:  # the same rule without spans
            model(x).sum().backward()
        _eq(counts_only.get_comm_module_counts(), ours)
        _eq(mode.get_callback_error_counts(), {})
    finally:
        dist.destroy_process_group()


@pytest.mark.multiprocess  # two gloo processes
def test_explicit_prefetch_counts_for_the_prefetched_module_on_two_gloo_ranks() -> None:
    """Issue 19 item 3 with `set_modules_to_forward_prefetch` / `set_modules_to_backward_prefetch`:
    layer i+1's all_gather issued from layer i's pre-forward hook (and layer i-1's from layer i's
    pre-backward) counts and nests under the prefetched layer, against a referee that wraps
    FSDPParamGroup.unshard / post_backward itself."""
    import torch.multiprocessing as mp

    from hp_otel.workloads.process_groups import free_port

    mp.spawn(_prefetch_worker, args=(2, free_port()), nprocs=2, join=True)
