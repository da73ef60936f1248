"""The two ways a window sees collectives: Python kernels on the collective ops' BackendSelect
key (the default) and the dispatch mode (`HP_OTEL_TORCH_COLLECTIVE_HOOK=dispatch`, the fallback).

Every pattern is checked against the independent referee (a TorchDispatchMode of the
tests' own) under both hooks; the rest of the suite runs on the default (kernels).  A
`torch.compile(fullgraph=True)` function that calls a functional collective keeps
running compiled inside a window, and its collective is counted.
"""

from __future__ import annotations

import pytest
import test_backward_attribution
import test_completion
import test_fsdp
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from referee import Referee
from torch import nn
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

import hp_otel
from hp_otel import CommDebugMode
from hp_otel.sources.pytorch import dtensor as torch_dtensor
from hp_otel.sources.pytorch import kernels as torch_kernels

HOOKS = {"kernels": torch_dtensor.KERNELS, "dispatch": torch_dtensor.DISPATCH_MODE}


@pytest.fixture(params=sorted(HOOKS))
def hook(request, monkeypatch) -> str:
    monkeypatch.setenv(torch_dtensor.HOOK_ENV, request.param)
    assert torch_dtensor.collective_hook() == HOOKS[request.param]
    return HOOKS[request.param]


def test_default_is_the_kernels_and_bad_values_are_refused(monkeypatch) -> None:
    monkeypatch.delenv(torch_dtensor.HOOK_ENV, raising=False)
    assert torch_kernels.available()
    assert torch_dtensor.collective_hook() == "kernels"
    monkeypatch.setenv(torch_dtensor.HOOK_ENV, "dispatch")
    assert torch_dtensor.collective_hook() == "dispatch_mode"
    monkeypatch.setenv(torch_dtensor.HOOK_ENV, "modes")
    with pytest.raises(ValueError, match="HP_OTEL_TORCH_COLLECTIVE_HOOK='modes': allowed values are"):
        torch_dtensor.collective_hook()


def test_window_in_inference_mode_sees_collectives(fake_world, monkeypatch) -> None:
    """Inference mode turns autograd and ADInplaceOrView off, not BackendSelect: the kernels still see."""
    monkeypatch.delenv(torch_dtensor.HOOK_ENV, raising=False)
    with torch.inference_mode(), CommDebugMode() as mode:
        assert _get_current_dispatch_mode_stack() == []
        dist.all_reduce(torch.ones(2))
    assert mode.get_comm_counts() == {"c10d.allreduce_": 1}


def test_kernel_path_installs_no_dispatch_mode_and_makes_its_libraries_once(fake_world, monkeypatch) -> None:
    monkeypatch.setenv(torch_dtensor.HOOK_ENV, "kernels")
    # from no kept hooks: an earlier test's back-to-back windows keep the kernels until uninstall()
    hp_otel.uninstall()
    with CommDebugMode():
        assert _get_current_dispatch_mode_stack() == []
        dist.all_reduce(torch.ones(2))
        libraries = dict(torch_kernels._libraries)
        assert torch_kernels.registered() and libraries
    assert not torch_kernels.registered()  # the window was the last user (tests/sources/pytorch/test_inactive.py)
    with CommDebugMode() as mode:
        dist.all_reduce(torch.ones(2))
    assert {k: id(v) for k, v in torch_kernels._libraries.items()} == {k: id(v) for k, v in libraries.items()}
    assert mode.get_comm_counts() == {"c10d.allreduce_": 1}
    dist.all_reduce(torch.ones(2))  # outside a window: torch's own kernels
    assert mode.get_comm_counts() == {"c10d.allreduce_": 1}


