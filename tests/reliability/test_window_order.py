"""Windows closed out of order (a window left open across a generator's yield, closed
while a window opened after it is still open) are refused with a clear error, after
closing the later window too and removing every hook: no closed window stays the
current mode, and nothing keeps the model alive."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from events import design_mlp_forward
from torch.overrides import _get_current_function_mode_stack
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from hp_otel import CommDebugMode
from hp_otel.mode import registry


def _hooks(model: torch.nn.Module) -> int:
    return sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in model.modules())


def test_a_window_closed_before_a_later_one_is_refused_and_everything_is_restored() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 256))
    baseline_function, baseline_dispatch = (
        len(_get_current_function_mode_stack()),
        len(_get_current_dispatch_mode_stack()),
    )

    def traced_steps(model: torch.nn.Module):  # type: ignore[no-untyped-def]
        with CommDebugMode(model, engine="torch") as window:
            design_mlp_forward(window.observer)
            yield window
            yield window

    steps = traced_steps(model)
    first = next(steps)  # open across the yield
    later = CommDebugMode(model, engine="torch")
    later.__enter__()
    design_mlp_forward(later.observer)
    design_mlp_forward(later.observer)
    assert registry.current_mode.get() is later
    next(steps)
    with pytest.raises(RuntimeError, match=r"closed while 1 window\(s\) opened after it on the same thread"):
        next(steps)  # the generator's window closes before the later one
    assert not first.active and not later.active
    assert registry.current_mode.get() is None  # not the closed window
    later.__exit__(None, None, None)  # its own exit now does nothing
    assert registry.current_mode.get() is None
    assert (first.get_total_counts(), later.get_total_counts()) == (1, 2)  # what each recorded is kept
    assert len(_get_current_function_mode_stack()) == baseline_function
    assert len(_get_current_dispatch_mode_stack()) == baseline_dispatch
    assert _hooks(model) == 0
    assert registry.traced_modules == {} and registry.windows_of_this_thread() == []

    freed = weakref.ref(model)
    del model, first, later, steps
    gc.collect()
    assert freed() is None  # nothing of hp_otel keeps the model alive


def test_windows_closed_in_order_still_work_afterwards() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    with CommDebugMode(model, engine="torch") as outer:
        with CommDebugMode(model, engine="torch") as inner:
            model(torch.ones(1, 2))
        assert registry.current_mode.get() is outer
    assert registry.current_mode.get() is None
    assert {s.name for s in inner.get_finished_spans()} >= {"Sequential", "0"}
