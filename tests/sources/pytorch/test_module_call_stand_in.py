"""Issue 20 item 2: one stand-in for each module's `_call_impl` instead of a pre- and post-hook on every module.

The stand-in is an instance attribute `nn.Module.__call__` finds before the class's: checked
here are the exact restore (after a window, a raising window, nested windows, kept hooks),
that the module's own hooks keep running in the same order (ours outside all of them), that
copies, pickles, `torch.save` and `torch.jit.script` of a model inside a window work and
carry none of our attributes, and that the node boundaries of a window over many steps stay
bounded while attribution stays the referee's.
"""

from __future__ import annotations

import copy
import io
import pickle
import threading
from typing import Any

import pytest
import torch
import torch.distributed as dist
from referee import Referee
from torch import nn

import hp_otel
from hp_otel import CommDebugMode
from hp_otel.sources.pytorch import modules

_OURS = ("_call_impl", "__getstate__", "_replicate_for_data_parallel")


class _Block(nn.Module):
    """Issues an all_reduce in forward, so module attribution has something to count."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.fc(x))
        dist.all_reduce(y.detach().clone())
        return y


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = _Block()
        self.b = _Block()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x))


def _attributes(model: nn.Module) -> dict[str, dict[str, int]]:
    """Every module's instance attributes, by identity of their values."""
    return {fqn: {k: id(v) for k, v in vars(m).items()} for fqn, m in model.named_modules()}


def _ours_on(model: nn.Module) -> list[str]:
    return [f"{fqn}:{key}" for fqn, m in model.named_modules() for key in _OURS if key in vars(m)]


def _step(model: nn.Module) -> None:
    torch.manual_seed(0)
    model(torch.randn(2, 8, requires_grad=True)).sum().backward()


def _referee_counts(model: nn.Module) -> dict[str, Any]:
    referee = Referee(model)
    with referee:
        _step(model)
    return referee.module_counts_dict()


def test_a_window_puts_no_hooks_on_modules_and_restores_their_attributes_exactly(fake_world) -> None:
    model = _Net()
    before = _attributes(model)
    with CommDebugMode(module=model) as mode:
        assert _ours_on(model), "a stand-in on every module during the window"
        for m in model.modules():  # no hook of ours: torch's fast path for modules without hooks of their own
            assert not m._forward_hooks and not m._forward_pre_hooks
        _step(model)
    assert _attributes(model) == before
    assert mode.get_comm_module_counts() == _referee_counts(model)
    assert mode.get_callback_error_counts() == {}


def test_a_raising_window_and_a_raising_forward_restore_exactly(fake_world) -> None:
    model = _Net()
    before = _attributes(model)
    with pytest.raises(KeyError), CommDebugMode(module=model):
        _step(model)
        raise KeyError("the user's")
    assert _attributes(model) == before

    def boom(module: nn.Module, args: Any, output: Any) -> None:
        raise ValueError("in b's forward hook")

    handle = model.b.register_forward_hook(boom)
    before = _attributes(model)
    with pytest.raises(ValueError), CommDebugMode(module=model) as mode:
        _step(model)
    handle.remove()
    assert _attributes(model) == before
    spans = {sp.attributes.get("hp.module.fqn"): sp for sp in mode.get_finished_spans()}
    assert not spans["b"].status.is_ok  # the error of b's call ends its span
    assert spans["a"].status.is_ok


def test_nested_windows_on_the_same_tree_both_count_and_restore(fake_world) -> None:
    model = _Net()
    before = _attributes(model)
    expected = _referee_counts(model)
    with CommDebugMode(module=model) as outer:
        _step(model)
        with CommDebugMode(module=model) as inner:
            _step(model)
        assert vars(model.a)["_call_impl"] is not None  # the outer window's is back
        _step(model)
    assert _attributes(model) == before
    assert inner.get_comm_module_counts() == expected
    # the innermost window records (as before): the outer one counts its own two steps
    doubled = {f: {p: {op: 2 * n for op, n in c.items()} for p, c in ph.items()} for f, ph in expected.items()}
    assert outer.get_comm_module_counts() == doubled


