"""Python kernels on torch's collective ops: how collectives are seen without a dispatch mode.

A TorchDispatchMode sends every aten op of a step through Python (even a mode that does
nothing slows a step by a quarter or more: docs/how-it-works/costs.md).  Instead, each collective op overload that
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
in the repository's real-gloo tests, which reproduce it on their own.)

Rules:
- registered while a window records through them: the first window that needs them
  registers them (the first time in a process also makes the kernels, which imports
  `torch._dynamo`, once), and the last one to close unregisters them, so after a plain
  window nothing of hp_otel's runs on a collective and the dispatcher is as torch left it.
  While hooks are kept (`hp_otel.install()`, the always-on instrumentor) they stay
  registered between windows and pass every call straight through (one slot read and a
  redispatch, but still the round trip into Python on every collective op call:
  docs/how-it-works/costs.md); `hp_otel.uninstall()` takes them out when no window uses them;
- a collective op can call another (a functional `all_reduce` runs `c10d.allreduce_`
  through the dispatcher): only the outermost one on a thread is recorded, as a
  dispatch mode would;
- `_c10d_functional.wait_tensor` gets a kernel too: it completes functional collectives
  (one waited after its window closed is not seen: no window is there to record it);
- kernels are hidden from dynamo (`_compat.hide_from_dynamo`): a compiled graph that
  calls a collective must not try to compile our Python;
- where the native gate is built (`native/`, `hp-otel build-native`), the kernels are
  registered behind it: C++ on the key passes on the calls nothing records (no window
  records, a meta tensor, a collective's inner call) without entering Python and hands the
  rest to the same Python kernel; without a build, or with `HP_OTEL_TORCH_NATIVE=off`,
  the Python kernels are on the key themselves.

Every private torch symbol used here (dispatch keys, `redispatch_boxed`, the dispatcher's
library object, ...) comes from `_compat`.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import warnings
from dataclasses import dataclass
from typing import Any

from hp_otel.common import said_once
from hp_otel.record import installation
from hp_otel.sources.patching import ObserverSlot
from hp_otel.sources.pytorch import _compat, native
from hp_otel.sources.pytorch.collective_timer import CollectiveTimer
from hp_otel.sources.pytorch.collectives import CollectiveSpec

logger = logging.getLogger("hp_otel")
_KEY = "BackendSelect"
_BACKEND_SELECT = _compat.DispatchKey.BackendSelect
_META = _compat.DispatchKey.Meta


# The collective timer of this context's window, else the latest window's (autograd and
# communication threads): read once per collective call.
timer_slot: ObserverSlot[CollectiveTimer] = ObserverSlot("hp_otel_collective_timer")
_depth = threading.local()  # .active: a collective of this thread is being recorded
_lock = threading.Lock()
# namespace -> the dispatcher's library object the kernels are registered on; kept (empty
# after `reset()`) so registering again makes none.
_libraries: dict[str, Any] = {}
_kernels: dict[Any, Any] = {}  # op -> its kernel (hidden from dynamo), made on first registration
_planned_for: dict[str, Any] = {}  # specs -> plan: what `_register` does, worked out once


@dataclass(eq=False)  # identity: installation keys its claims by this object
class _Registration:
    """The kernels' one registration in this process, shared by every window that records through it."""

    registered: bool = False  # the kernels are in the dispatcher
    error: BaseException | None = None
    users: int = 0  # windows recording through them now
    back_to_back: bool = False  # plain windows came one after another: kept between them (REOPEN_WITHIN_S)
    # (installation.uninstalls(), time.monotonic()) of the last unregistration
    unregistered_at: tuple[int, float] = (-1, float("-inf"))
    gate: Any = None  # the native gate the kernels are registered behind (native/), or None: on the key directly


_registration = _Registration()


def available() -> bool:
    """This torch takes Python kernels that get their dispatch key set and can redispatch
    (`Library.impl(..., with_keyset=True)`, `OperatorHandle.redispatch_boxed`)."""
    return (
        not _compat.is_missing(_compat.dispatch_has_kernel_for_dispatch_key)
        and not _compat.is_missing(_compat.dispatch_library)
        and hasattr(_compat.DispatchKeySet, "remove")
    )


def registered() -> bool:
    return bool(_registration.registered)


def registration_error() -> BaseException | None:
    """Why registering failed (then the dispatch mode is used), or None."""
    error: BaseException | None = _registration.error
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
        start = time.monotonic_ns()  # how long the step waits here: its exposed communication
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


def _library(namespace: str) -> Any:
    library = _libraries.get(namespace)
    if library is None:
        library = _libraries[namespace] = _compat.dispatch_library("IMPL", namespace, "", __file__, 0)
    return library


def _planned(op: Any, make_kernel: Any, collective: bool = True) -> tuple[str, Any, str, Any, bool]:
    """(qualified name, library, name to register, kernel, whether it is a collective's) for `op`;
    its kernel made once, so registering again makes nothing and imports nothing."""
    qualified = _compat.op_schema(op).name
    namespace, name = qualified.split("::", 1)
    overload = _compat.overload_name(op)
    if overload != "default":
        name = f"{name}.{overload}"
    kernel = _kernels.get(op)
    if kernel is None:
        kernel = _kernels[op] = make_kernel(op)
    return qualified, _library(namespace), name, kernel, collective


