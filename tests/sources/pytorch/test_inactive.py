"""Inactive costs nothing: after a plain window closes, no hp_otel code runs on a collective.

The collective kernels are registered while a window records through them and taken out
by the last window to close, unless hooks are kept (`hp_otel.install()`, the always-on
instrumentor): then they stay and pass calls through until `hp_otel.uninstall()`.
"What runs" is seen by a profile function (`sys.setprofile`) that notes every Python
frame whose code lives in the hp_otel package; it is shown to see our kernels first, so
an empty result means something.  "As torch left it" is the dispatcher's own dump of
every op the kernels go on, compared before and after.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

import hp_otel
from hp_otel import CommDebugMode
from hp_otel.record import installation
from hp_otel.sources.pytorch import _compat, kernels
from hp_otel.sources.pytorch import dtensor as torch_dtensor
from hp_otel.sources.pytorch.collectives import collective_specs

_PACKAGE = os.path.dirname(hp_otel.__file__)
_COLLECTIVE_KERNEL = "_collective_kernel.<locals>.kernel"
_WAIT_KERNEL = "_wait_kernel.<locals>.kernel"


@pytest.fixture(autouse=True)
def _kernel_hook(monkeypatch):
    monkeypatch.delenv(torch_dtensor.HOOK_ENV, raising=False)
    # Windows here follow each other within milliseconds: as one-off windows unless a test says otherwise.
    monkeypatch.setattr(kernels, "REOPEN_WITHIN_S", 0.0)
    hp_otel.uninstall()
    yield
    hp_otel.uninstall()
    assert installation.lingering_count() == 0


@contextmanager
def _hp_otel_frames() -> Iterator[list[str]]:
    """The qualified names of the hp_otel functions that ran on this thread inside the block."""
    seen: list[str] = []

    def profile(frame, event, _arg) -> None:  # type: ignore[no-untyped-def]
        if event == "call" and frame.f_code.co_filename.startswith(_PACKAGE):
            seen.append(frame.f_code.co_qualname)

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        yield seen
    finally:
        sys.setprofile(previous)


def _collectives() -> None:
    """An eager c10d op, a functional collective and its wait (three kernels when registered)."""
    t = torch.ones(4)
    dist.all_reduce(t)
    funcol.wait_tensor(torch.ops._c10d_functional.all_reduce(t, "sum", dist.group.WORLD.group_name))


def _ops() -> list[object]:
    return [*collective_specs(), _compat.WAIT_TENSOR]


def _dispatcher() -> dict[str, str]:
    """What torch's dispatcher holds for every op the kernels go on."""
    return {str(op): torch._C._dispatch_dump(_compat.op_schema(op).name) for op in _ops()}


def _has_our_kernels() -> list[bool]:
    return [_compat.dispatch_has_kernel_for_dispatch_key(_compat.op_schema(op).name, "BackendSelect") for op in _ops()]


def _run_spied(fn: Callable[[], None]) -> list[str]:
    with _hp_otel_frames() as seen:
        fn()
    return seen


def test_after_a_plain_window_no_hp_otel_code_runs_and_the_dispatcher_is_as_before(fake_world) -> None:
    before = _dispatcher()
    assert not any(_has_our_kernels())
    with CommDebugMode() as mode:
        inside = _run_spied(_collectives)
        assert all(_has_our_kernels())
    assert {_COLLECTIVE_KERNEL, _WAIT_KERNEL} <= set(inside)  # the spy sees our kernels
    assert mode.get_comm_counts() == {"c10d.allreduce_": 1, "_c10d_functional.all_reduce": 1}
    assert _run_spied(_collectives) == []
    assert not kernels.registered() and installation.lingering_count() == 0
    assert _dispatcher() == before
    with CommDebugMode() as again:  # the next window registers them anew and records
        _collectives()
    assert again.get_comm_counts() == mode.get_comm_counts()
    assert _run_spied(_collectives) == [] and _dispatcher() == before