def test_stand_ins_taken_off_out_of_order_restore_exactly() -> None:
    """Two hook sets on one module, the first taken off first: the second's goes on to what the first's did."""
    linear = nn.Linear(2, 2)
    foreign = linear._call_impl  # someone else's instance attribute, there before ours
    object.__setattr__(linear, "_call_impl", foreign)
    first, second = modules._ModuleHooks(), modules._ModuleHooks()
    first.attach(linear)
    second.attach(linear)
    assert modules._stand_in_of(vars(linear)["_call_impl"]) is not None
    first.remove()
    assert linear(torch.ones(1, 2)).shape == (1, 2)
    second.remove()
    assert vars(linear)["_call_impl"] is foreign
    assert set(vars(linear)) & set(_OURS) == {"_call_impl"}


def test_kept_hooks_stay_between_windows_and_uninstall_restores(fake_world) -> None:
    model = _Net()
    before = _attributes(model)
    expected = _referee_counts(model)
    hp_otel.install()
    try:
        with CommDebugMode(module=model) as first:
            _step(model)
        kept = vars(model.a)["_call_impl"]
        _step(model)  # between windows: the stand-in passes the call through
        with CommDebugMode(module=model) as second:
            _step(model)
        assert vars(model.a)["_call_impl"] is kept  # the next window took them over
    finally:
        hp_otel.uninstall()
    assert _attributes(model) == before
    assert first.get_comm_module_counts() == second.get_comm_module_counts() == expected


def test_the_modules_own_hooks_run_in_the_same_order_inside_our_call(fake_world) -> None:
    """A user's pre-hooks, hooks with kwargs, always_call hooks and full backward hooks: same order,
    same values, and a collective a pre-hook issues (as parallel-style input hooks do) counts for the module."""
    order: list[str] = []
    model = _Net()

    def pre(module: nn.Module, args: Any) -> None:
        order.append("pre")
        dist.all_reduce(args[0].detach().clone())

    def pre_kwargs(module: nn.Module, args: Any, kwargs: Any) -> Any:
        order.append("pre_kwargs")
        return (args[0] * 1.0,), kwargs

    def post(module: nn.Module, args: Any, output: Any) -> Any:
        order.append("post")
        return output * 2.0

    def post_always(module: nn.Module, args: Any, output: Any) -> None:
        order.append("post_always")

    def backward(module: nn.Module, grad_in: Any, grad_out: Any) -> None:
        order.append("backward")

    model.a.register_forward_pre_hook(pre)
    model.a.register_forward_pre_hook(pre_kwargs, with_kwargs=True, prepend=True)
    model.a.register_forward_hook(post)
    model.a.register_forward_hook(post_always, always_call=True)
    model.a.register_full_backward_hook(backward)

    def run() -> tuple[list[str], torch.Tensor]:
        order.clear()
        torch.manual_seed(0)
        x = torch.randn(2, 8, requires_grad=True)
        model(x).sum().backward()
        return list(order), x.grad.clone()

    untraced = run()
    with CommDebugMode(module=model) as mode:
        traced = run()
    assert traced[0] == untraced[0] == ["pre_kwargs", "pre", "post", "post_always", "backward"]
    assert torch.equal(traced[1], untraced[1])
    assert sum(mode.get_comm_module_counts()["a"]["forward"].values()) == 2  # the pre-hook's and forward's
    assert mode.get_comm_module_counts() == _referee_counts(model)


