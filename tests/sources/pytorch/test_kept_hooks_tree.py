"""A window on an unchanged model takes its hooks as they are: no walk of its tree per window.

A window on a model checks the tree against what its hooks were made from
(`modules._SeenTree`) instead of walking it: with hooks kept (`hp_otel.install()`) it takes them
as they are, without (a plain window took its hooks out when it closed) it registers the same
hooks again. Each test runs both ways.  Checked here: an unchanged model is not
walked at all (`named_modules` is never called on it); and after each way of changing a model
between windows — `ModuleList.insert` / `pop` / `del` / `append` (which write `_modules`
directly: no registration hook sees them), swapping two blocks, `setattr` of a new child, a
new parameter, `nn.Module.compile()` of a block, `torch.compile(model)` run — the kept hook set
is exactly what a fresh walk makes (names, parameter owners, compiled calls noted, hooks on
each module, checked inside the window), and the counts are the referee's; after a plain
window no hook of ours is left on any module. A tree larger than `modules.VERIFY_SLICE` is
compared a slice a window: the same changes are seen at the next window when torch's
registration hooks saw them, within a turn of the slices otherwise.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

import pytest
import torch
from referee import Referee
from torch import nn

import hp_otel
from hp_otel import CommDebugMode
from hp_otel.sources.pytorch import _compat, modules
from hp_otel.workloads.tp_transformer import build_tp_transformer, demo_tokens

_PACKAGE = os.path.join(os.path.dirname(hp_otel.__file__), "")  # not "hp_otel" in a path: a clone's folder is named so


@pytest.fixture(autouse=True, params=["kept", "plain"])
def keeping(request) -> bool:
    kept = request.param == "kept"
    if kept:
        hp_otel.install()
    yield kept
    if kept:
        hp_otel.uninstall()


def _our_hooks_on(model: nn.Module) -> int:
    """Forward hooks of ours on the model's modules (its own, e.g. tensor parallelism's, left out)."""
    hooks = [h for m in model.modules() for h in (*m._forward_pre_hooks.values(), *m._forward_hooks.values())]
    return sum(isinstance(getattr(h, "__self__", None), modules._TrackedModule) for h in hooks)


def _step(model: nn.Module, tokens: torch.Tensor) -> None:
    model(tokens).sum().backward()
    model.zero_grad(set_to_none=True)


def _described(info: modules.ModuleInfo) -> tuple[object, ...]:
    return (info.fqn, info.span_name, info.module_type, info.parameters)


def _assert_as_a_walk_makes(model: nn.Module) -> None:
    """The kept hook set equals one made by walking the tree now."""
    kept = modules._hook_sets[model][None]
    fresh = modules._ModuleHooks()
    fresh._hook_tree(model, in_graph=False)
    try:
        assert kept._structure == fresh._structure
        assert [_described(t.info) for t in kept._tracked] == [_described(t.info) for t in fresh._tracked]
        assert {k: v.fqn for k, v in kept.param_owner.items()} == {k: v.fqn for k, v in fresh.param_owner.items()}
        assert {k: v.fqn for k, v in kept.module_info.items()} == {k: v.fqn for k, v in fresh.module_info.items()}
        hooked = {id(h.hooks_dict_ref()) for h in kept._handles}
        assert hooked == {id(h.hooks_dict_ref()) for h in fresh._handles}
    finally:
        fresh.remove()


def _insert(model: nn.Module) -> None:
    model.layers.insert(0, nn.Identity())


def _pop(model: nn.Module) -> None:
    model.layers.pop(-1)


def _delete(model: nn.Module) -> None:
    del model.layers[0]


def _append(model: nn.Module) -> None:
    model.layers.append(nn.Identity())


def _swap(model: nn.Module) -> None:
    model.layers[0], model.layers[1] = model.layers[1], model.layers[0]


def _new_child(model: nn.Module) -> None:
    model.extra = nn.Identity()


def _new_parameter(model: nn.Module) -> None:
    wq = model.layers[0].attention.wq
    wq.weight = nn.Parameter(wq.weight.detach().clone())


def _compile_block(model: nn.Module) -> None:
    model.layers[1].compile(backend="eager")


CHANGES: dict[str, Callable[[nn.Module], None]] = {
    "insert": _insert,
    "pop": _pop,
    "del": _delete,
    "append": _append,
    "swap": _swap,
    "setattr": _new_child,
    "parameter": _new_parameter,
    "compile": _compile_block,
}


def test_an_unchanged_model_is_not_walked(fake_world, monkeypatch, keeping: bool) -> None:
    model, tokens = build_tp_transformer(fake_world), demo_tokens()
    with CommDebugMode(module=model, record_spans=False):
        _step(model, tokens)
    walked: list[str] = []  # the hp_otel functions that walked the model
    real = nn.Module.named_modules

    def named_modules(self, *args, **kwargs):
        caller = sys._getframe(1).f_code
        if self is model and caller.co_filename.startswith(_PACKAGE):
            walked.append(caller.co_name)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(nn.Module, "named_modules", named_modules)
    for _ in range(3):
        with Referee(model) as referee, CommDebugMode(module=model, record_spans=False) as mode:
            _step(model, tokens)
        assert mode.get_comm_module_counts() == referee.module_counts_dict()
        assert keeping or _our_hooks_on(model) == 0
    assert walked == []
    monkeypatch.undo()
    with CommDebugMode(module=model, record_spans=False):
        _assert_as_a_walk_makes(model)


@pytest.mark.parametrize("change", list(CHANGES))
def test_a_model_changed_between_windows_is_hooked_as_a_walk_would(fake_world, change: str, keeping: bool) -> None:
    model, tokens = build_tp_transformer(fake_world), demo_tokens()
    for _ in range(2):
        with CommDebugMode(module=model):
            _step(model, tokens)
    CHANGES[change](model)
    with Referee(model) as referee, CommDebugMode(module=model) as mode:
        _step(model, tokens)
        _assert_as_a_walk_makes(model)
        noted = change == "compile" and hasattr(_compat.compiled_call(model.layers[1]), "__hp_otel_compiled__")
    assert keeping or _our_hooks_on(model) == 0
    if change == "compile":  # its call is noted around its graph: no submodule of it counts
        assert noted
        # a plain window gives the block its own compiled call back when it closes
        assert keeping or not hasattr(_compat.compiled_call(model.layers[1]), "__hp_otel_compiled__")
        assert not any(fqn.startswith("layers.1.") for fqn in mode.get_comm_module_counts())
    else:
        assert mode.get_comm_module_counts() == referee.module_counts_dict()
    assert mode.get_callback_error_counts() == {}


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


def test_a_model_torch_compiled_between_windows_loses_its_submodules_hooks(fake_world) -> None:
    """`torch.compile(model)` compiles the class's forward: the submodules' hooks would run in its graph."""
    torch._dynamo.reset()  # the other run of this test compiled _Net.forward's code, for good
    model = _Net()
    with CommDebugMode(module=model):
        model(torch.randn(2, 4))
        assert len(model.fc._forward_pre_hooks) == 1
    compiled = torch.compile(model, backend="eager")
    compiled(torch.randn(2, 4))
    with CommDebugMode(module=model):
        compiled(torch.randn(2, 4))
        assert len(model.fc._forward_pre_hooks) == 0  # as a walk makes them
        _assert_as_a_walk_makes(model)


def _large(fake_world: int) -> tuple[nn.Module, torch.Tensor]:
    """The transformer with a 3,072-module list it never calls: a tree larger than one window compares."""
    model = build_tp_transformer(fake_world)
    model.padding = nn.ModuleList(nn.Identity() for _ in range(3 * modules.VERIFY_SLICE))
    return model, demo_tokens()


def test_a_large_unchanged_model_is_compared_one_slice_a_window(fake_world, monkeypatch, keeping: bool) -> None:
    """What a window on an unchanged model pays does not grow with it: a slice of its state, no walk."""
    model, tokens = _large(fake_world)
    with CommDebugMode(module=model):
        _step(model, tokens)
    compared: list[int] = []
    real = _compat.tree_state
    monkeypatch.setattr(_compat, "tree_state", lambda refs: compared.append(len(refs)) or real(refs))
    walked: list[str] = []  # the hp_otel functions that walked the model
    real_walk = nn.Module.named_modules

    def named_modules(self, *args, **kwargs):
        caller = sys._getframe(1).f_code
        if self is model and caller.co_filename.startswith(_PACKAGE):
            walked.append(caller.co_name)
        return real_walk(self, *args, **kwargs)

    monkeypatch.setattr(nn.Module, "named_modules", named_modules)
    for _ in range(4):
        with CommDebugMode(module=model) as mode:
            _step(model, tokens)
        assert mode.get_total_counts() > 0
    assert walked == [] and sum(compared) == 4 * modules.VERIFY_SLICE  # (a slice may wrap around: two pieces)


@pytest.mark.parametrize("change", list(CHANGES))
def test_a_large_model_changed_between_windows_is_hooked_as_a_walk_would(
    fake_world, change: str, keeping: bool
) -> None:
    """A change through torch's registration (setattr, append, a new parameter) is seen by the next
    window; one written into `_modules` or the compiled call directly, within a turn of the slices."""
    model, tokens = _large(fake_world)
    for _ in range(2):
        with CommDebugMode(module=model):
            _step(model, tokens)
    CHANGES[change](model)
    registered = change in ("append", "swap", "setattr", "parameter")
    windows = 1 if registered else -(-sum(1 for _ in model.modules()) // modules.VERIFY_SLICE)
    for window in range(windows):
        with Referee(model) as referee, CommDebugMode(module=model) as mode:
            _step(model, tokens)
            if window == windows - 1:
                _assert_as_a_walk_makes(model)
    if change != "compile":
        assert mode.get_comm_module_counts() == referee.module_counts_dict()
    assert mode.get_callback_error_counts() == {}
