"""The native gate (hp_otel/sources/pytorch/native): the calls it passes on never enter Python, the
rest reach the same Python kernels, so the same collectives are recorded with it and without it.

The gate is built here when it is not yet (`native.build()`, ≈30 s once, cached); CI builds it
before the suite (`hp-otel build-native`) and runs the torch 2.14.1 pass without it. Under CI a
build that fails fails these tests; elsewhere they skip, saying why.
"""

from __future__ import annotations

import logging
import sys

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from referee import Referee

import hp_otel
from hp_otel.sources.pytorch import kernels, native


def _kernel_calls(run) -> list[str]:
    """Which of hp_otel's Python kernels were entered while `run()` runs (a profile hook sees every call)."""
    seen: list[str] = []

    def spy(frame, event, arg):
        if event == "call" and frame.f_code.co_name == "kernel" and "hp_otel" in frame.f_code.co_filename:
            seen.append(frame.f_code.co_qualname.split(".", 1)[0])  # _collective_kernel / _wait_kernel

    sys.setprofile(spy)
    try:
        run()
    finally:
        sys.setprofile(None)
    return seen


def _functional(group):
    t = torch.ones(8)
    funcol.wait_tensor(funcol.all_reduce(t, "sum", group))


def test_an_inner_c10d_call_stays_in_cpp(fake_world, gate_on):
    """A functional all_reduce runs c10d.allreduce_ inside: with the gate only the outer call and its
    wait enter Python; without it the inner one does too."""
    assert gate_on is not None
    group = dist.group.WORLD
    model = torch.nn.Linear(2, 2)
    with hp_otel.CommDebugMode(module=model, record_spans=False) as mode:
        assert kernels._registration.gate is gate_on
        calls = _kernel_calls(lambda: _functional(group))
    assert calls.count("_collective_kernel") == 1 and "_wait_kernel" in calls  # the all_reduce, its wait
    assert mode.get_comm_counts() == {"_c10d_functional.all_reduce": 1}


def test_without_the_gate_the_inner_call_enters_python(fake_world, gate_off):
    group = dist.group.WORLD
    with hp_otel.CommDebugMode(module=torch.nn.Linear(2, 2), record_spans=False) as mode:
        assert kernels._registration.gate is None
        calls = _kernel_calls(lambda: _functional(group))
    assert calls.count("_collective_kernel") == 2 and "_wait_kernel" in calls  # and the allreduce_ it runs
    assert mode.get_comm_counts() == {"_c10d_functional.all_reduce": 1}


def test_kept_hooks_without_a_window_run_no_python(fake_world, gate_on):
    """Between windows under `hp_otel.install()` the kernels stay registered: the gate passes every
    call on in C++, so no Python kernel runs."""
    group = dist.group.WORLD
    hp_otel.install()
    try:
        with hp_otel.CommDebugMode(module=torch.nn.Linear(2, 2), record_spans=False):
            _functional(group)
        assert kernels.registered() and kernels._registration.gate is gate_on
        calls = _kernel_calls(lambda: (_functional(group), dist.all_reduce(torch.ones(4), group=group)))
        assert calls == []
        with hp_otel.CommDebugMode(module=torch.nn.Linear(2, 2), record_spans=False) as mode:
            dist.all_reduce(torch.ones(4), group=group)
        assert mode.get_comm_counts() == {"c10d.allreduce_": 1}  # recording again at the next window
    finally:
        hp_otel.uninstall()
    assert not kernels.registered()


def _tp_step(model, x, spans: bool):
    """Our counts per op and per module/phase, the referee's, and whether the window recorded behind the gate."""
    referee = Referee(model)
    with referee, hp_otel.CommDebugMode(module=model, record_spans=spans) as mode:
        gated = kernels._registration.gate is not None
        model(x).sum().backward()
        dist.all_reduce(torch.ones(4))
    ours = (mode.get_comm_counts(), mode.get_comm_module_counts())
    return ours, (dict(referee.counts), referee.module_counts_dict()), gated


