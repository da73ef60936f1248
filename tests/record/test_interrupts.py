"""Ctrl-C while a window is entered or exited leaves nothing of hp_otel installed.

A real SIGINT (`signal.raise_signal`) is sent at every point of `with mode: pass` where
Python would run a signal handler (function entries and call returns, found with a
profile hook: ours, torch's hook registration, the mode stacks). After the
`KeyboardInterrupt` (which must come) the function and dispatch mode stacks, every
module's hooks, the patched redistribute function, the current mode and the SIGINT
handler must all be as they were before the window.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time
from collections.abc import Iterator

import pytest
import torch
import torch.distributed.tensor
from torch.overrides import _get_current_function_mode_stack
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from hp_otel import CommDebugMode
from hp_otel.mode import registry
from hp_otel.record import signal_guard

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
        registry.current_mode.get(),
        signal.getsignal(signal.SIGINT),
    )


class _SignalAtEvent:
    """A profile function that sends SIGINT to this process at the N-th check point (None: only count).

    Python runs a signal's handler when a function starts and when a call returns; the
    profile events `call`, `return` and `c_return` are exactly those points (C calls
    included: torch's hook registration, `signal.signal`). Sending the signal there is a
    Ctrl-C that Python handles at that point.
    """

    def __init__(self, target: int | None, skip: frozenset[object] = frozenset()) -> None:
        self.target = target
        self.points = 0
        self.skip = skip
        self.where: tuple[str, str] | None = None

    def __call__(self, frame, event, arg):  # type: ignore[no-untyped-def]
        if event not in ("call", "return", "c_return") or (event, frame.f_code) in self.skip:
            return
        self.points += 1
        if self.points == self.target:
            self.where = (event, f"{frame.f_code.co_name}:{frame.f_lineno}")
            signal.raise_signal(signal.SIGINT)


def _window(mode: CommDebugMode) -> None:
    with mode:
        pass


# The profile's own call into `_window`, and `__enter__`'s return: a `with` statement goes
# straight from `__enter__` into its block (no signal is handled in between; a direct
# `__enter__()` caller must handle one itself, as the instrumentor does).
_NOT_CHECK_POINTS = frozenset(
    {("call", _window.__code__), ("return", _window.__code__), ("return", CommDebugMode.__enter__.__code__)}
)


def _interrupted_window(model: torch.nn.Module, target: int | None) -> tuple[int, BaseException | None, object]:
    profiler = _SignalAtEvent(target, _NOT_CHECK_POINTS)
    mode = CommDebugMode(model, engine="torch")
    error = None
    sys.setprofile(profiler)
    try:
        _window(mode)
    except KeyboardInterrupt as exc:
        error = exc
    finally:
        sys.setprofile(None)
    return profiler.points, error, profiler.where


@pytest.fixture(autouse=True)
def _python_ctrl_c() -> Iterator[None]:
    """A pytest started in the background by a shell without job control inherits SIGINT ignored, and
    Python then keeps SIG_IGN: these tests get Python's usual Ctrl-C handler, as a terminal gives it."""
    inherited = signal.getsignal(signal.SIGINT)
    if inherited == signal.SIG_IGN and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        if inherited == signal.SIG_IGN and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.fixture
def model() -> torch.nn.Module:
    if threading.current_thread() is not threading.main_thread():
        pytest.fail("signals are delivered on the main thread only; run this test there")
    model = _model()
    with CommDebugMode(model, engine="torch"):  # warm the caches, so every try runs the same calls
        pass
    return model


def test_sigint_at_every_point_of_enter_and_exit_leaves_nothing_installed(model: torch.nn.Module) -> None:
    before = _state(model)
    total, error, _ = _interrupted_window(model, None)
    assert error is None and _state(model) == before and total > 100

    leaks, unreached = [], 0
    for point in range(1, total + 1):
        _, error, where = _interrupted_window(model, point)
        after = _state(model)
        # A later window can take fewer calls than the first one counted; a point past its end raises no
        # signal, so only the clean-up is checked there.
        unreached += where is None
        swallowed = where is not None and error is None
        if swallowed or after != before or signal_guard.GUARD.critical or signal_guard.GUARD.held:
            leaks.append((point, where, error is not None, after))
            for _ in range(3):  # clean up for the next point
                if registry.current_mode.get() is not None:
                    registry.current_mode.get().__exit__(None, None, None)
            registry.current_mode.set(None)
    assert not leaks, f"{len(leaks)} of {total} points left hp_otel installed or swallowed the signal: {leaks[:2]}"
    assert unreached < total // 10, f"only {total - unreached} of {total} points were reached"  # still every path


def test_sigint_in_a_window_body_still_counts_and_cleans_up(model: torch.nn.Module) -> None:
    """A Ctrl-C inside the traced code reaches the user as usual; the window is gone afterwards."""
    before = _state(model)
    with pytest.raises(KeyboardInterrupt):
        with CommDebugMode(model, engine="torch"):
            model(torch.ones(2, 4))
            signal.raise_signal(signal.SIGINT)
    assert _state(model) == before


def test_a_users_handler_gets_the_held_signal_once_and_is_put_back(model: torch.nn.Module) -> None:
    seen: list[int] = []

    def mine(signum, frame):  # type: ignore[no-untyped-def]
        seen.append(signum)

    previous = signal.signal(signal.SIGINT, mine)
    try:
        with CommDebugMode(model, engine="torch"):
            assert signal_guard.is_installed()
            signal.raise_signal(signal.SIGINT)  # in the body: straight to the user's handler
            assert seen == [signal.SIGINT]
        assert signal.getsignal(signal.SIGINT) is mine
        _, error, where = _interrupted_window(model, 40)  # held while installing, then delivered once
        assert error is None and seen == [signal.SIGINT] * 2, where
        assert signal.getsignal(signal.SIGINT) is mine and registry.current_mode.get() is None
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_handler_set_inside_a_window_stays(model: torch.nn.Module) -> None:
    previous = signal.getsignal(signal.SIGINT)
    try:
        with CommDebugMode(model, engine="torch"):
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)


