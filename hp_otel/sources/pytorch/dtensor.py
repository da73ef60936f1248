"""PyTorch DTensor source: ops, collectives and redistributes of `torch.distributed.tensor`.

- ops at the level the user wrote them (`linear`, `gelu`, `matmul`): DTensor's own
  `__torch_function__`, swapped for a reporting one while a window records ops
  (`op_hook`: only calls with a DTensor pay), or as a fallback where that class hook
  cannot see the calls (`op_hook.why_mode()`) a TorchFunctionMode that reports calls
  with at least one DTensor argument;
- collectives at dispatch level, forward and backward (torch 2.13's DTensor dispatch is
  C++, so there is no Python dispatcher to wrap): Python kernels on the collective ops
  (`kernels`, registered while a window records; no other op pays), or as a fallback
  (`collective_hook()` says which is active) a TorchDispatchMode that lets DTensor run
  (`NotImplemented`) and sees the collective ops its local ops issue.  Both hand each
  collective to the window's `CollectiveTimer`;
- redistributes: `redistribute_local_tensor` wrapped in every module that imported it.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.distributed.tensor import DTensor
from torch.overrides import TorchFunctionMode

from hp_otel.record.observer import Observer
from hp_otel.sources.patching import AttributePatch, ObserverSlot, SharedPatches, patch_owned_all, run_every
from hp_otel.sources.pytorch import _compat, kernels, native, op_hook, settings, teardown
from hp_otel.sources.pytorch.collective_timer import CollectiveTimer
from hp_otel.sources.pytorch.collectives import CollectiveSpec, collective_specs
from hp_otel.sources.pytorch.completion import WAIT_TENSOR, AsyncCollectiveTensor
from hp_otel.sources.pytorch.fsdp import fsdp_patches
from hp_otel.sources.pytorch.waits import wait_slot, work_wait_patches
from hp_otel.spans.codec import placements_text

# Attribute access and hook registration: bookkeeping, not computation (op_hook's set).
_SKIPPED_FUNCTIONS = op_hook.SKIPPED_FUNCTIONS
_is_compiling: Callable[[], bool] = torch.compiler.is_compiling


def _has_dtensor(args: tuple[Any, ...], kwargs: dict[str, Any] | None) -> bool:
    """DTensor disables __torch_function__, so `types` is empty: look at the arguments."""
    for value in args:
        if isinstance(value, DTensor):
            return True
        if isinstance(value, (list, tuple)) and any(isinstance(v, DTensor) for v in value):
            return True
    return any(isinstance(v, DTensor) for v in kwargs.values()) if kwargs else False


def _call(func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """`func(*args, **kwargs)`, for `op_hook.report_op` (a function, not a closure: the mode's
    `__torch_function__` runs for every torch call and keeps its arguments plain locals)."""
    return func(*args, **kwargs)


class _OpMode(TorchFunctionMode):
    """Reports torch-level calls that take a DTensor as op enter/exit: the fallback where the
    class hook (`op_hook`) cannot see them (`op_hook.why_mode()`), entered for every torch call."""

    def __init__(self, observer: Observer) -> None:
        super().__init__()
        self._observer = observer

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        observer = self._observer
        # Most calls take no DTensor (DTensor's own Python calls torch too): out first, allocating nothing.
        try:
            traced = observer.accepting and _has_dtensor(args, kwargs) and not _is_compiling()
            if traced:  # dynamo traces modes: compiled graphs get the bare op (collectives still counted)
                name = getattr(func, "__name__", None)
                traced = name is not None and name not in _SKIPPED_FUNCTIONS
        except Exception as exc:  # our check failed: run the user's call untraced
            observer.on_fault("op_before", exc)
            traced = False
        if not traced:
            return func(*args, **(kwargs or {}))
        if kwargs is None:
            kwargs = {}
        # Inside the mode's own call torch has popped it: reading the tensors needs no guard.
        return op_hook.report_op(observer, name, _call, (func, args, kwargs), args, kwargs, contextlib.nullcontext)


class _CollectiveMode(_compat.TorchDispatchMode):  # type: ignore[misc]
    """The fallback hook (`HP_OTEL_TORCH_COLLECTIVE_HOOK=dispatch`, or no kernels): a dispatch mode that
    lets DTensor run (`NotImplemented`) and hands every collective op to the window's timer."""

    def __init__(self, timer: CollectiveTimer, specs: dict[Any, CollectiveSpec]) -> None:
        super().__init__()
        self._timer = timer
        self._specs = specs

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if DTensor in types:
            return NotImplemented  # let DTensor unwrap; its local ops come back here
        if kwargs is None:
            kwargs = {}
        timer = self._timer
        try:
            spec = self._specs.get(func)
            traced = spec is not None and timer.accepting
        except Exception as exc:  # our lookup failed: run the user's op untraced
            timer.on_fault("collective_before", exc)
            traced = False
        if not traced:  # nearly every op: pass straight through
            if func is WAIT_TENSOR:
                start = time.monotonic_ns()
                result = func(*args, **kwargs)
                timer.waited(args[0] if args else kwargs.get("tensor"), start)
                return result
            if AsyncCollectiveTensor in types:
                result = func(*args, **kwargs)
                timer.waited_in(args, kwargs)
                return result
            return func(*args, **kwargs)
        return timer.collective(spec, func, args, kwargs)


