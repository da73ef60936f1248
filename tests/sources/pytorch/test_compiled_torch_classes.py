"""`torch.compile(model)` with the window given `model`, for torch's own classes too (issue 32, item 2).

For a class of the user's, dynamo compiles `forward` and runs the model's hooks eagerly; for
one of torch's (`nn.Sequential`, `DistributedDataParallel`: files dynamo skips) the wrapper
compiles a frame that calls the whole module, its hooks inside the graph, and leaves no cache
entry on the class's `forward`.  The call is noted on the wrapper's hooks, found from the
model (`compile_wrappers`), whatever the class: the collectives count for the compiled model
(never for its submodules, whose hooks run in the graph), forward and backward, and no window
recompiles.

Referees: the step run eagerly on a fresh copy under the dispatch-mode referee with its own
forward hooks (the compiled step cannot run under a dispatch mode: dynamo would run it
eagerly), the torch profiler for what the compiled step ran, and for DDP, whose reducer
calls the group from C++ where no dispatch mode sees it, a comm hook of the test's own that
counts each bucket's all_reduce and the phase it runs in.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist
from referee import Referee, collective_counts_from_profile
from torch import nn

import hp_otel
from hp_otel import CommDebugMode
from hp_otel.workloads.process_groups import free_port


class _Wrap(nn.Module):
    """A class of the user's around the model (dynamo compiles its `forward` as a frame of its own)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)


def _around(kind: str, inner: nn.Module) -> nn.Module:
    if kind == "sequential":
        return nn.Sequential(inner)
    if kind == "user":
        return _Wrap(inner)
    return inner


def _dynamo_stats() -> tuple[int, int]:
    """(graph breaks, graphs compiled) since the last `torch._dynamo.reset()` and counters clear."""
    from torch._dynamo.utils import counters

    return sum(counters["graph_break"].values()), counters["stats"]["unique_graphs"]


def _reset_dynamo() -> None:
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()


def _windows(
    model: nn.Module, call: Any, step: Callable[[Any], None], given: Any, windows: int = 3
) -> tuple[list[tuple[dict, dict, dict, Counter]], list[tuple[int, int]]]:
    """Each window's (counts, module counts, callback errors, profiler counts), and dynamo's stats after each."""
    results, stats = [], []
    for _ in range(windows):
        with torch.profiler.profile() as prof, CommDebugMode(module=given) as mode:
            step(call)
        results.append(
            (
                mode.get_comm_counts(),
                mode.get_comm_module_counts(),
                mode.get_callback_error_counts(),
                collective_counts_from_profile(prof),
            )
        )
        stats.append(_dynamo_stats())
    return results, stats


def _tp_model(kind: str) -> nn.Module:
    from hp_otel.workloads.tp_mlp import build_tp_mlp

    return _around(kind, build_tp_mlp(2))


def _tp_step(call: Any) -> None:
    torch.manual_seed(3)
    call(torch.randn(4, 16, requires_grad=True)).sum().backward()


@pytest.mark.usefixtures("fake_world")
@pytest.mark.parametrize("kept", [False, True], ids=["plain", "kept"])
@pytest.mark.parametrize("fullgraph", [True, False], ids=["fullgraph", "breaks_allowed"])
@pytest.mark.parametrize("kind", ["sequential", "user"])
def test_a_compiled_tp_model_counts_for_the_model_whatever_its_class(kind: str, fullgraph: bool, kept: bool) -> None:
    """TP MLP (fake group) inside `nn.Sequential` or a user class, `torch.compile(m, backend="aot_eager")`,
    windows on `m`: its forward all_reduce and its backward one both count for (root)."""
    eager = _tp_model(kind)
    with Referee(eager) as referee:
        _tp_step(eager)
    expected = {"(root)": referee.module_counts_dict()["(root)"]}  # the submodules' hooks run in the graph
    assert expected == {
        "(root)": {"forward": {"_c10d_functional.all_reduce": 1}, "backward": {"_c10d_functional.all_reduce": 1}}
    }

    _reset_dynamo()
    model = _tp_model(kind)
    call = torch.compile(model, backend="aot_eager", fullgraph=fullgraph)
    _tp_step(call)  # compiled before any window
    untraced = _dynamo_stats()
    if kept:
        hp_otel.install()
    try:
        results, stats = _windows(model, call, _tp_step, model)
    finally:
        if kept:
            hp_otel.uninstall()
    assert stats == [untraced] * len(stats), "a window recompiles or breaks the graph"
    for counts, module_counts, errors, profiled in results:
        assert errors == {}
        assert Counter(counts) == referee.counts == profiled
        assert module_counts == expected


@pytest.mark.usefixtures("fake_world")
def test_the_wrapper_given_and_the_model_given_count_alike() -> None:
    """`CommDebugMode(module=torch.compile(seq))` and `CommDebugMode(module=seq)`: the same counts, one
    compiled graph between them."""
    _reset_dynamo()
    model = _tp_model("sequential")
    call = torch.compile(model, backend="aot_eager", fullgraph=True)
    _tp_step(call)
    untraced = _dynamo_stats()
    by_model, _ = _windows(model, call, _tp_step, model, windows=2)
    by_wrapper, stats = _windows(model, call, _tp_step, call, windows=2)
    assert stats[-1] == untraced
    assert [r[1] for r in by_model] == [r[1] for r in by_wrapper]
    assert by_model[-1][1]["(root)"]["backward"] == {"_c10d_functional.all_reduce": 1}