@pytest.mark.parametrize("spans", [False, True], ids=["counts-only", "traced"])
def test_same_counts_both_ways_and_the_referees(tp_mlp, monkeypatch, built, spans):
    """The TP MLP's step (forward all_reduce, backward, one eager all_reduce) with the gate and without:
    per op and per module and phase, the counts of a dispatch-mode referee both times."""
    model, x = tp_mlp
    try:
        for setting in ("auto", "off"):
            monkeypatch.setenv(native.NATIVE_ENV, setting)
            native.forget()
            ours, referee, gated = _tp_step(model, x, spans)
            assert gated == (setting == "auto")
            assert ours == referee and sum(referee[0].values()) > 0
    finally:
        native.forget()


def test_the_users_error_comes_through_unchanged(fake_world, gate_on):
    """An op that fails under the gate raises what it raises without hp_otel, and the thread's
    recording depth is back at 0 (the next inner call is not taken for a nested one)."""
    group = dist.group.WORLD
    with pytest.raises(Exception) as without:
        funcol.all_reduce(torch.ones(4), "no-such-op", group)
    with hp_otel.CommDebugMode(module=torch.nn.Linear(2, 2), record_spans=False) as mode:
        with pytest.raises(type(without.value)) as under:
            funcol.all_reduce(torch.ones(4), "no-such-op", group)
        assert gate_on.recording_depth() == 0
        _functional(group)
    assert str(under.value) == str(without.value)
    assert mode.get_comm_counts().get("_c10d_functional.all_reduce") == 2  # the failed one counts too


def test_meta_tensors_pass_through(fake_world, gate_on):
    """Shape propagation (meta tensors, fake tensors while compiling) is not communication."""
    with hp_otel.CommDebugMode(module=torch.nn.Linear(2, 2), record_spans=False) as mode:
        out = funcol.all_reduce(torch.ones(4, device="meta"), "sum", dist.group.WORLD)
    assert out.device.type == "meta"
    assert mode.get_comm_counts() == {}


def test_a_bad_setting_is_refused_by_name(fake_world, monkeypatch):
    monkeypatch.setenv(native.NATIVE_ENV, "sometimes")
    with pytest.raises(ValueError, match=r"HP_OTEL_TORCH_NATIVE='sometimes'.*'auto'.*'off'"):
        native.requested()


def test_not_built_says_so_once_and_records_in_python(fake_world, monkeypatch, tmp_path, caplog):
    monkeypatch.setenv(native.NATIVE_ENV, "auto")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # no build there
    native.forget()
    try:
        with caplog.at_level(logging.INFO, logger="hp_otel"):
            for _ in range(2):
                with hp_otel.CommDebugMode(module=torch.nn.Linear(2, 2), record_spans=False) as mode:
                    assert kernels._registration.gate is None
                    _functional(dist.group.WORLD)
                assert mode.get_comm_counts() == {"_c10d_functional.all_reduce": 1}
        said = [r.getMessage() for r in caplog.records if "build-native" in r.getMessage()]
        assert len(said) == 1
    finally:
        native.forget()


def test_a_gate_that_fails_to_register_leaves_the_python_kernels(fake_world, gate_on, monkeypatch, caplog):
    """Registering through the gate raising (a torch it does not fit): the Python kernels record alone."""

    class Broken:
        def register(self, *args):
            raise RuntimeError("does not fit this torch")

        def unregister_all(self):
            pass

        def set_recording(self, on):
            pass

    monkeypatch.setattr(native._lookup, "module", Broken())
    try:
        with caplog.at_level(logging.INFO, logger="hp_otel"):
            with hp_otel.CommDebugMode(module=torch.nn.Linear(2, 2), record_spans=False) as mode:
                assert kernels._registration.gate is None and kernels.registered()
                _functional(dist.group.WORLD)
        assert mode.get_comm_counts() == {"_c10d_functional.all_reduce": 1}
        assert any("does not fit this torch" in r.getMessage() for r in caplog.records)
        assert native.gate() is None
    finally:
        native.forget()
