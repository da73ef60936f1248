"""Hooking only as deep as a window needs (`CommDebugMode(module_depth=)`, and a counts-only
window's metric depth): the same counts per op, and per module at that depth, as the
independent referee (tests/support/referee.py: its own dispatch mode and forward hooks on
every module) — forward and backward, where a deeper module's collectives count for its
ancestor at the depth; and no hp_otel hook below it."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from referee import Referee
from torch import nn

import hp_otel
from benchmarks.models.llama import LlamaShape, build_llama_step
from hp_otel import CommDebugMode
from hp_otel.record import installation


@pytest.fixture(autouse=True)
def _nothing_kept():
    hp_otel.uninstall()
    yield
    hp_otel.uninstall()
    assert installation.lingering_count() == 0


@pytest.fixture
def llama(fake_world):
    return build_llama_step(1, fake_world, LlamaShape(layers=2, dim=16, heads=2, vocab=16, batch=2, seq=4))


def _names_within(model: nn.Module, depth: int) -> set[str]:
    """The test's own reading of the rule: up to `depth` dotted parts, and the children of a ModuleList there."""
    names = set()
    for fqn, _module in model.named_modules():
        parent = fqn.rpartition(".")[0]
        parts = fqn.count(".") + 1 if fqn else 0
        if parts <= depth or (parent in names and isinstance(model.get_submodule(parent), nn.ModuleList)):
            names.add(fqn)
    return {name or "(root)" for name in names}


def _referee_within(referee: Referee, names: set[str]) -> dict:
    return {fqn: c for fqn, c in referee.module_counts_dict().items() if fqn in names or fqn.startswith("(")}


def _hooks(model: nn.Module) -> dict[str, int]:
    return {fqn or "(root)": len(m._forward_pre_hooks) for fqn, m in model.named_modules()}


def _hooked(model: nn.Module, before: dict[str, int]) -> set[str]:
    """The modules with more forward pre-hooks than `before` (TP's input hooks are there already)."""
    return {fqn for fqn, n in _hooks(model).items() if n > before[fqn]}


@pytest.mark.parametrize(
    ("window", "depth"),
    [
        ({"record_spans": False, "metric_module_depth": 1}, 1),  # counts only: its labels' depth
        ({"module_depth": 1}, 1),
        ({"module_depth": 2}, 2),
        ({"record_spans": False, "metric_module_depth": 2, "module_depth": 0}, 0),  # asked: less
    ],
)
def test_counts_at_the_depth_match_the_referee(llama, window, depth) -> None:
    model, step = llama
    step()  # DTensor's first-call caches
    with Referee(model) as referee, CommDebugMode(module=model, **window) as mode:
        step()
    names = _names_within(model, depth)
    assert (
        mode.get_comm_counts() == dict(referee.counts) and mode.get_total_counts() == 22
    )  # 8 a layer, 6 outside the layers
    assert mode.get_comm_module_counts() == _referee_within(referee, names)
    # backward collectives of modules below the depth count for their ancestor there
    if depth == 1:
        backward = mode.get_comm_module_counts()["layers.0"]["backward"]
        assert backward == referee.module_counts_dict()["layers.0"]["backward"] and sum(backward.values()) > 0
        assert "layers.0.attention" not in mode.get_comm_module_counts()
        assert "layers.0.attention" in referee.module_counts_dict()  # where they ran
    before = _hooks(model)
    with CommDebugMode(module=model, **window):
        assert _hooked(model, before) == names  # no hp_otel hook below the depth


def test_a_traced_window_hooks_every_module_unless_asked(llama) -> None:
    model, step = llama
    before = _hooks(model)
    with CommDebugMode(module=model) as full:
        assert _hooked(model, before) == _names_within(model, 99)
        step()
    with CommDebugMode(module=model, module_depth=2) as blocks:
        assert _hooked(model, before) == _names_within(model, 2)
        step()
    assert _hooks(model) == before  # all taken out again
    spans = {s.attributes.get("hp_otel.module.fqn") for s in blocks.get_finished_spans()} - {None}
    assert spans == {"(root)", "tok_embeddings", "layers.0", "layers.1", "norm", "output"}
    assert {s.attributes.get("hp_otel.module.fqn") for s in full.get_finished_spans()} >= spans | {
        "layers.0.attention.wq"
    }
    assert blocks.get_comm_counts() == full.get_comm_counts()
    # the full window's counts, cut at depth 2, are the block window's
    cut = {fqn: c for fqn, c in full.get_comm_module_counts().items() if fqn in _names_within(model, 2) | {"(outside)"}}
    assert blocks.get_comm_module_counts() == cut


