"""Python kernels on torch's collective ops: how collectives are seen without a dispatch mode.

A TorchDispatchMode sends every aten op of a step through Python (measured 1.24–1.33×
per step with a mode that does nothing).  Instead, each collective op overload that
`collective_specs()` knows gets a Python kernel on the `BackendSelect` dispatch key; no
other op pays anything.  `BackendSelect` is in every thread's included keys (also inside
DTensor's dispatch, which turns autograd and `ADInplaceOrView` off) and sits just above
the backends, so the kernel sees what reaches a backend: every DTensor redistribute,
FSDP2, DDP's C++ reducer, the backward of the functional autograd collectives, direct
`torch.ops` and `ProcessGroup` calls and the eager API — and the collectives of compiled
graphs, which keep running compiled — on any device.

The kernel goes on with `OperatorHandle.redispatch_boxed` to the keys after
`BackendSelect`, which releases the GIL while the backend runs, as every torch op called
from Python does.  (A kernel that replaces the CPU kernel and calls the one it replaced
through `call_boxed` keeps the GIL: gloo's worker thread, freeing a finished work's
tensors under the lock the next collective takes, then needs the GIL — a deadlock, seen
in the real-gloo tests and reproduced by tests/support/repro_kernel_gil_deadlock.py.)

Rules:
- registered on the first window and kept (registering costs ≈1.3 ms the first time, then
  ≈0.4 ms; the first also imports `torch._dynamo`, ≈0.8 s once per process): while no
  window records, a kernel reads one slot and redispatches (≈6–16 µs a collective op
  call, the round trip into Python); `hp_otel.uninstall()` unregisters them when no
  window is open;
- a collective op can call another (a functional `all_reduce` runs `c10d.allreduce_`
  through the dispatcher): only the outermost one on a thread is recorded, as a
  dispatch mode would;
- `_c10d_functional.wait_tensor` gets a kernel too: it completes functional collectives;
- kernels are hidden from dynamo (`_compat.hide_from_dynamo`): a compiled graph that
  calls a collective must not try to compile our Python.

Every private torch symbol used here (dispatch keys, `redispatch_boxed`, `Library._destroy`,
...) comes from `_compat`.
"""

from __future__ import annotations

import functools
import threading
import time
import warnings
from typing import Any

import torch

from hp_otel.record import installation
from hp_otel.sources.patching import ObserverSlot
from hp_otel.sources.pytorch import _compat
from hp_otel.sources.pytorch.collective_timer import CollectiveTimer
from hp_otel.sources.pytorch.collectives import CollectiveSpec

_KEY = "BackendSelect"
_BACKEND_SELECT = _compat.DispatchKey.BackendSelect
_META = _compat.DispatchKey.Meta


# The collective timer of this context's window, else the latest window's (autograd and
# communication threads): read once per collective call.
timer_slot: ObserverSlot[CollectiveTimer] = ObserverSlot("hp_otel_collective_timer")
_depth = threading.local()  # .active: a collective of this thread is being recorded
_lock = threading.Lock()
_libraries: dict[str, torch.library.Library] = {}  # namespace -> library, while registered
_kernels: dict[Any, Any] = {}  # op -> its kernel (hidden from dynamo), made on first registration
_state: dict[str, Any] = {"registered": False, "error": None}


def available() -> bool:
    """This torch takes Python kernels that get their dispatch key set and can redispatch
    (`Library.impl(..., with_keyset=True)`, `OperatorHandle.redispatch_boxed`)."""
    return not _compat.is_missing(_compat.dispatch_has_kernel_for_dispatch_key) and hasattr(
        _compat.DispatchKeySet, "remove"
    )


def registered() -> bool:
    return bool(_state["registered"])


def registration_error() -> BaseException | None:
    """Why registering failed (then the dispatch mode is used), or None."""
    error: BaseException | None = _state["error"]
    return error


def _hide_from_dynamo(fn: Any) -> Any:
    """Dynamo must never compile our kernel or what it calls (a compiled frame resumed after a
    graph break calls collectives with dynamo's frame callback set): `_compat.hide_from_dynamo`."""
    return _compat.hide_from_dynamo(fn)