# --- redistribute_local_tensor, patched once for all active modes -------------------

_REDISTRIBUTE_MODULES = _compat.REDISTRIBUTE_MODULES
_REDISTRIBUTE_ATTR = _compat.REDISTRIBUTE_FUNCTION
# Where redistribute events go: this context's mode, else the latest one (autograd threads).
_redistribute_slot: ObserverSlot[Observer] = ObserverSlot("hp_otel_redistribute_observer")
_wrappers: dict[Callable[..., Any], Callable[..., Any]] = {}  # original -> its wrapper, made once


def _wrap_redistribute(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def redistribute_local_tensor(local_tensor, current_spec, target_spec, *args, **kwargs):  # type: ignore[no-untyped-def]
        if _is_compiling():  # dynamo inlines this: keep our bookkeeping out of compiled graphs
            return original(local_tensor, current_spec, target_spec, *args, **kwargs)
        observer = _redistribute_slot.current()
        if observer is None or not observer.accepting:
            return original(local_tensor, current_spec, target_spec, *args, **kwargs)
        try:
            src = placements_text(current_spec.placements)
            dst = placements_text(target_spec.placements)
            shape = tuple(current_spec.tensor_meta.shape)  # `.shape`'s own read, without its property call
        except Exception as exc:
            observer.on_fault("redistribute_describe", exc)
            return original(local_tensor, current_spec, target_spec, *args, **kwargs)
        observer.on_redistribute_enter(src, dst, shape)
        try:
            out = original(local_tensor, current_spec, target_spec, *args, **kwargs)
        except BaseException as error:
            observer.on_redistribute_exit(error)
            raise
        observer.on_redistribute_exit()
        return out

    redistribute_local_tensor.__hp_otel_original__ = original  # type: ignore[attr-defined]
    return redistribute_local_tensor


def _plan_redistribute_patches() -> list[AttributePatch]:
    """One wrapper, installed in every module that imported the original by name."""
    modules = _compat.redistribute_modules()
    original = vars(modules[0])[_REDISTRIBUTE_ATTR]
    wrapper = _wrappers.get(original)
    if wrapper is None:
        wrapper = _wrappers[original] = _wrap_redistribute(original)
    owners = [module for module in modules if vars(module).get(_REDISTRIBUTE_ATTR) is original]
    return patch_owned_all(owners, _REDISTRIBUTE_ATTR, wrapper)


_redistribute_patches = SharedPatches(_plan_redistribute_patches)


class _Idle:
    """An observer that accepts nothing: the modes pass every call straight through."""

    accepting = False


@contextlib.contextmanager
def idle_modes() -> Iterator[None]:
    """This source's function and dispatch modes, recording nothing: the hooking floor the
    benchmark measures (what any mode-based tracer of ops and collectives pays)."""
    idle: Any = _Idle()
    with _CollectiveMode(CollectiveTimer(idle), collective_specs()), _OpMode(idle):
        yield


HOOK_ENV = settings.COLLECTIVE_HOOK_ENV
KERNELS = settings.KERNELS
DISPATCH_MODE = settings.DISPATCH_MODE
_requested_hook = settings.collective_hook


def collective_hook() -> str:
    """How windows see collectives in this process: "kernels" (the default: Python
    kernels on the collective ops' `BackendSelect` key, `kernels`) or
    "dispatch_mode" (`HP_OTEL_TORCH_COLLECTIVE_HOOK=dispatch`, and the fallback for a
    torch whose dispatcher lacks what the kernels need or where registering failed)."""
    if _requested_hook() == DISPATCH_MODE or not kernels.available():
        return DISPATCH_MODE
    native.requested()  # a bad HP_OTEL_TORCH_NATIVE is refused here, as a bad hook is: before the kernels change
    if kernels.registration_error() is not None:
        return DISPATCH_MODE
    return KERNELS


# torch's function and dispatch modes are a stack per thread: one entered by a window whose exit runs
# on another thread cannot be popped there. It stays on its thread's stack, passing calls through
# (its window records no more), until the next window attaching on that thread pops it.
_parked_modes: dict[int, list[Any]] = {}
_parked_lock = threading.Lock()


def _exit_mode(mode: Any, thread: int) -> None:
    """Exit a mode entered on `thread`: now if this is that thread, else when a window next attaches there."""
    if threading.get_ident() == thread:
        mode.__exit__(None, None, None)
        return
    with _parked_lock:
        _parked_modes.setdefault(thread, []).append(mode)


def _pop_parked_modes() -> None:
    """Pop this thread's modes left by windows closed elsewhere (those on top of their stack)."""
    if not _parked_modes:
        return
    with _parked_lock:
        parked = _parked_modes.pop(threading.get_ident(), [])
    from torch.overrides import _get_current_function_mode_stack
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    for mode in reversed(parked):
        stack = (
            _get_current_dispatch_mode_stack()
            if isinstance(mode, _CollectiveMode)
            else _get_current_function_mode_stack()
        )
        if stack and stack[-1] is mode:
            mode.__exit__(None, None, None)


class TorchDTensorSource:
    """Installs the op mode, the collective hook and the redistribute wrapper.

    Only what the window records: a counts-only window (`record_spans=False`, an
    unsampled step) gets the collective hook alone; `ops=False` leaves out the op mode.
    """

    def __init__(self) -> None:
        settings.check()  # a bad setting raises here, naming it: at attach it would be a window recording nothing
        teardown.register_once()
        self._specs = collective_specs()
        self._op_mode: _OpMode | None = None
        self._op_window: op_hook.OpWindow | None = None
        self._collective_mode: _CollectiveMode | None = None
        self._observer: Observer | None = None
        self._token: contextvars.Token[Observer | None] | None = None
        self._timer: CollectiveTimer | None = None
        self._timer_token: contextvars.Token[CollectiveTimer | None] | None = None
        self._wait_timer: CollectiveTimer | None = None
        self._wait_token: contextvars.Token[CollectiveTimer | None] | None = None
        self._fsdp = False  # FSDP's parameter-group methods wrapped by this source
        self._thread = 0  # the thread that attached it

    def attach(self, observer: Observer) -> None:
        _pop_parked_modes()
        self._observer = observer
        self._thread = threading.get_ident()  # where its torch modes are entered
        spans = observer.spans_enabled
        if spans:  # redistribute spans are span attributes only
            self._token = _redistribute_slot.push(observer)
            _redistribute_patches.acquire()
        # FSDP's parameter group: a span attribute, and (with module tracking) whose backward counts
        fsdp_patches.acquire()
        self._fsdp = True
        timer = CollectiveTimer(observer)
        if spans:  # Work.wait() timed: the exposed communication (waits.py)
            work_wait_patches.acquire()
            self._wait_token = wait_slot.push(timer)
            self._wait_timer = timer
        if collective_hook() == KERNELS and kernels.acquire(self._specs):
            self._timer_token = kernels.timer_slot.push(timer)
            self._timer = timer
        else:
            collective_mode = _CollectiveMode(timer, self._specs)
            collective_mode.__enter__()
            self._collective_mode = collective_mode  # only modes that entered are exited by detach
        if spans and observer.ops_enabled:
            self._op_window = op_hook.open_window(observer)  # None: the class hook cannot see the ops
            if self._op_window is None:
                op_mode = _OpMode(observer)
                op_mode.__enter__()
                self._op_mode = op_mode

    def detach(self) -> None:
        """Undo attach in reverse order; every step runs even if an earlier one fails."""
        run_every((self._exit_op_mode, self._exit_collective_mode, self._unpatch_waits, self._unpatch))

    def _unpatch_waits(self) -> None:
        timer, token, self._wait_timer, self._wait_token = self._wait_timer, self._wait_token, None, None
        if timer is not None and token is not None:
            try:
                work_wait_patches.release()
            finally:
                wait_slot.pop(timer, token)

    def why_no_collectives(self) -> str | None:
        """Why a window saw no collective, if torch can tell (CommDebugMode says it once)."""
        import torch.distributed as dist

        if not dist.is_available():
            return "this torch has no torch.distributed"
        if not dist.is_initialized():
            return "torch.distributed has no process group (call dist.init_process_group() or init_device_mesh() first)"
        return None

    def _exit_op_mode(self) -> None:
        window, self._op_window = self._op_window, None
        if window is not None:
            window.close()
        mode, self._op_mode = self._op_mode, None
        if mode is not None:
            _exit_mode(mode, self._thread)

    def _exit_collective_mode(self) -> None:
        mode, self._collective_mode = self._collective_mode, None
        if mode is not None:
            _exit_mode(mode, self._thread)
        timer, token, self._timer, self._timer_token = self._timer, self._timer_token, None, None
        if timer is not None and token is not None:
            try:
                kernels.timer_slot.pop(timer, token)
            finally:  # the last window out unregisters them, unless hooks are kept
                kernels.release()

    def _unpatch(self) -> None:
        token, self._token = self._token, None
        fsdp, self._fsdp = self._fsdp, False
        observer = self._observer
        try:
            if fsdp:
                fsdp_patches.release()
        finally:
            if token is not None:
                try:
                    _redistribute_patches.release()
                finally:
                    if observer is not None:
                        _redistribute_slot.pop(observer, token)
