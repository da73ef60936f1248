"""Op spans from the hook on `DTensor.__torch_function__` (hp_otel/sources/pytorch/op_hook.py).

The class attribute is swapped only while a window records ops and put back by identity;
the ops it reports are those an independent TorchFunctionMode referee sees, with the
same spans as the TorchFunctionMode fallback (`HP_OTEL_TORCH_OP_HOOK=mode`).
"""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest
import torch
from op_spans import op_spans
from referee import Referee
from torch.distributed.tensor import DTensor
from torch.overrides import TorchFunctionMode

import hp_otel
from hp_otel import CommDebugMode
from hp_otel.sources.pytorch import op_hook
from hp_otel.workloads.tp_mlp import train_step

DISABLED = torch._C._disabled_torch_function_impl
SKIPPED = {"__get__", "__set__", "__delete__", "register_hook", "register_post_accumulate_grad_hook"}


def _class_attr() -> Any:
    return vars(DTensor)["__torch_function__"]


def _function_modes() -> int:
    return torch._C._len_torch_function_stack()


class _OpReferee(TorchFunctionMode):
    """The test's own witness: names of the torch calls that take a DTensor (top level, or in a list)."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        values = [*args, *kwargs.values()]
        flat = [v for value in values for v in (value if isinstance(value, (list, tuple)) else (value,))]
        name = getattr(func, "__name__", None)
        if name not in SKIPPED and any(isinstance(v, DTensor) for v in flat):
            self.names.append(name)
        return func(*args, **kwargs)


def _span_names(mode: CommDebugMode) -> list[str]:
    return sorted(s.name for s in mode.get_finished_spans())


def _workload(name: str) -> Any:
    from benchmarks.workloads import build_workload

    return build_workload(name)


def _record(step, model, monkeypatch, hook: str) -> tuple[CommDebugMode, int]:
    monkeypatch.setenv(op_hook.OP_HOOK_ENV, hook)
    with CommDebugMode(module=model) as mode:
        modes_inside = _function_modes()
        step()
    return mode, modes_inside


@pytest.mark.parametrize("workload", ["mlp", "dtensor-transformer"])
def test_ops_counts_and_spans_match_the_referees_and_the_mode(fake_world, monkeypatch, workload: str) -> None:
    work = _workload(workload)
    work.step()  # warm: lazily made state (optimizer-free step, grads zeroed) is the same for every run below
    with _OpReferee() as op_referee, Referee(work.model) as referee:
        work.step()
    ours, modes_inside = _record(work.step, work.model, monkeypatch, "class")
    assert modes_inside == 0  # the class hook, no TorchFunctionMode
    theirs, modes_in_fallback = _record(work.step, work.model, monkeypatch, "mode")
    assert modes_in_fallback == 1
    assert [name for name, _ in op_spans(ours)] == op_referee.names
    assert len(op_referee.names) >= {"mlp": 2, "dtensor-transformer": 30}[workload]
    assert op_spans(ours) == op_spans(theirs)  # same names and attributes, in the same order
    assert _span_names(ours) == _span_names(theirs)  # and every other span
    assert ours.get_comm_counts() == theirs.get_comm_counts() == dict(referee.counts)
    assert ours.get_comm_module_counts() == theirs.get_comm_module_counts() == referee.module_counts_dict()
    assert ours.get_callback_error_counts() == theirs.get_callback_error_counts() == {}
    assert _class_attr() is DISABLED


def test_the_class_attribute_is_swapped_only_inside_and_restored_by_identity(tp_mlp) -> None:
    model, x = tp_mlp
    before = _class_attr()
    assert before is DISABLED
    with CommDebugMode(module=model):
        assert _class_attr() is not before
        train_step(model, x)
    assert _class_attr() is before
    assert op_hook.class_hook.users == 0


def test_restored_after_a_raising_window(tp_mlp) -> None:
    model, x = tp_mlp
    error = RuntimeError("user code failed")
    with pytest.raises(RuntimeError) as caught, CommDebugMode(module=model) as mode:
        model(x)
        raise error
    assert caught.value is error
    assert _class_attr() is DISABLED
    assert "linear" in _span_names(mode)


def test_nested_windows_hold_it_until_the_last_closes(tp_mlp) -> None:
    model, x = tp_mlp
    with CommDebugMode() as outer:
        with CommDebugMode() as inner:
            model(x)
            assert op_hook.class_hook.users == 2
        assert _class_attr() is not DISABLED  # the outer window still records ops
        model(x)
    assert _class_attr() is DISABLED
    assert op_hook.class_hook.users == 0
    assert _span_names(inner).count("linear") == 2
    assert _span_names(outer).count("linear") == 2  # its own forward, not the inner one's


def test_windows_without_ops_swap_nothing(tp_mlp) -> None:
    model, x = tp_mlp
    for window in (CommDebugMode(ops=False), CommDebugMode(record_spans=False)):
        with window as mode:
            assert _class_attr() is DISABLED and _function_modes() == 0
            train_step(model, x)
        assert "linear" not in _span_names(mode)
        assert mode.get_comm_counts() == {"_c10d_functional.all_reduce": 2}


def test_an_other_tracers_hook_means_the_mode_and_is_left_in_place(tp_mlp, monkeypatch) -> None:
    model, x = tp_mlp

    def theirs(cls, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        calls.append(func)
        return DISABLED(func, types, args, kwargs or {})

    calls: list[Any] = []
    foreign = classmethod(theirs)
    monkeypatch.setattr(DTensor, "__torch_function__", foreign)
    assert op_hook.why_mode() is not None and "replaced" in op_hook.why_mode()
    with CommDebugMode(module=model) as mode:
        assert _function_modes() == 1  # the fallback mode
        train_step(model, x)
    assert _class_attr() is foreign
    assert calls  # theirs still ran
    assert _span_names(mode).count("linear") == 2
    assert mode.get_callback_error_counts() == {}


def test_a_subclass_with_its_own_torch_function_means_the_mode() -> None:
    class Traced(DTensor):
        __torch_function__ = classmethod(lambda cls, func, types, args=(), kwargs=None: None)

    try:
        assert "Traced" in (op_hook.why_mode() or "")
    finally:
        del Traced
        import gc

        gc.collect()


def test_the_setting_forces_the_mode_and_a_bad_value_is_named(monkeypatch) -> None:
    monkeypatch.setenv(op_hook.OP_HOOK_ENV, "mode")
    assert op_hook.why_mode() == "HP_OTEL_TORCH_OP_HOOK=mode"
    monkeypatch.setenv(op_hook.OP_HOOK_ENV, "sideways")
    with pytest.raises(ValueError, match=r"HP_OTEL_TORCH_OP_HOOK='sideways'.*'class'.*'mode'"):
        op_hook.requested()


def test_a_fault_in_the_hook_is_counted_and_the_step_runs(tp_mlp, monkeypatch) -> None:
    model, x = tp_mlp
    expected = train_step(model, x).detach()

    def broken(*_values: Any) -> Any:
        raise RuntimeError("hp_otel bug")

    monkeypatch.setattr(op_hook, "tensor_infos", broken)
    with CommDebugMode(module=model) as mode:
        loss = train_step(model, x)
    assert torch.equal(loss.detach().full_tensor() if isinstance(loss, DTensor) else loss.detach(), expected)
    errors = mode.get_callback_error_counts()
    assert errors.get("op_inputs", 0) > 0 and errors.get("op_outputs", 0) > 0
    assert _class_attr() is DISABLED


def test_our_own_reads_in_the_module_hooks_do_not_reach_the_op_hook(tp_mlp, monkeypatch) -> None:
    model, x = tp_mlp
    seen: list[str] = []
    hook = op_hook._torch_function

    def counting(cls, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        caller = sys._getframe(1).f_code  # an attribute read calls the hook from the reading frame
        seen.append(f"{caller.co_filename}:{caller.co_name}: {getattr(func, '__name__', '?')}")
        return hook(cls, func, types, args, kwargs)

    with CommDebugMode(module=model):  # describes the parameters once (cached for later windows)
        train_step(model, x)
    # behind the native filter where it is built, as a window installs it (what reaches Python is counted)
    monkeypatch.setattr(op_hook, "installed_hook", lambda: op_hook.wrap_hook(counting))
    with CommDebugMode(module=model):
        train_step(model, x)
    assert seen  # the user's ops
    package = os.path.join(os.path.dirname(hp_otel.__file__), "")  # not "/hp_otel/": a clone's folder is named so
    assert [s for s in seen if s.startswith(package)] == []


def test_attribute_reads_and_writes_leave_before_the_context_lookup(tp_mlp, monkeypatch) -> None:
    # most of the hook's calls in a step are `p.grad`, `x.shape`, `requires_grad`: they must cost
    # a frame and no more (docs/how-it-works/costs.md); the ops themselves still reach the window
    model, x = tp_mlp
    lookups: list[int] = []
    real_lookup = op_hook._observer_here
    monkeypatch.setattr(op_hook, "_observer_here", lambda: (lookups.append(1), real_lookup())[1])
    param = next(p for p in model.parameters() if isinstance(p, DTensor))
    with CommDebugMode(module=model) as mode:
        assert _class_attr() is not DISABLED
        for _ in range(5):
            assert param.shape[0] > 0  # __get__
            param.grad = None  # __set__
            _ = param.requires_grad
        attribute_lookups = len(lookups)
        model(x)
    assert attribute_lookups == 0
    assert len(lookups) > 0 and "linear" in _span_names(mode)


@pytest.mark.parametrize(("when", "backend"), [("before", "eager"), ("inside", "aot_eager")])
def test_compiled_fullgraph_no_break_and_no_recompile_for_the_hook(tp_mlp, when: str, backend: str) -> None:
    """dynamo wraps DTensors as plain tensor variables: it never traces the hook, and unlike the
    mode (on the function-mode stack dynamo guards on) a window does not recompile the frame."""
    from torch._dynamo.utils import counters

    model, x = tp_mlp
    torch._dynamo.reset()
    counters.clear()
    try:
        if when == "before":
            model.compile(backend=backend, fullgraph=True)
            train_step(model, x)
        graphs: list[int] = []
        for i in range(3):
            with CommDebugMode(module=model) as mode:
                assert _class_attr() is not DISABLED
                if when == "inside" and i == 0:
                    model.compile(backend=backend, fullgraph=True)  # traced while the hook is on
                train_step(model, x)
            assert mode.get_comm_counts() == {"_c10d_functional.all_reduce": 2}
            assert mode.get_callback_error_counts() == {}
            # the eager backend's graph calls the same torch functions on DTensors (seen, as by the
            # mode); aot_eager's runs aten ops on the local tensors (no op spans, as with the mode)
            assert _span_names(mode).count("linear") == (2 if backend == "eager" else 0)
            graphs.append(counters["stats"]["unique_graphs"])
        assert sum(counters["graph_break"].values()) == 0
        # compiled before: no window recompiles; compiled inside: the next window drops the module
        # hooks from it, once (tests/sources/pytorch/test_compiled.py), and no window after that
        assert graphs == ([1, 1, 1] if when == "before" else [1, 2, 2])
    finally:
        torch._dynamo.reset()
    assert _class_attr() is DISABLED