def test_windows_off_the_main_thread_leave_the_handlers_alone(model: torch.nn.Module) -> None:
    seen: list[object] = []

    def run() -> None:
        with CommDebugMode(model, engine="torch"):
            seen.append(signal.getsignal(signal.SIGINT))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert seen == [signal.getsignal(signal.SIGINT)] and not signal_guard.is_installed()


def test_sigint_from_another_thread_at_random_times(model: torch.nn.Module) -> None:
    """The interrupt as a user sends it: from outside, at any moment of a stream of windows."""
    before = _state(model)
    swallowed: list[str] = []  # a KeyboardInterrupt printed as "Exception ignored" (a weakref callback, a __del__)
    hook = sys.unraisablehook
    sys.unraisablehook = lambda unraisable: swallowed.append(repr(unraisable.object))
    try:
        interrupts = _interrupt_windows(model, before)
    finally:
        sys.unraisablehook = hook
    assert swallowed == [], "the SIGINT was handled in code whose exceptions Python ignores"
    assert interrupts == 30, f"the SIGINT never arrived after {interrupts} of 30"


def _interrupt_windows(model: torch.nn.Module, before: tuple[object, ...]) -> int:
    interrupts = 0
    for delay_us in range(0, 3000, 100):
        timer = threading.Timer(delay_us / 1e6, signal.raise_signal, (signal.SIGINT,))
        try:
            timer.start()
            for _ in range(200):
                with CommDebugMode(model, engine="torch"):
                    pass
            timer.join()
            time.sleep(5)  # sent by now: handled at this thread's next bytecode boundary
            return interrupts  # the SIGINT never arrived: the caller says where it went
        except KeyboardInterrupt:
            interrupts += 1
        timer.join()
        assert _state(model) == before, f"installed after an interrupt {delay_us} us into the windows"
    return interrupts


def _python_calls_when_dropped(holder: list[CommDebugMode]) -> list[str]:
    """The Python functions that run when the last reference to a closed window (held by `holder` alone) goes."""
    ran: list[str] = []
    sys.setprofile(lambda frame, event, arg: ran.append(frame.f_code.co_qualname) if event == "call" else None)
    try:
        holder.clear()
    finally:
        sys.setprofile(None)
    return ran