def test_copies_pickles_saves_and_scripting_inside_a_window_work_and_carry_nothing_of_ours(fake_world) -> None:
    model = _Net()
    with CommDebugMode(module=model) as mode:
        torch.manual_seed(0)
        x = torch.randn(2, 8)
        expected = model(x)
        made = {
            "deepcopy": copy.deepcopy(model),
            "copy": copy.copy(model),
            "pickle": pickle.loads(pickle.dumps(model)),
            "torch.save": _saved_and_loaded(model),
        }
        for how, other in made.items():
            if how == "copy":  # a shallow copy shares the model's children (and their stand-ins)
                assert not any(key in vars(other) for key in _OURS), how
            else:
                assert _ours_on(other) == [], how
            assert torch.equal(other(x), expected), how
        replica = model.a._replicate_for_data_parallel()  # what nn.DataParallel makes each replica from
        assert not any(key in vars(replica) for key in _OURS)
        assert "_call_impl" in vars(model.a)
        state = model.state_dict()
        assert set(state) == {"a.fc.weight", "a.fc.bias", "b.fc.weight", "b.fc.bias"}
        scripted = torch.jit.script(nn.Sequential(nn.Linear(8, 8)))  # a model scripted while ours are on another
        assert scripted(x).shape == (2, 8)
        on_a_tracked = torch.jit.script(model.a.fc)
        assert torch.equal(on_a_tracked(x), model.a.fc(x))
    # the copies' calls (deepcopy, pickle, torch.save) are theirs, not the model's; a shallow copy
    # shares the model's children: its call counts for them (once), not for the root
    counts = {
        fqn: sum(sum(c.values()) for c in phases.values()) for fqn, phases in mode.get_comm_module_counts().items()
    }
    assert counts == {"(root)": 2, "a": 2, "b": 2, "(outside)": 6}  # deepcopy's, pickle's and torch.save's: outside
    assert _ours_on(model) == []


def _saved_and_loaded(model: nn.Module) -> nn.Module:
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


def test_a_forward_run_in_an_except_block_is_no_error(fake_world) -> None:
    """The stand-in is given the error it caught (the always_call hook read `sys.exc_info()`)."""
    model = _Net()
    with CommDebugMode(module=model) as mode:
        try:
            raise RuntimeError("handled by the user")
        except RuntimeError:
            _step(model)
    assert all(sp.status.is_ok for sp in mode.get_finished_spans())


def _owners(model: nn.Module) -> modules.NodeOwners:
    tracker = modules._hook_sets[model].tracker
    assert tracker is not None
    return tracker._owners_by_thread[threading.get_ident()]


@pytest.mark.parametrize("record_spans", [False, True])
def test_node_boundaries_stay_bounded_over_many_steps_in_one_window(tp_mlp, record_spans: bool) -> None:
    model, _x = tp_mlp
    sizes = []
    with CommDebugMode(module=model, record_spans=record_spans) as mode:
        for _ in range(120):
            loss = model(torch.randn(4, 16, requires_grad=True)).sum()  # kept until the next step, as loops do
            loss.backward()
            sizes.append(len(_owners(model).bounds))
    assert max(sizes[40:]) <= max(sizes[:40])  # bounded: no growth after the first trims
    assert max(sizes) < 120  # 5 boundaries a step: trimmed
    referee = Referee(model)
    with referee, CommDebugMode(module=model, record_spans=record_spans) as last:
        for _ in range(40):  # attribution unchanged across trims, step after step
            model(torch.randn(4, 16, requires_grad=True)).sum().backward()
    assert last.get_comm_module_counts() == referee.module_counts_dict()
    assert mode.get_callback_error_counts() == last.get_callback_error_counts() == {}


def test_boundaries_of_a_graph_still_alive_are_kept(tp_mlp) -> None:
    """Forwards run ahead of their backwards (pipelining, accumulation): each backward still counts for its modules."""
    model, _x = tp_mlp
    referee = Referee(model)
    with referee, CommDebugMode(module=model, record_spans=False) as mode:
        losses = [model(torch.randn(4, 16, requires_grad=True)).sum() for _ in range(40)]
        for loss in reversed(losses):
            loss.backward()
    assert mode.get_comm_module_counts() == referee.module_counts_dict()
    assert any("backward" in phases for phases in mode.get_comm_module_counts().values())