class _ReduceInBackward(torch.autograd.Function):
    """Identity forward; its backward all-reduces the gradient (a collective no forward hook sees)."""

    @staticmethod
    def forward(ctx, x):  # type: ignore[no-untyped-def]
        return x.clone()

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def]
        dist.all_reduce(grad)
        return grad


class _Leaf(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ReduceInBackward.apply(x * self.weight)


class _Deep(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = nn.Sequential(nn.Sequential(_Leaf()))  # block.0.0: depth 3

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x)


def test_a_backward_collective_below_the_depth_counts_for_its_ancestor(fake_world) -> None:
    model = _Deep()
    x = torch.ones(3, requires_grad=True)
    for depth in (0, 1, 2):
        with Referee(model) as referee, CommDebugMode(module=model, module_depth=depth) as mode:
            model(x).sum().backward()
        (op,) = referee.counts
        expected = {"(root)", "block", "block.0"} & ({"(root)"} | _names_within(model, depth))
        assert referee.module_counts_dict()["block.0.0"] == {"backward": {op: 1}}  # it ran there
        assert mode.get_comm_module_counts() == {fqn: {"backward": {op: 1}} for fqn in expected}


def test_a_parameter_gradient_hook_below_the_depth_counts_for_its_ancestor(fake_world) -> None:
    """A collective in a deep parameter's AccumulateGrad (DDP's reducer does so) counts for the module
    owning the parameter; below the depth, for its ancestor there — what the full window says, cut."""
    model = _Deep()
    leaf = model.block[0][0]
    handle = leaf.weight.register_post_accumulate_grad_hook(lambda p: dist.all_reduce(p.grad))
    try:
        x = torch.ones(3, requires_grad=True)
        with CommDebugMode(module=model) as full:
            model(x).sum().backward()
        with CommDebugMode(module=model, record_spans=False, metric_module_depth=1) as cut:
            model(x).sum().backward()
    finally:
        handle.remove()
    assert full.get_comm_module_counts()["block.0.0"]["backward"] == {"c10d.allreduce_": 2}  # ours and the Function's
    assert cut.get_comm_module_counts() == {
        fqn: counts for fqn, counts in full.get_comm_module_counts().items() if fqn in ("(root)", "block")
    }


def test_kept_hooks_follow_the_depth_of_each_window(llama) -> None:
    """Each depth keeps a hook set of its own (the instrumentor alternates two): a window records
    through its depth's, the other's pass calls through, and going back to a depth hooks nothing anew."""
    model, step = llama
    before = _hooks(model)
    hp_otel.install()
    results = []
    seen: list[set[str]] = []
    for window in ({"module_depth": 1}, {}, {"module_depth": 1}, {}):
        with Referee(model) as referee, CommDebugMode(module=model, **window) as mode:
            step()
        depth = window.get("module_depth", 99)
        results.append(mode.get_comm_module_counts() == _referee_within(referee, _names_within(model, depth)))
        if _names_within(model, depth) not in seen:
            seen.append(_names_within(model, depth))
        added = {fqn: n - before[fqn] for fqn, n in _hooks(model).items() if n > before[fqn]}
        assert added == {fqn: sum(fqn in names for names in seen) for fqn in set().union(*seen)}  # one set a depth
    assert results == [True] * 4 and len(seen) == 2
    hp_otel.uninstall()
    assert _hooks(model) == before


@pytest.mark.parametrize("bad", [-1, "deep", True, 1.5, "2"])
def test_a_bad_module_depth_is_refused_in_one_line(bad) -> None:
    with pytest.raises(ValueError) as error:
        CommDebugMode(module_depth=bad)
    message = str(error.value)
    assert message == f"module_depth must be 'full' or an int >= 0 (module levels hooked, the root is 0), got {bad!r}"


def test_the_instrumentors_unsampled_steps_hook_only_its_label_depth(llama) -> None:
    from benchmarks.variants import INSTRUMENTOR, build_variants

    model, step = llama
    before = _hooks(model)
    variants, _ = build_variants(model)
    (variant,) = [v for v in variants if v.name == INSTRUMENTOR]
    with variant.around_block():
        with variant.step_context() as spans:
            assert not spans.sampled
            assert _hooked(model, before) == _names_within(model, 1)  # its metric depth: 1
            step()
