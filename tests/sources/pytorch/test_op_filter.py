"""The op hook's native filter (native/passthrough.cpp, op_hook.wrap_hook): what the Python hook would
pass on first (an attribute access, a context with no window, a call inside backward) is passed on in C,
the rest reaches the same Python hook, so the op spans are the same with it and without it.

The gate is built here when it is not yet (`native.build()`, ≈30 s once, cached), as in test_native_gate
(the fixtures `built`, `gate_on`, `gate_off`: tests/support/native_gate.py, taken in by tests/conftest.py).
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch
from op_spans import op_spans
from torch.distributed.tensor import DTensor

from hp_otel import CommDebugMode
from hp_otel.sources.pytorch import native, op_hook
from hp_otel.workloads.tp_mlp import train_step

DISABLED = torch._C._disabled_torch_function_impl
BUILTIN = type(len)


def _class_attr() -> Any:
    return vars(DTensor)["__torch_function__"]


class _Counting:
    """The Python hook behind the filter, counting what reaches it (with the graph task it came in)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, str]] = []

    def __call__(self, cls, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kind = type(func).__name__
        self.calls.append((getattr(func, "__name__", "?"), torch._C._current_graph_task_id(), kind))
        return op_hook._torch_function(cls, func, types, args, kwargs)


def _behind_the_filter(monkeypatch) -> _Counting:
    counting = _Counting()
    monkeypatch.setattr(op_hook, "installed_hook", lambda: op_hook.wrap_hook(counting))
    return counting


def test_the_window_installs_the_filter_and_restores_by_identity(tp_mlp, gate_on) -> None:
    model, x = tp_mlp
    assert _class_attr() is DISABLED
    with CommDebugMode(module=model):
        installed = _class_attr()
        assert type(installed) is BUILTIN  # the filter, a builtin on the class as torch's own impl is
        assert native.gate().op_filter_fast_names()  # the method-wrapper layout check held here
        assert op_hook.why_mode() is None  # ours
        with CommDebugMode():  # nested: the same installation
            assert _class_attr() is installed
        assert _class_attr() is installed
        train_step(model, x)
    assert _class_attr() is DISABLED
    with pytest.raises(RuntimeError, match="user code"), CommDebugMode(module=model):
        model(x)
        raise RuntimeError("user code failed")
    assert _class_attr() is DISABLED and op_hook.class_hook.users == 0


def test_without_the_gate_the_python_hook_is_installed(tp_mlp, gate_off) -> None:
    model, x = tp_mlp
    with CommDebugMode(module=model):
        assert _class_attr() is op_hook._HOOK
        train_step(model, x)
    assert _class_attr() is DISABLED


def test_attribute_accesses_and_backward_never_enter_python(tp_mlp, gate_on, monkeypatch) -> None:
    model, x = tp_mlp
    counting = _behind_the_filter(monkeypatch)
    param = next(p for p in model.parameters() if isinstance(p, DTensor))
    with CommDebugMode(module=model) as mode:
        for _ in range(5):
            assert param.shape[0] > 0  # __get__
            param.grad = None  # __set__
            assert param.requires_grad
        assert counting.calls == []
        train_step(model, x)
    assert counting.calls  # the ops reach the Python hook
    assert [c for c in counting.calls if c[1] != -1] == []  # nothing from inside backward
    assert [c for c in counting.calls if c[2] == "method-wrapper" and c[0] in {"__get__", "__set__"}] == []
    names = [name for name, _ in op_spans(mode)]
    assert names.count("linear") == 2


def test_a_context_without_a_window_stays_in_cpp(tp_mlp, gate_on, monkeypatch) -> None:
    model, x = tp_mlp
    counting = _behind_the_filter(monkeypatch)
    other: list[int] = []

    def elsewhere() -> None:  # a new thread's context has no window
        before = len(counting.calls)
        model(x)
        other.append(len(counting.calls) - before)

    with CommDebugMode(module=model) as mode:
        thread = threading.Thread(target=elsewhere)
        thread.start()
        thread.join()
        model(x)
    assert other == [0]
    assert [name for name, _ in op_spans(mode)].count("linear") == 2  # this context's forward only


@pytest.mark.parametrize("workload", ["mlp", "dtensor-transformer"])
def test_the_same_op_spans_with_the_filter_and_without(fake_world, built, monkeypatch, workload: str) -> None:
    from benchmarks.workloads import build_workload

    work = build_workload(workload)
    work.step()  # warm
    recorded = {}
    for setting in ("auto", "off"):
        monkeypatch.setenv(native.NATIVE_ENV, setting)
        native.forget()
        with CommDebugMode(module=work.model) as mode:
            assert (type(_class_attr()) is BUILTIN) == (setting == "auto")
            work.step()
        recorded[setting] = (
            op_spans(mode),
            sorted(s.name for s in mode.get_finished_spans()),
            mode.get_comm_counts(),
            mode.get_callback_error_counts(),
        )
    native.forget()
    assert len(recorded["auto"][0]) >= {"mlp": 2, "dtensor-transformer": 30}[workload]
    assert recorded["auto"] == recorded["off"]
    assert recorded["auto"][3] == {}
    assert _class_attr() is DISABLED


def test_a_gate_without_the_filter_leaves_the_python_hook(tp_mlp, monkeypatch) -> None:
    class Older:
        """A gate that cannot make the filter."""

    disabled: list[BaseException] = []
    monkeypatch.setattr(native, "gate", lambda: Older())
    monkeypatch.setattr(native, "disable", disabled.append)
    made = op_hook.wrap_hook(op_hook._torch_function)
    assert isinstance(made, classmethod) and made.__func__ is op_hook._torch_function
    assert len(disabled) == 1
