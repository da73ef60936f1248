"""Lifecycle soak: 10 000 windows on 4 threads at once, with the user's code raising at
random points of forward and backward, nested windows, and windows reused after clear().

Afterwards nothing of hp_otel is left: no hook on any module, no global module hook, no
torch function or dispatch mode, every patched attribute is its original object (`is`),
no grad hook on the inputs, the OTel context as it was — and memory after `clear()`
grows by less than a fixed bound (tracemalloc).  Most windows drive the observer
directly (cheap); one in eight runs a real TP-MLP step over the fake process group.
"""

from __future__ import annotations

import gc
import importlib
import random
import threading
import time
import tracemalloc
from typing import ClassVar

import pytest
import torch
import torch.nn.functional as F
from events import collective, design_mlp_forward
from opentelemetry import context as otel_context
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.nn.modules import module as torch_module
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from hp_otel import CommDebugMode
from hp_otel.mode import registry
from hp_otel.sources.pytorch import dtensor as torch_dtensor
from hp_otel.workloads.tp_mlp import MLP

pytestmark = pytest.mark.soak  # 10,000 windows on 4 threads

WINDOWS = 10_000
THREADS = 4
MEMORY_WINDOWS = 600
MEMORY_BOUND_BYTES = 256 * 1024
REDISTRIBUTE_MODULES = (
    "torch.distributed.tensor._redistribute",
    "torch.distributed.tensor._dispatch",
    "torch.distributed.tensor._api",
)
FORWARD_POINTS = ("after_fc1", "after_gelu", "after_fc2")
BACKWARD_POINTS = ("backward_start", "backward_between")


class UserError(Exception):
    """The user's own code failing."""


class _Bomb(torch.autograd.Function):
    """Raises the armed error in backward (kept off the autograd node: a node holding the
    exception whose traceback holds the graph is a cycle through C++ that gc cannot free)."""

    armed: ClassVar[dict[int, BaseException]] = {}

    @staticmethod
    def forward(ctx, t):
        ctx.thread = threading.get_ident()
        return t.view_as(t)

    @staticmethod
    def backward(ctx, grad):
        raise _Bomb.armed.pop(ctx.thread)


class SoakMLP(MLP):
    """The TP MLP whose forward or backward raises at an armed point."""

    fail_at: str | None = None
    error: BaseException | None = None

    def _maybe(self, point: str, t: torch.Tensor) -> torch.Tensor:
        if self.fail_at == point:
            if point.startswith("backward"):
                _Bomb.armed[threading.get_ident()] = self.error
                return _Bomb.apply(t)
            raise self.error
        return t

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self._maybe("after_fc1", self.fc1(x))
        h = self._maybe("backward_between", self._maybe("after_gelu", F.gelu(h)))
        return self._maybe("backward_start", self._maybe("after_fc2", self.fc2(h)))


def _model(world: int) -> torch.nn.Module:
    torch.manual_seed(0)
    mesh = init_device_mesh("cpu", (world,))
    return parallelize_module(SoakMLP(), mesh, {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})


class _CutObserver:
    """Passes events on to an observer; the user's code raises just before event number `cut`."""

    def __init__(self, observer, cut: int, error: BaseException) -> None:
        self._observer, self._cut, self._error, self._events = observer, cut, error, 0

    def __getattr__(self, name):
        def call(*args, **kwargs):
            self._events += 1
            if self._events == self._cut:
                raise self._error
            return getattr(self._observer, name)(*args, **kwargs)

        return call


def _synthetic_window(rng: random.Random, mode: CommDebugMode) -> None:
    """Observer events of the design's MLP, cut off by the user's exception at a random event."""
    cut = rng.randrange(12)
    error = UserError("synthetic")
    try:
        with mode:
            design_mlp_forward(_CutObserver(mode.observer, cut, error))
            collective(mode.observer)
    except UserError as caught:
        assert caught is error
        assert 0 < cut <= 11
        return
    assert cut == 0 or cut > 11, cut
    assert mode.get_total_counts() == 2


def _nested_windows(rng: random.Random) -> int:
    with CommDebugMode() as outer:
        collective(outer.observer)
        try:
            with CommDebugMode() as inner:
                collective(inner.observer)
                if rng.random() < 0.5:
                    raise UserError("inner")
        except UserError:
            pass
        collective(outer.observer)
    assert (outer.get_total_counts(), inner.get_total_counts()) == (2, 1)
    return 2


def _dtensor_window(rng: random.Random, model: torch.nn.Module, x: torch.Tensor) -> None:
    point = rng.choice((None, *FORWARD_POINTS, *BACKWARD_POINTS))
    error = UserError(f"user code failed at {point}")
    model.fail_at, model.error = point, error
    try:
        with CommDebugMode(module=model) as mode:
            model(x).sum().backward()
    except UserError as caught:
        assert caught is error and point is not None
        assert mode.get_total_counts() <= 2
    else:
        assert point is None
        assert mode.get_comm_counts() == {"_c10d_functional.all_reduce": 2}
    finally:
        model.fail_at = None
        model.zero_grad(set_to_none=True)
        x.grad = None
    assert mode.get_callback_error_counts() == {}


