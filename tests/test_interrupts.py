"""Ctrl-C while a window is entered or exited leaves nothing of hp_otel installed.

A real SIGINT (`signal.raise_signal`) is sent at many points of `__enter__` and
`__exit__`: a line-trace hook counts the lines Python runs there (ours, torch's hook
registration, the mode stacks) and raises the signal at the N-th one. After the
`KeyboardInterrupt` the function and dispatch mode stacks, every module's hooks, the
patched redistribute function, the current mode and the SIGINT handler must all be as
they were before the window.
"""

from __future__ import annotations

import functools
import inspect
import signal
import sys
import threading
import time

import pytest
import torch
import torch.distributed.tensor
from torch.overrides import _get_current_function_mode_stack
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

import hp_otel.mode as mode_module
from hp_otel import CommDebugMode
from hp_otel.signal_guard import signals_deferred

REDISTRIBUTE_MODULES = (
    "torch.distributed.tensor._redistribute",
    "torch.distributed.tensor._dispatch",
    "torch.distributed.tensor._api",
)
MODULES = 12


def _model() -> torch.nn.Module:
    return torch.nn.Sequential(*(torch.nn.Linear(4, 4) for _ in range(MODULES)))


def _state(model: torch.nn.Module) -> tuple[object, ...]:
    """Everything a window installs, as comparable values."""
    hooks = sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in model.modules())
    redistribute = tuple(id(vars(sys.modules[name]).get("redistribute_local_tensor")) for name in REDISTRIBUTE_MODULES)
    return (
        len(_get_current_function_mode_stack()),
        len(_get_current_dispatch_mode_stack()),
        hooks,
        redistribute,
        mode_module._current_mode.get(),
        signal.getsignal(signal.SIGINT),
    )


class _SignalAtLine:
    """A trace function that sends SIGINT to this process at the N-th line run (None: only count)."""

    def __init__(self, target: int | None) -> None:
        self.target = target
        self.lines = 0
        self.where: tuple[object, int] | None = None

    def __call__(self, frame, event, arg):  # type: ignore[no-untyped-def]
        if event == "line":
            self.lines += 1
            if self.lines == self.target:
                self.where = (frame.f_code, frame.f_lineno)
                signal.raise_signal(signal.SIGINT)
        return self


def _traced(call, target: int | None) -> tuple[int, BaseException | None, tuple[object, int] | None]:
    tracer = _SignalAtLine(target)
    error = None
    sys.settrace(tracer)
    try:
        call()
    except KeyboardInterrupt as exc:
        error = exc
    finally:
        sys.settrace(None)
    return tracer.lines, error, tracer.where


def _before_exit_defers(where: tuple[object, int] | None) -> bool:
    """The one place no Python code can guard: `__exit__`'s lines before its `signals_deferred()`.

    A signal Python handles there (at the call of `__exit__`, or at its first line: a
    traced exception there is reported at the `try` before it) raises before any code of
    ours runs. It is a window of a few bytecodes between the body's end and the guard.
    """
    code = CommDebugMode.__exit__.__code__
    if where is None or where[0] is not code:
        return False
    lines, first = inspect.getsourcelines(CommDebugMode.__exit__)
    guard = next(i for i, line in enumerate(lines) if "signals_deferred()" in line) + first
    return where[1] <= guard