def test_dropping_a_window_runs_no_python_code(model: torch.nn.Module) -> None:
    """A window is dropped in the user's code, after its exit: Python code run then (a weakref
    callback, a `__del__`) is where a Ctrl-C would be printed as "Exception ignored" and lost."""
    mode = CommDebugMode(model, engine="torch")
    with mode:
        model(torch.ones(2, 4))
    holder = [mode]
    del mode
    assert _python_calls_when_dropped(holder) == []


def test_dropping_a_traced_window_with_metrics_runs_no_python_code(tp_mlp) -> None:
    """The same for a window that built spans and counted metrics (its builder and instruments hold
    the recorder's fault sink)."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from hp_otel.workloads.tp_mlp import train_step

    model, x = tp_mlp
    reader = InMemoryMetricReader()
    mode = CommDebugMode(module=model, meter_provider=MeterProvider(metric_readers=[reader]))
    with mode:
        train_step(model, x)
    assert len(mode.get_finished_spans()) > 0 and reader.get_metrics_data() is not None
    holder = [mode]
    del mode
    assert _python_calls_when_dropped(holder) == []


def test_the_guard_put_back_later_by_code_that_saved_it_still_works(model: torch.nn.Module) -> None:
    with CommDebugMode(model, engine="torch"):
        saved = signal.getsignal(signal.SIGINT)  # the guard
    signal.signal(signal.SIGINT, saved)  # e.g. a library restoring what it saw
    try:
        with CommDebugMode(model, engine="torch"):
            pass
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def test_sigint_while_deferred_spans_are_built_loses_none_of_them(tp_mlp) -> None:
    """A real Ctrl-C lands inside the span build (from a hook, the 2nd collective's): the read that
    was interrupted raises it; the events it had not built yet go back, and the next read builds
    every span an uninterrupted window keeps."""
    from hp_otel.spans import schema
    from hp_otel.workloads.tp_mlp import train_step

    if threading.current_thread() is not threading.main_thread():
        pytest.fail("signals are delivered on the main thread only; run this test there")
    model, x = tp_mlp
    steps = 20

    def kinds(spans) -> dict[str, int]:
        out: dict[str, int] = {}
        for span in spans:
            kind = span.attributes.get(schema.CALL_KIND, "")
            out[kind] = out.get(kind, 0) + 1
        return out

    with CommDebugMode(module=model) as reference:
        for _ in range(steps):
            train_step(model, x)
    expected = kinds(reference.get_finished_spans())
    hooked: list[int] = []

    def interrupt_once(span, info) -> None:
        hooked.append(1)
        if len(hooked) == 2:
            signal.raise_signal(signal.SIGINT)

    with CommDebugMode(module=model, collective_hook=interrupt_once) as mode:
        for _ in range(steps):
            train_step(model, x)
    with pytest.raises(KeyboardInterrupt):
        mode.get_finished_spans()
    spans = mode.get_finished_spans()
    assert mode.get_total_counts() == 2 * steps == expected[schema.KIND_COLLECTIVE]
    assert kinds(spans) == expected and sum(expected.values()) == 300
    assert mode.get_callback_error_counts() == {}


@pytest.mark.parametrize("torch_hooks", ["default", "modes"])
def test_a_window_closed_on_another_thread_keeps_the_users_error_and_is_freed(
    model: torch.nn.Module, monkeypatch, torch_hooks: str
) -> None:
    """Entered on the main thread, exited on another (a callback thread ends the step): Python sets
    signal handlers on the main thread only, so putting the user's handler back there must wait;
    the user's own exception is what propagates, and the model is free for any thread's window.
    torch's modes (the fallback hooks) are a stack of the main thread: popped by its next window."""
    if torch_hooks == "modes":
        monkeypatch.setenv("HP_OTEL_TORCH_OP_HOOK", "mode")
        monkeypatch.setenv("HP_OTEL_TORCH_COLLECTIVE_HOOK", "dispatch")
    users_handler = signal.getsignal(signal.SIGINT)
    before = _state(model)
    mode = CommDebugMode(model, engine="torch")
    mode.__enter__()
    model(torch.ones(2, 4))
    raised: list[BaseException] = []

    def close_with_the_users_error() -> None:
        try:
            with contextlib.ExitStack() as stack:
                stack.push(mode)  # its __exit__ runs here, on this thread
                raise KeyError("the user's error")
        except BaseException as exc:
            raised.append(exc)

    closer = threading.Thread(target=close_with_the_users_error, name="closer")
    closer.start()
    closer.join()
    assert [type(exc) for exc in raised] == [KeyError], raised
    assert not mode.active and registry.traced_modules == {} and registry.windows_of_this_thread() == []
    assert _state(model)[2:4] == before[2:4]  # every module hook and patch out
    assert len(mode.get_finished_spans()) == MODULES + 1  # its records kept
    assert mode.get_callback_error_counts() == {}

    opened: list[int] = []  # freed: another thread may trace the model now
    other = threading.Thread(target=lambda: opened.append(_count_in_window(model)))
    other.start()
    other.join()
    assert opened == [1]
    # The guard stands in for the user's handler until it handles a signal (on the main thread),
    # then the user's handler is back, and a Ctrl-C is a KeyboardInterrupt as before.
    with pytest.raises(KeyboardInterrupt):
        signal.raise_signal(signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is users_handler and not signal_guard.is_installed()
    with CommDebugMode(model, engine="torch") as after:  # the main thread's next window: nested in nothing stale
        assert after._open.outer is None
    assert registry.current_mode.get() is None
    assert _state(model) == (*before[:5], users_handler)  # both mode stacks as they were


def _count_in_window(model: torch.nn.Module) -> int:
    with CommDebugMode(model, engine="torch") as window:
        model(torch.ones(2, 4))
    spans = window.get_finished_spans()
    return sum(1 for span in spans if span.name == "Sequential")


@pytest.mark.parametrize("live", [False, True], ids=["deferred", "live"])
@pytest.mark.parametrize("hook", ["module_hook", "op_hook", "collective_hook"])
def test_a_span_whose_hook_is_interrupted_is_kept(tp_mlp, hook: str, live: bool) -> None:
    """Ctrl-C inside the user's span hook: the interrupt reaches the user, and the span the hook
    ran on still ends and is kept (each span once), as are all the others."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from hp_otel.workloads.tp_mlp import train_step

    model, x = tp_mlp
    steps = 20
    with CommDebugMode(module=model) as reference:
        for _ in range(steps):
            train_step(model, x)
    expected = sorted(span.name for span in reference.get_finished_spans())
    assert len(expected) == 300
    calls: list[object] = []

    def interrupt_the_fifth(span, info) -> None:
        calls.append(span)
        if len(calls) == 5:
            raise KeyboardInterrupt

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    mode = CommDebugMode(module=model, tracer_provider=provider, live_spans=live, **{hook: interrupt_the_fifth})
    interrupted = 0
    try:
        with mode:
            for _ in range(steps):
                try:
                    train_step(model, x)
                except KeyboardInterrupt:  # live: raised in the step (which then stopped, so run one more)
                    interrupted += 1
                    train_step(model, x)
    except KeyboardInterrupt:  # deferred: spans for your processors are built as the window closes
        interrupted += 1
    assert not mode.active
    spans = mode.get_finished_spans()
    assert interrupted == 1 and len(calls) > 5
    exported = exporter.get_finished_spans()
    assert len({span.context.span_id for span in exported}) == len(exported)  # none twice
    ids = {span.context.span_id for span in exported}
    assert calls[4].end_time is not None and calls[4].context.span_id in ids  # the interrupted one: kept
    assert ids == {span.context.span_id for span in spans}
    if not live:
        assert sorted(span.name for span in spans) == expected == sorted(span.name for span in exported)
    else:  # the interrupted step stopped part-way, then ran again: every span of it that ended is kept
        assert len(spans) == len(exported) >= 300