def test_kept_hooks_keep_the_kernels_until_uninstall(fake_world) -> None:
    before = _dispatcher()
    hp_otel.install()
    with CommDebugMode():
        _collectives()
    between = _run_spied(_collectives)
    # they pass the calls on: in Python, or behind the native gate in C++ without entering Python
    python = kernels._registration.gate is None
    assert between.count(_COLLECTIVE_KERNEL) == 3 * python and between.count(_WAIT_KERNEL) == 1 * python
    assert kernels.registered() and kernels.in_use() == 0
    with CommDebugMode() as mode:  # taken over, not registered again
        _collectives()
    assert mode.get_comm_counts() == {"c10d.allreduce_": 1, "_c10d_functional.all_reduce": 1}
    hp_otel.uninstall()
    assert _run_spied(_collectives) == [] and _dispatcher() == before


def test_the_instrumentor_keeps_them_while_instrumented(fake_world) -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider

    from hp_otel.always_on.instrumentor import HpOtelInstrumentor

    before = _dispatcher()
    instrumentor = HpOtelInstrumentor()
    # both providers given: without them the instrumentor configures hp_otel's process-wide telemetry,
    # which later tests' default windows would then use (their in-memory reader None)
    instrumentor.instrument(
        tracer_provider=TracerProvider(shutdown_on_exit=False), meter_provider=MeterProvider(shutdown_on_exit=False)
    )
    try:
        with hp_otel.step(0):
            _collectives()
        assert kernels.registered()  # kept between its steps
    finally:
        instrumentor.uninstrument()
    assert _run_spied(_collectives) == [] and _dispatcher() == before


def test_an_inner_window_closing_leaves_them_to_the_outer(fake_world) -> None:
    with CommDebugMode() as outer:
        with CommDebugMode() as inner:
            _collectives()
        assert kernels.registered() and kernels.in_use() == 1
        _collectives()  # the outer window still records (what ran inside the inner one is the inner's)
    assert inner.get_comm_counts() == {"c10d.allreduce_": 1, "_c10d_functional.all_reduce": 1}
    assert outer.get_comm_counts() == {"c10d.allreduce_": 1, "_c10d_functional.all_reduce": 1}
    assert not kernels.registered() and kernels.in_use() == 0
    assert _run_spied(_collectives) == []


def test_a_window_on_another_thread_keeps_them_until_it_closes(fake_world) -> None:
    opened, main_closed, done = threading.Event(), threading.Event(), threading.Event()
    result: dict[str, object] = {}

    def other() -> None:
        try:
            with CommDebugMode() as mode:
                opened.set()
                main_closed.wait(30)
                _collectives()  # after the main thread's window closed
            result["counts"] = mode.get_comm_counts()
        except BaseException as exc:  # reported by the main thread
            result["error"] = exc
        finally:
            opened.set()
            done.set()

    thread = threading.Thread(target=other)
    thread.start()
    try:
        assert opened.wait(30)
        with CommDebugMode() as mine:
            _collectives()
        assert kernels.registered() and kernels.in_use() == 1  # the other thread's window still uses them
    finally:
        main_closed.set()
        thread.join(30)
    assert done.is_set() and "error" not in result, result
    assert result["counts"] == {"c10d.allreduce_": 1, "_c10d_functional.all_reduce": 1}
    # the other window counts what ran on its thread; the main thread's window sees the main thread's
    assert mine.get_comm_counts()["c10d.allreduce_"] >= 1
    assert not kernels.registered() and _run_spied(_collectives) == []


def test_uninstall_inside_a_window_leaves_its_kernels_until_it_closes(fake_world) -> None:
    before = _dispatcher()
    hp_otel.install()
    with CommDebugMode() as mode:
        hp_otel.uninstall()
        assert kernels.registered()
        _collectives()
    assert mode.get_comm_counts() == {"c10d.allreduce_": 1, "_c10d_functional.all_reduce": 1}
    assert _run_spied(_collectives) == [] and _dispatcher() == before