def _offsets(total: int, samples: int = 60) -> list[int]:
    """Every one of the first and last 25 lines, and `samples` spread over the rest."""
    edges = set(range(1, min(total, 25) + 1)) | set(range(max(1, total - 24), total + 1))
    step = max(total // samples, 1)
    return sorted(edges | set(range(1, total + 1, step)))


@pytest.fixture
def model() -> torch.nn.Module:
    if threading.current_thread() is not threading.main_thread():
        pytest.fail("signals are delivered on the main thread only; run this test there")
    return _model()


def test_sigint_during_enter_leaves_nothing_installed(model: torch.nn.Module) -> None:
    before = _state(model)
    with CommDebugMode(model, engine="torch"):  # warm the caches, so every try runs the same lines
        pass
    mode = CommDebugMode(model, engine="torch")
    total, error, _ = _traced(mode.__enter__, None)
    assert error is None and _state(model) != before
    mode.__exit__(None, None, None)
    assert _state(model) == before

    leaks = []
    for offset in _offsets(total):
        mode = CommDebugMode(model, engine="torch")
        _, error, _ = _traced(mode.__enter__, offset)
        if error is None:  # the signal came after the last point that checks for it: the window is entered
            mode.__exit__(None, None, None)
            leaks.append((offset, "not raised"))
        if _state(model) != before:
            leaks.append((offset, _state(model)))
            mode.__exit__(None, None, None)  # clean up for the next offset
    assert not leaks, (
        f"{len({o for o, _ in leaks})} of {len(_offsets(total))} offsets in {total} lines leaked: {leaks[:2]}"
    )


def test_sigint_during_exit_still_uninstalls_everything(model: torch.nn.Module) -> None:
    before = _state(model)
    with CommDebugMode(model, engine="torch"):
        pass
    mode = CommDebugMode(model, engine="torch")
    mode.__enter__()
    total, error, _ = _traced(functools.partial(mode.__exit__, None, None, None), None)
    assert error is None and _state(model) == before

    leaks, unguarded = [], 0
    for offset in _offsets(total):
        mode = CommDebugMode(model, engine="torch")
        mode.__enter__()
        _, error, where = _traced(functools.partial(mode.__exit__, None, None, None), offset)
        if error is None:
            leaks.append((offset, "not raised"))
        if _state(model) != before or mode.active:
            mode.__exit__(None, None, None)
            if _before_exit_defers(where):
                unguarded += 1
                continue
            leaks.append((offset, where))
    assert unguarded <= 2  # `try:` and the line after it, nothing more
    assert not leaks, (
        f"{len({o for o, _ in leaks})} of {len(_offsets(total))} offsets in {total} lines leaked: {leaks[:2]}"
    )


def test_sigint_in_a_window_body_still_counts_and_cleans_up(model: torch.nn.Module) -> None:
    """A Ctrl-C inside the traced code reaches the user as usual; the window is gone afterwards."""
    before = _state(model)
    with pytest.raises(KeyboardInterrupt):
        with CommDebugMode(model, engine="torch"):
            model(torch.ones(2, 4))
            signal.raise_signal(signal.SIGINT)
    assert _state(model) == before


def test_deferred_signal_reaches_a_users_own_handler_once() -> None:
    seen: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: seen.append(signum))
    try:
        with signals_deferred():
            signal.raise_signal(signal.SIGINT)
            assert seen == []  # held back while the block runs
            assert signal.getsignal(signal.SIGINT) is not previous
        assert seen == [signal.SIGINT]
        assert signal.getsignal(signal.SIGINT).__class__ is not signals_deferred
    finally:
        signal.signal(signal.SIGINT, previous)


def test_deferral_off_the_main_thread_changes_nothing() -> None:
    result: list[object] = []

    def run() -> None:
        with signals_deferred():
            result.append(signal.getsignal(signal.SIGINT))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert result == [signal.getsignal(signal.SIGINT)]


def test_sigint_from_another_thread_at_random_times(model: torch.nn.Module) -> None:
    """The interrupt as a user sends it: from outside, at any moment of a stream of windows."""
    before = _state(model)
    interrupts = 0
    for delay_us in range(0, 3000, 100):
        timer = threading.Timer(delay_us / 1e6, signal.raise_signal, (signal.SIGINT,))
        timer.start()
        try:
            for _ in range(200):
                with CommDebugMode(model, engine="torch"):
                    pass
            timer.join()
            time.sleep(0.001)  # the signal is handled at the next bytecode boundary of this thread
        except KeyboardInterrupt:
            interrupts += 1
        timer.join()
        assert _state(model) == before, f"installed after an interrupt {delay_us} us into the windows"
    assert interrupts > 0