def _run_windows(count: int, seed: int, model: torch.nn.Module, reused: CommDebugMode) -> dict[str, int]:
    rng = random.Random(seed)
    x = torch.randn(4, 16, requires_grad=True)
    done = {"synthetic": 0, "reused": 0, "nested": 0, "dtensor": 0}
    windows = 0
    while windows < count:
        draw = rng.random()
        if draw < 0.125:
            _dtensor_window(rng, model, x)
            done["dtensor"] += 1
            windows += 1
        elif draw < 0.225:
            windows += _nested_windows(rng)
            done["nested"] += 2
        elif draw < 0.45:
            _synthetic_window(rng, reused)  # the same mode, entered again: its records are cleared
            done["reused"] += 1
            windows += 1
        else:
            _synthetic_window(rng, CommDebugMode())
            done["synthetic"] += 1
            windows += 1
    assert not x._backward_hooks
    return done


def _thread_state() -> tuple:
    return (
        torch._C._len_torch_function_stack(),
        len(_get_current_dispatch_mode_stack()),
        registry.current_mode.get(),
        torch_dtensor._redistribute_slot.in_context(),
        otel_context.get_current(),
    )


def _global_hooks() -> list[int]:
    names = [n for n in dir(torch_module) if n.startswith("_global_") and n.endswith("hooks")]
    return [len(getattr(torch_module, n)) for n in names]


def _module_hooks(model: torch.nn.Module) -> list[dict]:
    return [
        dict(hooks)
        for m in model.modules()
        for hooks in (m._forward_pre_hooks, m._forward_hooks, m._backward_hooks, m._backward_pre_hooks)
    ]


def test_soak_leaves_nothing_behind(fake_world) -> None:
    originals = [importlib.import_module(m).redistribute_local_tensor for m in REDISTRIBUTE_MODULES]
    clean = _thread_state()
    global_hooks = _global_hooks()
    models = [_model(fake_world) for _ in range(THREADS)]
    own_hooks = [_module_hooks(model) for model in models]  # parallelize_module's own hooks stay
    results: list[dict[str, int]] = []
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            results.append(_run_windows(WINDOWS // THREADS, seed=i, model=models[i], reused=CommDebugMode()))
            assert _thread_state()[:4] == (0, 0, None, None)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    start = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - start
    assert errors == []
    total = {k: sum(r[k] for r in results) for k in results[0]}
    print(f"\nsoak: {sum(total.values())} windows on {THREADS} threads in {seconds:.1f} s: {total}")
    assert sum(total.values()) >= WINDOWS and all(total.values())

    assert _thread_state() == clean
    assert _global_hooks() == global_hooks
    assert [_module_hooks(model) for model in models] == own_hooks
    now = [importlib.import_module(m).redistribute_local_tensor for m in REDISTRIBUTE_MODULES]
    assert all(a is b for a, b in zip(now, originals, strict=True))
    assert torch_dtensor._redistribute_patches.patches == []


def _collect_waiting_metrics(mode: CommDebugMode) -> None:
    """What a metric reader's collection does: the durations, bandwidths and exposure rows waiting for
    it (bounded buffers: up to 8,192 values, 256 windows) are recorded, so the snapshots compare growth,
    not where each buffer stood in its cycle (earlier tests in the session move that)."""
    instruments = mode._recorder._instruments
    instruments.durations.flush()
    instruments.busbw.flush()
    instruments.exposure.flush()


def test_memory_after_clear_is_bounded(fake_world) -> None:
    model = _model(fake_world)
    reused = CommDebugMode(module=model)
    _run_windows(MEMORY_WINDOWS // 3, seed=10, model=model, reused=CommDebugMode())  # warm caches
    _collect_waiting_metrics(reused)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        _run_windows(MEMORY_WINDOWS, seed=11, model=model, reused=CommDebugMode())
        with reused:
            model(torch.randn(4, 16)).sum()
        reused.clear()
        _collect_waiting_metrics(reused)
        gc.collect()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    total = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    ours_filter = [tracemalloc.Filter(True, "*/hp_otel/*")]  # allocated by a line of hp_otel's code
    ours = sum(
        stat.size_diff
        for stat in after.filter_traces(ours_filter).compare_to(before.filter_traces(ours_filter), "filename")
    )
    # torch keeps the unwaited collectives of steps the user's code aborted (its WorkRegistry):
    # that part of the total is torch's; the bound is on what hp_otel's code allocated.
    print(
        f"\nmemory growth over {MEMORY_WINDOWS} windows after clear(): hp_otel {ours / 1024:.1f} KiB, "
        f"process total {total / 1024:.1f} KiB"
    )
    assert ours < MEMORY_BOUND_BYTES