def test_registering_again_makes_no_kernel_and_imports_nothing(fake_world, monkeypatch) -> None:
    with CommDebugMode():
        _collectives()
    made = dict(kernels._kernels)
    libraries = dict(kernels._libraries)
    hidden: list[object] = []
    monkeypatch.setattr(_compat, "hide_from_dynamo", lambda fn: hidden.append(fn) or fn)
    with CommDebugMode() as mode:
        _collectives()
    assert mode.get_comm_counts() == {"c10d.allreduce_": 1, "_c10d_functional.all_reduce": 1}
    assert hidden == [] and kernels._kernels == made
    assert all(kernels._libraries[ns] is lib for ns, lib in libraries.items())


def test_a_failed_registration_falls_back_and_leaves_torch_as_it_was(fake_world, monkeypatch) -> None:
    """Someone else's BackendSelect kernel on one op: ours are not put in, the dispatch mode sees collectives."""
    before = _dispatcher()
    foreign = torch.library.Library("c10d", "IMPL")
    barrier = torch.ops.c10d.barrier.default

    def theirs(keyset, *args, **kwargs):  # type: ignore[no-untyped-def]
        return _compat.redispatch_boxed(barrier)(keyset.remove(_compat.DispatchKey.BackendSelect), *args, **kwargs)

    foreign.impl("barrier", theirs, "BackendSelect", with_keyset=True)
    monkeypatch.setattr(kernels._registration, "error", None)
    try:
        with CommDebugMode() as mode:
            assert torch_dtensor.collective_hook() == torch_dtensor.DISPATCH_MODE
            dist.all_reduce(torch.ones(2))
        assert "already has a BackendSelect kernel" in str(kernels.registration_error())
        assert mode.get_comm_counts() == {"c10d.allreduce_": 1}
        assert not kernels.registered() and kernels.in_use() == 0
        ours = [has for op, has in zip(_ops(), _has_our_kernels(), strict=True) if op is not barrier]
        assert not any(ours)
    finally:
        foreign._destroy()
        monkeypatch.setattr(kernels._registration, "error", None)
    assert _dispatcher() == before


def test_windows_one_after_another_keep_the_kernels_until_uninstall(fake_world, monkeypatch, caplog) -> None:
    """A window per step would register the kernels again every step (≈1.5 M instructions): once a
    plain window opens within REOPEN_WITHIN_S of the previous one's end, they stay between windows
    (said once), as under install(); uninstall() takes them out, and the next window starts afresh."""
    monkeypatch.setattr(kernels, "REOPEN_WITHIN_S", 0.5)
    before = _dispatcher()
    with CommDebugMode():
        _collectives()
    assert not kernels.registered() and _dispatcher() == before  # the first window: a one-off so far
    with caplog.at_level("INFO", logger="hp_otel"):
        for _ in range(3):
            with CommDebugMode() as mode:
                _collectives()
            assert kernels.registered() and installation.lingering_count() == 1
    told = [r for r in caplog.records if "one after another" in r.getMessage()]
    assert len(told) <= 1  # once per process (an earlier test may have said it already)
    assert mode.get_total_counts() > 0
    assert _COLLECTIVE_KERNEL in _run_spied(_collectives)  # kept: they pass calls through
    hp_otel.uninstall()
    assert not kernels.registered() and _dispatcher() == before
    with CommDebugMode():  # right after uninstall(): a one-off window again
        _collectives()
    assert not kernels.registered() and _run_spied(_collectives) == []


def test_windows_further_apart_unregister_each_time(fake_world, monkeypatch) -> None:
    monkeypatch.setattr(kernels, "REOPEN_WITHIN_S", 0.05)
    before = _dispatcher()
    for _ in range(3):
        with CommDebugMode() as mode:
            _collectives()
        assert mode.get_total_counts() > 0
        assert not kernels.registered() and _dispatcher() == before
        time.sleep(0.1)