@pytest.mark.usefixtures("fake_world")
def test_an_eager_sequential_beside_a_compiled_one_keeps_its_submodules() -> None:
    """Only the instance that has a wrapper counts as compiled: another `nn.Sequential`, run eagerly in
    the same step, still has its submodules' calls."""
    from hp_otel.workloads.tp_mlp import build_tp_mlp

    _reset_dynamo()
    compiled_part, eager_part = nn.Sequential(build_tp_mlp(2)), nn.Sequential(build_tp_mlp(2, seed=1))
    root = nn.ModuleDict({"compiled": compiled_part, "eager": eager_part})
    call = torch.compile(compiled_part, backend="aot_eager", fullgraph=True)

    def step(_: Any) -> None:
        torch.manual_seed(3)
        eager_part(call(torch.randn(4, 16, requires_grad=True))).sum().backward()

    step(None)
    results, _ = _windows(root, None, step, root, windows=2)
    module_counts = results[-1][1]
    assert results[-1][2] == {}
    assert {fqn for fqn in module_counts if fqn.startswith("compiled")} == {"compiled"}
    assert {"eager", "eager.0", "eager.0.fc1", "eager.0.fc2"} <= set(module_counts)
    assert module_counts["compiled"] == {
        "forward": {"_c10d_functional.all_reduce": 1},
        "backward": {"_c10d_functional.all_reduce": 1},
    }


# --- DDP on two gloo ranks ----------------------------------------------------------------------------


def _counting_comm_hook(seen: Counter) -> Callable[..., Any]:
    """DDP's default bucket all_reduce (sum, then divided by the world size), counted by phase."""

    def hook(state: Any, bucket: Any) -> torch.futures.Future[torch.Tensor]:
        seen["backward" if torch._C._current_graph_task_id() != -1 else "forward"] += 1
        buffer = bucket.buffer().div_(dist.get_world_size())
        return dist.all_reduce(buffer, async_op=True).get_future().then(lambda fut: fut.value()[0])

    # DDP checks the annotations as objects (this file's are postponed, i.e. strings)
    hook.__annotations__.update(bucket=dist.GradBucket, **{"return": torch.futures.Future[torch.Tensor]})
    return hook


def _ddp_worker(rank: int, port: int) -> None:
    from hp_otel.workloads.tp_mlp import MLP

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        for kind in ("ddp", "sequential", "user"):
            _reset_dynamo()
            torch.manual_seed(0)
            # bucket_cap_mb >= 1: dynamo's DDP graph splitter asserts on a smaller first bucket
            ddp = nn.parallel.DistributedDataParallel(MLP(16, 64), bucket_cap_mb=1)
            seen: Counter = Counter()
            ddp.register_comm_hook(None, _counting_comm_hook(seen))
            model = _around(kind, ddp)
            # fullgraph=True: torch itself fails DDP's forward (`Logger.set_runtime_stats_and_log`)
            call = torch.compile(model, backend="aot_eager")
            x = torch.randn(8, 16)

            def step(call: Any, x: torch.Tensor = x) -> None:
                call(x).sum().backward()

            for _ in range(3):  # DDP rebuilds its buckets in the second step: compare after
                step(call)
            untraced = _dynamo_stats()
            seen.clear()
            results, stats = _windows(model, call, step, model, windows=2)
            assert stats == [untraced] * 2, (kind, stats, untraced)
            assert untraced[1] >= 1, "nothing compiled"
            assert seen == {"backward": 2}, seen  # one bucket a step, in backward
            for counts, module_counts, errors, profiled in results:
                assert errors == {}, (kind, errors)
                assert counts == dict(profiled) == {"c10d.allreduce_": 1}, (kind, counts, profiled)
                # the bucket runs in the AccumulateGrad hook of a parameter: it counts for that parameter's
                # module and the modules enclosing it, as in eager DDP (issue 46: before, the root's only)
                prefix = {"ddp": "", "sequential": "0.", "user": "inner."}[kind]
                one = {"backward": {"c10d.allreduce_": 1}}
                chains = [
                    ["(root)", *([prefix[:-1]] if prefix else []), f"{prefix}module", f"{prefix}module.{leaf}"]
                    for leaf in ("fc1", "fc2")
                ]
                assert module_counts in [dict.fromkeys(chain, one) for chain in chains], (kind, module_counts)
    finally:
        dist.destroy_process_group()


@pytest.mark.multiprocess  # two gloo ranks
def test_a_compiled_ddp_model_counts_its_bucket_all_reduce_for_the_model() -> None:
    import torch.multiprocessing as mp

    mp.spawn(_ddp_worker, args=(free_port(),), nprocs=2, join=True)


class _WithCompiledPart(nn.Module):
    """A model holding `torch.compile(nn.Sequential(...))` as a child (the wrapper is in the tree)."""

    def __init__(self) -> None:
        super().__init__()
        self.seq = torch.compile(_tp_model("sequential"), backend="aot_eager", fullgraph=True)
        self.head = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.seq(x))


@pytest.mark.usefixtures("fake_world")
def test_a_compiled_sequential_held_as_a_child_recompiles_nothing() -> None:
    """The wrapper is a module of the tree, folded into the model it wraps under the wrapper's name
    (`seq`, not also `seq._orig_mod`: issue 46), the model's submodules (in the graph) get no hooks,
    so no window recompiles (each did before: 2, 3, 4 graphs)."""
    _reset_dynamo()
    model = _WithCompiledPart()
    _tp_step(model)
    untraced = _dynamo_stats()
    results, stats = _windows(model, model, _tp_step, model)
    assert stats == [untraced] * len(stats)
    both = {"forward": {"_c10d_functional.all_reduce": 1}, "backward": {"_c10d_functional.all_reduce": 1}}
    for counts, module_counts, errors, profiled in results:
        assert errors == {}
        assert Counter(counts) == profiled
        assert module_counts == {"(root)": both, "seq": both}