def _plan(specs: dict[Any, CollectiveSpec]) -> list[tuple[str, Any, str, Any, bool]]:
    """What registering does, worked out once for these specs (each window registers again)."""
    if _planned_for.get("specs") is not specs:
        plan = [_planned(op, functools.partial(_collective_kernel, spec)) for op, spec in specs.items()]
        plan.append(_planned(_compat.WAIT_TENSOR, _wait_kernel, collective=False))
        _planned_for.update(specs=specs, plan=plan)
    plan: list[tuple[str, Any, str, Any, bool]] = _planned_for["plan"]
    return plan


def _register(specs: dict[Any, CollectiveSpec]) -> bool:
    """Put every kernel on its op's `BackendSelect` key (collectives have none there) under
    `_lock`, behind the native gate where it is built (where the gate fails, without it);
    False, the reason kept, and torch as it was, if that failed too."""
    gate = native.gate()
    if gate is not None:
        try:
            return _register_all(specs, gate)
        except Exception as exc:  # the Python kernels alone, as if it were not built
            _drop_registered()
            native.disable(exc)
    try:
        return _register_all(specs, None)
    except Exception as exc:  # leave torch as it was: drop what was registered
        _registration.error = exc
        _drop_registered()
        return False


def _register_all(specs: dict[Any, CollectiveSpec], gate: Any) -> bool:
    plan = _plan(specs)
    _registration.gate = gate
    with warnings.catch_warnings():  # torch warns about Python kernels on some keys: not for users
        warnings.simplefilter("ignore", UserWarning)
        for qualified, library, name, kernel, collective in plan:
            if _compat.dispatch_has_kernel_for_dispatch_key(qualified, _BACKEND_SELECT):
                raise RuntimeError(f"{qualified} already has a {_KEY} kernel; hp_otel will not replace it")
            if gate is not None:  # C++ passes on what nothing records; the same kernel gets the rest
                gate.register(qualified.split("::", 1)[0], name, kernel, collective)
            else:
                # the key as the enum, not its name: pybind's conversion of a name costs more than the rest of `impl`
                library.impl(name, _BACKEND_SELECT, kernel, True)  # True: the kernel gets the dispatch key set
    _registration.registered = True
    return True


def _drop_registered() -> None:
    try:
        _unregister()
    except Exception:  # nothing more to do: the reason kept is the registration's
        pass


# Plain windows opened one after another (a window per step): once one opens within this long
# of the previous one's end, the kernels stay registered between windows, as under
# `hp_otel.install()`. Registering again matters only when windows come this close; past this,
# it is a negligible share of the time between them (the figures: docs/how-it-works/collective-hook.md).
REOPEN_WITHIN_S = 1.0


def _unregister() -> None:
    """Take every kernel out of the dispatcher (under `_lock`): torch's own kernels again."""
    _registration.registered = False
    _registration.unregistered_at = (installation.uninstalls(), time.monotonic())
    errors = []
    gate = _registration.gate
    if gate is not None:
        _registration.gate = None
        try:
            gate.unregister_all()
        except Exception as exc:
            errors.append(exc)
    for library in _libraries.values():
        try:
            library.reset()
        except Exception as exc:  # one that cannot be reset must not keep the others in
            errors.append(exc)
    if errors:
        raise errors[0]


def acquire(specs: dict[Any, CollectiveSpec]) -> bool:
    """A window records through the kernels: registered now unless they already are (kept
    by `install()`, or another window's); False (the reason kept) if registering failed."""
    if _registration.error is not None:
        return False
    installation.claim(_registration)  # outside `_lock`: `uninstall()` runs removers under installation's lock
    with _lock:
        if _registration.error is not None:
            return False
        if not _registration.registered:
            uninstalls, unregistered_at = _registration.unregistered_at
            if uninstalls == installation.uninstalls() and time.monotonic() - unregistered_at < REOPEN_WITHIN_S:
                _registration.back_to_back = True  # from this window on they stay (until `uninstall()`)
                _tell_back_to_back()
            if not _register(specs):
                return False
        _registration.users += 1
        _set_recording(True)
        return True


def _set_recording(on: bool) -> None:
    """Tell the native gate whether a window records (when none does, it passes every call on)."""
    gate = _registration.gate
    if gate is not None:
        gate.set_recording(on)


def _tell_back_to_back() -> None:
    said_once.log_once(
        __name__,
        "back to back",
        "hp_otel: windows opened one after another: the collective kernels stay registered between "
        "them, passing calls through (hp_otel.uninstall() takes them out; hp_otel.install() says so "
        "explicitly)",
        level=logging.INFO,
    )


def release() -> None:
    """The window's end: the last window out unregisters the kernels, unless hooks are
    kept (they pass calls straight through until `hp_otel.uninstall()`)."""
    with _lock:
        if _registration.users == 0:
            return
        _registration.users -= 1
        if _registration.users > 0:
            return
        _set_recording(False)
        keep = installation.keeping() or _registration.back_to_back
        if not keep:
            _unregister()
    if keep:
        installation.linger(_registration, _remove_kept)


def _remove_kept() -> None:
    """`hp_otel.uninstall()` (or the last holder gone): out, unless a window took them over; the
    next plain window starts afresh (it unregisters at its end unless another follows it closely)."""
    with _lock:
        _registration.back_to_back = False
        if _registration.users == 0 and _registration.registered:
            _unregister()
            _registration.unregistered_at = (-1, float("-inf"))  # taken out by uninstall(), not by a window


def in_use() -> int:
    """How many windows record through the kernels now."""
    return int(_registration.users)
