"""A module call's backward span opens from a grad hook on its output that sits where
`Tensor.register_hook` would put it: after the user's hooks registered before it (in the
module's forward), before those registered after, and a user's hook removed later leaves it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hp_otel import CommDebugMode
from hp_otel.sources.pytorch import modules


class _Scale(nn.Module):
    """Its forward registers the user's own grad hook on its output (before hp_otel's)."""

    def __init__(self, order: list[str]) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(4))
        self.order = order

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * self.weight
        y.register_hook(lambda grad: self.order.append("user, in forward"))
        return y


@pytest.fixture
def order(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    seen: list[str] = []
    backward_start = modules.TorchModuleTracker.backward_start

    def noted(self: modules.TorchModuleTracker, call: modules.ModuleCall) -> None:
        seen.append("hp_otel")
        backward_start(self, call)

    monkeypatch.setattr(modules.TorchModuleTracker, "backward_start", noted)
    return seen


def _backward_fqns(mode: CommDebugMode) -> list[str]:
    return [
        sp.attributes["hp_otel.module.fqn"]
        for sp in mode.get_finished_spans()
        if sp.attributes.get("hp_otel.phase") == "backward" and sp.attributes["hp_otel.call.kind"] == "module"
    ]


def test_grad_hook_runs_between_the_users_hooks_in_registration_order(order: list[str]) -> None:
    model = _Scale(order)
    with CommDebugMode(module=model) as mode:
        y = model(torch.ones(4))
        y.register_hook(lambda grad: order.append("user, after forward"))
        y.sum().backward()
    assert order == ["user, in forward", "hp_otel", "user, after forward"]
    assert _backward_fqns(mode) == ["(root)"]
    assert mode.get_callback_error_counts() == {}


def test_a_users_removed_hook_leaves_the_grad_hook(order: list[str]) -> None:
    """The user's handle, made after hp_otel's hook, has an id of its own: its remove() takes only its hook."""
    model = _Scale(order)
    with CommDebugMode(module=model) as mode:
        y = model(torch.ones(4))
        y.register_hook(lambda grad: order.append("removed")).remove()
        y.sum().backward()
    assert order == ["user, in forward", "hp_otel"]
    assert _backward_fqns(mode) == ["(root)"]


def test_grad_hook_on_an_output_without_hooks_before(order: list[str]) -> None:
    """hp_otel's hook is the output's first: it makes the tensor's hook dict, and the user's joins it."""
    model = nn.Linear(4, 4)
    with CommDebugMode(module=model) as mode:
        y = model(torch.ones(2, 4))
        assert len(y._backward_hooks) == 1
        y.register_hook(lambda grad: order.append("user, after forward"))
        y.sum().backward()
    assert order == ["hp_otel", "user, after forward"]
    assert _backward_fqns(mode) == ["(root)"]