class _Linear2(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


def _eager_and_direct_calls() -> None:
    group = dist.group.WORLD
    t = torch.ones(4)
    dist.all_reduce(t)
    dist.broadcast(t, src=0)
    dist.barrier()
    dist.all_gather([torch.empty(4), torch.empty(4)], t)
    dist.all_gather_into_tensor(torch.empty(8), t)
    dist.reduce_scatter_tensor(torch.empty(2), t)
    group.allreduce([t]).wait()  # a ProcessGroup method
    out = torch.ops._c10d_functional.all_reduce(t, "sum", group.group_name)
    torch.ops._c10d_functional.wait_tensor(out)
    funcol.all_gather_tensor(t, 0, group).sum()  # an AsyncCollectiveTensor read by an op


def _functional_autograd() -> None:
    x = torch.ones(4, requires_grad=True)
    gathered = funcol.all_gather_tensor_autograd(x, 0, dist.group.WORLD)
    gathered = funcol.wait_tensor(gathered)
    gathered.sum().backward()  # backward: a reduce_scatter run by the C++ autograd node


def _implicit_redistribute() -> None:
    """DTensor redistributes inputs inside its own dispatch (autograd and ADInplaceOrView off there)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    x = distribute_tensor(torch.ones(8, 4), mesh, [Shard(0)])
    z = distribute_tensor(torch.ones(8, 4), mesh, [Shard(1)])
    w = distribute_tensor(torch.ones(4, 8, requires_grad=True), mesh, [Shard(0)])
    (x + z).to_local()
    (x @ w).sum().backward()


def _distribute_tensor() -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    x = distribute_tensor(torch.ones(8, 4), mesh, [Shard(0)])  # its scatter
    x.redistribute(mesh, [Replicate()]).to_local().sum()


_PATTERNS = {
    "eager_and_direct": _eager_and_direct_calls,
    "functional_autograd": _functional_autograd,
    "distribute_tensor": _distribute_tensor,
    "implicit_redistribute": _implicit_redistribute,
}


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("pattern", sorted(_PATTERNS))
def test_pattern_counts_match_referee(fake_world, hook, pattern) -> None:
    referee = Referee()
    with CommDebugMode() as mode, referee:
        _PATTERNS[pattern]()
    assert referee.counts, "the pattern issued no collective"
    assert mode.get_comm_counts() == dict(referee.counts)
    assert mode.get_callback_error_counts() == {}


@pytest.fixture
def gloo_world_of_one():
    """DDP needs a backend whose work futures carry tensors (the fake group's carry None).
    The session's fake world, if up, is put back afterwards."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    fake_size = dist.get_world_size() if dist.is_initialized() else 0
    if fake_size:
        assert dist.get_backend() == "fake"
        dist.destroy_process_group()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
        if fake_size:
            dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=fake_size)


def test_ddp_counts_match_referee(gloo_world_of_one, hook) -> None:
    torch.manual_seed(0)
    referee = Referee()
    with CommDebugMode() as mode, referee:
        model = nn.parallel.DistributedDataParallel(_Linear2())  # its parameter broadcast
        model(torch.ones(3, 4)).sum().backward()  # the C++ reducer's bucket all_reduce
    assert referee.counts["c10d.allreduce_"] >= 1, referee.counts
    assert mode.get_comm_counts() == dict(referee.counts)
    assert mode.get_callback_error_counts() == {}


# The pattern tests of other files, under both hooks (the rest of the suite runs the default).


@pytest.mark.filterwarnings("ignore:Full backward hook")
@pytest.mark.parametrize("sequence_parallel", [False, True], ids=["tp", "tp_sp"])
def test_transformer_attribution_under_both_hooks(fake_world, hook, sequence_parallel) -> None:
    test_backward_attribution.test_transformer_counts_match_referee_and_torch(fake_world, sequence_parallel)
    test_backward_attribution.test_backward_spans_follow_the_node_rule(fake_world, sequence_parallel)


def test_reused_module_under_both_hooks(fake_world, hook) -> None:
    test_backward_attribution.test_reused_module_and_unused_branch_match_referee(fake_world)


def test_fsdp_under_both_hooks(fake_world, hook) -> None:
    test_fsdp.test_fully_shard_collectives_and_their_modules(fake_world)


def test_completion_under_both_hooks(tp_mlp, hook) -> None:
    test_completion.test_functional_collectives_end_at_their_wait(tp_mlp)
    test_completion.test_watchdog_probe_is_done_when_dtensor_reads_the_result(tp_mlp)


def test_compiled_fullgraph_runs_compiled_in_and_after_a_window(fake_world, monkeypatch) -> None:
    import torch._dynamo

    monkeypatch.delenv(torch_dtensor.HOOK_ENV, raising=False)  # the default: kernels
    graph_calls = []

    def counting_backend(gm, example_inputs):  # dynamo's graph, run as is; counts its runs
        def run(*args):
            graph_calls.append(1)
            return gm.forward(*args)

        return run

    group_name = dist.group.WORLD.group_name

    @torch.compile(fullgraph=True, backend=counting_backend)
    def reduced_sin(x):
        y = torch.ops._c10d_functional.all_reduce(x, "sum", group_name)
        return torch.ops._c10d_functional.wait_tensor(y).sin()

    x = torch.ones(4)
    expected = reduced_sin(x)  # compiled outside any window
    assert graph_calls == [1]
    with CommDebugMode() as mode:
        inside = reduced_sin(x)
    after = reduced_sin(x)
    torch.testing.assert_close(inside, expected)
    torch.testing.assert_close(after, expected)
    assert len(graph_calls) == 3  # the compiled graph ran inside the window too, not eager code
    assert mode.get_comm_counts() == {"_c10d_functional.all_reduce": 1}
    assert mode.get_callback_error_counts() == {}
    torch._dynamo.reset()


def test_compiled_inside_a_window_counts_the_run_not_the_trace(fake_world, monkeypatch) -> None:
    """Compiling traces the function with fake tensors, through the kernels: not a collective."""
    import torch._dynamo
    from torch._dynamo.backends.debugging import aot_eager

    monkeypatch.delenv(torch_dtensor.HOOK_ENV, raising=False)
    group_name = dist.group.WORLD.group_name
    runs = []

    def counting_aot_eager(gm, example_inputs):  # AOT autograd traces again, with fake tensors
        compiled = aot_eager(gm, example_inputs)

        def run(*args):
            runs.append(1)
            return compiled(*args)

        return run

    @torch.compile(fullgraph=True, backend=counting_aot_eager)
    def reduced_cos(x):
        y = torch.ops._c10d_functional.all_reduce(x, "sum", group_name)
        return torch.ops._c10d_functional.wait_tensor(y).cos()

    with CommDebugMode() as mode:
        out = reduced_cos(torch.ones(4))  # traced by dynamo and AOT autograd, then run, in the window
    torch.testing.assert_close(out, torch.ones(4).cos())  # the fake group's all_reduce leaves x as is
    assert runs == [1]
    assert mode.get_comm_counts() == {"_c10d_functional.all_reduce": 1}
    assert mode.get_callback_error_counts() == {}
    torch._dynamo.reset()


# Ops of the collective namespaces that move no data between ranks.
_NOT_COLLECTIVES = {
    "c10d.check_for_nan",
    "_c10d_functional.wait_tensor",
    "_c10d_functional._wrap_tensor_autograd",
    "_dtensor.mesh_get_process_group",
}


def test_every_collective_op_of_this_torch_is_known() -> None:
    """A collective op a new torch release adds (2.14: `c10d.gather_into_tensor_`) would go unseen."""
    import hp_otel.sources.pytorch.collectives as collectives

    namespaces = ("c10d", "_c10d_functional", "_c10d_functional_autograd", "_dtensor")
    registered = {
        schema.name.replace("::", ".")
        for schema in torch._C._jit_get_all_schemas()
        if schema.name.split("::")[0] in namespaces
    }
    known = {spec.name for spec in collectives.collective_specs().values()}
    assert registered - _NOT_COLLECTIVES - known == set()
    assert "c10d.allreduce_" in known and "_c10d_functional.all_reduce" in known


@pytest.mark.skipif(not hasattr(dist, "gather_single"), reason="dist.gather_single is new in torch 2.14")
def test_gather_single_is_counted(fake_world, hook) -> None:
    """torch 2.14's `gather_single` runs `c10d.gather_into_tensor_`; neither gloo nor the fake group
    implement it, so the call raises — after the hook saw it."""
    inp = torch.ones(2, 3)
    with CommDebugMode() as mode, pytest.raises(RuntimeError, match="does not support gather_single"):
        dist.gather_single(inp, None, 1)
    assert mode.get_comm_counts() == {"c10d.gather_into_tensor_": 1}
