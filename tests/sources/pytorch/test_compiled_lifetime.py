"""Kept hooks (`hp_otel.install()`) do not keep a compiled model alive.

The hook set kept for a model between windows once held each `nn.Module.compile()`d module,
and our stand-in for its compiled call (which holds the module's own compiled call, bound to
the module), strongly; and the `torch.compile(model)` wrapper it hooked: a compiled model
traced once stayed in memory until `uninstall()` (for the always-on instrumentor, for the
process).  Checked here with a weak reference to each, after `del` and a collection.
"""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from torch import nn

import hp_otel
from hp_otel import CommDebugMode
from hp_otel.record import installation


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))


@pytest.mark.parametrize("how", ["module.compile", "blocks", "torch.compile"])
def test_a_compiled_model_traced_with_kept_hooks_goes_away_when_dropped(how: str) -> None:
    hp_otel.install()
    try:
        model = _model()
        call: nn.Module = model
        if how == "module.compile":
            model.compile(backend="eager")
        elif how == "blocks":
            model[0].compile(backend="eager")
            model[2].compile(backend="eager")
        else:
            call = torch.compile(model, backend="eager")
        for _ in range(2):  # the second window takes the kept hooks over
            with CommDebugMode(module=call, record_spans=False) as mode:
                call(torch.randn(2, 8, requires_grad=True)).sum().backward()
            assert mode.get_callback_error_counts() == {}
        assert installation.lingering_count() >= 1  # the hooks are still kept
        refs = [weakref.ref(model), weakref.ref(call), weakref.ref(model[0])]
        del model, call, mode
        gc.collect()
        assert [r() for r in refs] == [None, None, None]
    finally:
        hp_otel.uninstall()