def _fault(timer: CollectiveTimer | None, where: str, exc: BaseException) -> None:
    """Count a fault of ours on the window's observer; never let it reach the user's op."""
    try:
        if timer is not None:
            timer.on_fault(where, exc)
    except Exception:
        pass


def _collective_kernel(spec: CollectiveSpec, op: Any) -> Any:
    redispatch = _compat.redispatch_boxed(op)  # releases the GIL while the backend runs

    def kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
        below = keyset.remove(_BACKEND_SELECT)
        timer = None
        try:
            timer = timer_slot.current()
            traced = timer is not None and not getattr(_depth, "active", False) and timer.accepting
            # meta tensors: shape propagation (fake tensors while torch.compile traces), no communication
            traced = traced and not below.has(_META)
        except Exception as exc:  # our check failed: run the user's op untraced
            _fault(timer, "collective_before", exc)
            traced = False
        if not traced or timer is None:
            return redispatch(below, *args, **kwargs)
        _depth.active = True
        try:
            return timer.collective(spec, functools.partial(redispatch, below), args, kwargs)
        finally:
            _depth.active = False

    kernel.__name__ = f"hp_otel_{spec.name.replace('.', '_')}"
    return _hide_from_dynamo(kernel)


def _wait_kernel(op: Any) -> Any:
    redispatch = _compat.redispatch_boxed(op)

    def kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
        start = time.time_ns()  # how long the step waits here: its exposed communication
        result = redispatch(keyset.remove(_BACKEND_SELECT), *args, **kwargs)
        timer = None
        try:
            timer = timer_slot.current()
            if timer is not None:
                timer.waited(args[0] if args else kwargs.get("tensor"), start)
        except Exception as exc:
            _fault(timer, "collective_complete", exc)
        return result

    return _hide_from_dynamo(kernel)


def _library(namespace: str) -> torch.library.Library:
    library = _libraries.get(namespace)
    if library is None:
        library = _libraries[namespace] = torch.library.Library(namespace, "IMPL")
    return library


def _register_one(op: Any, make_kernel: Any) -> None:
    """Register `make_kernel(op)` on the op's `BackendSelect` key (collectives have no kernel there)."""
    qualified = _compat.op_schema(op).name
    if _compat.dispatch_has_kernel_for_dispatch_key(qualified, _KEY):
        raise RuntimeError(f"{qualified} already has a {_KEY} kernel; hp_otel will not replace it")
    namespace, name = qualified.split("::", 1)
    overload = _compat.overload_name(op)
    if overload != "default":
        name = f"{name}.{overload}"
    kernel = _kernels.get(op)
    if kernel is None:  # made once: registering again after `uninstall()` costs ≈0.4 ms, not 1.3
        kernel = _kernels[op] = make_kernel(op)
    _library(namespace).impl(name, kernel, _KEY, with_keyset=True)


def ensure_registered(specs: dict[Any, CollectiveSpec]) -> bool:
    """Register the kernels once per process; False (and the reason kept) if that failed."""
    if _state["registered"]:
        return True
    with _lock:
        if _state["registered"] or _state["error"] is not None:
            return bool(_state["registered"])
        try:
            with warnings.catch_warnings():  # torch warns about Python kernels on some keys: not for users
                warnings.simplefilter("ignore", UserWarning)
                for op, spec in specs.items():
                    _register_one(op, functools.partial(_collective_kernel, spec))
                _register_one(_compat.WAIT_TENSOR, _wait_kernel)
        except Exception as exc:  # leave torch as it was: drop what was registered
            _state["error"] = exc
            for library in _libraries.values():
                _compat.destroy_library(library)
            _libraries.clear()
            return False
        _state["registered"] = True
        installation.linger(_state, unregister_unused)  # `hp_otel.uninstall()` takes them out
        return True


def unregister_unused() -> None:
    """Take every kernel out again, unless a window records through them (the next window
    registers them anew, ≈0.4 ms).  Between windows each kernel costs a collective call
    the round trip into Python (≈6–16 µs here); `hp_otel.uninstall()` calls this."""
    with _lock:
        if not _state["registered"]:
            return
        if timer_slot.installed():
            installation.linger(_state, unregister_unused)  # in use: the next uninstall() tries again
            return
        for library in _libraries.values():
            _compat.destroy_library(library)
        _libraries.clear()
        _state["registered"] = False
