"""Op spans from a hook on the DTensor class: only calls that take a DTensor pay.

DTensor sets `__torch_function__ = torch._C._disabled_torch_function_impl` (its ops
dispatch at the `__torch_dispatch__` level).  While at least one window records ops,
`DTensor.__torch_function__` is our classmethod instead: torch calls it for exactly
the overridable calls with a DTensor among their tensor arguments, where a
`TorchFunctionMode` would be entered for every torch call of the step, even when it
records nothing (docs/how-it-works/costs.md, op mode).  The hook runs each op through the saved original, so the op
runs exactly as without us, and reports it to the window of the calling context (the
mode it replaces was thread-local; a context without a window passes straight through),
outside backward only (the autograd engine runs nodes with an empty mode stack, so the
mode never saw the ops of backward or of a recompute in it: the spans stay the same).

The swap is reference counted across nested and concurrent windows and the original is
put back by identity when the last one closes (raising or not).  It is not kept between
windows by `hp_otel.install()`: swapping is two attribute writes, while a kept hook
would cost every DTensor call outside windows a Python frame.

Where the native gate is built (`native/`, `hp-otel build-native`; `HP_OTEL_TORCH_NATIVE=off`: not),
the classmethod installed is a C function in front of this hook: it passes on, without entering
Python, what this hook would pass on first (an attribute access, a context with no window, a call
inside backward) and calls this hook for the rest, so the same ops are recorded either way.

Where the class hook cannot see the calls, `open_window` returns None and the caller
uses the mode (`dtensor._OpMode`): `HP_OTEL_TORCH_OP_HOOK=mode`; a torch without the
disabled impl; `DTensor.__torch_function__` already replaced by someone else (another
framework's tracer); a subclass of DTensor that defines its own `__torch_function__`
(its instances would never reach ours).  `why_mode()` says which.

Compiled code: dynamo wraps DTensors as traceable wrapper subclasses (plain tensor
variables), so it never traces this hook (which is why the context lookup may come before
`torch.compiler.is_compiling()`, two Python calls); the ops it runs on fake DTensors while
it compiles pass straight through.  A window no longer recompiles compiled frames (dynamo
guards on the TorchFunctionMode stack the mode was on).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable
from typing import Any

import torch
from torch.distributed.tensor import DTensor

from hp_otel.record.observer import Observer
from hp_otel.sources.patching import AttributePatch, ObserverSlot, SharedPatches
from hp_otel.sources.pytorch import _compat, native, settings
from hp_otel.sources.pytorch.tensors import tensor_infos

OP_HOOK_ENV = settings.OP_HOOK_ENV
CLASS_HOOK = settings.CLASS_HOOK
MODE = settings.MODE
_NAME = "__torch_function__"

# Attribute access and hook registration: bookkeeping, not computation (torch's own
# CommDebugMode registers grad hooks on DTensors while it runs).  The same set as the mode's.
SKIPPED_FUNCTIONS = frozenset(
    {"__get__", "__set__", "__delete__", "register_hook", "register_post_accumulate_grad_hook"}
)

_original: Any = _compat.disabled_torch_function_impl  # None on a torch without it
_no_subclass_hooks: Any = _compat.DisableTorchFunctionSubclass
_is_compiling = torch.compiler.is_compiling
_graph_task_id = _compat.current_graph_task_id  # -1 outside backward
_slot: ObserverSlot[Observer] = ObserverSlot("hp_otel_op_observer")
_observer_here = _slot.in_context  # this context's window only: other threads pass through, as with the mode
_NO_KWARGS: dict[str, Any] = {}  # never mutated: `func(*args, **{})` gets a copy
# What torch passes as `func` for a DTensor's attribute read or write (`p.grad`, `x.shape`): a
# getset descriptor's bound `__get__` / `__set__`, most of the hook's calls (docs/how-it-works/costs.md).
_METHOD_WRAPPER = type(object().__str__)
_ATTRIBUTE_ACCESS = frozenset({"__get__", "__set__", "__delete__"})


requested = settings.op_hook  # "class" (default) or "mode"


def _overriding_subclasses(cls: type) -> list[str]:
    found: list[str] = []
    for sub in cls.__subclasses__():
        if _NAME in vars(sub):
            found.append(sub.__qualname__)
        found.extend(_overriding_subclasses(sub))
    return found


def why_mode() -> str | None:
    """Why op spans would come from the TorchFunctionMode now (None: the class hook serves them)."""
    if requested() == MODE:
        return f"{OP_HOOK_ENV}=mode"
    if _original is None or _compat.is_missing(_no_subclass_hooks):
        return "this torch lacks torch._C._disabled_torch_function_impl or DisableTorchFunctionSubclass"
    current = vars(DTensor).get(_NAME)
    if current is _HOOK or (current is not None and current is _native_hook.hook):
        return None  # ours, installed by an open window
    if current is not _original:
        return f"DTensor.__torch_function__ is {current!r}, not torch's disabled impl (replaced by another tracer)"
    overriding = _overriding_subclasses(DTensor)
    if overriding:
        return f"DTensor subclasses with their own __torch_function__: {', '.join(sorted(set(overriding)))}"
    return None


def _torch_function(cls: type, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
    """DTensor's `__torch_function__` while a window records ops: report, and run the op as torch would."""
    if kwargs is None:
        kwargs = _NO_KWARGS
    # An attribute read or write is never an op: out before anything else, the context lookup included.
    if func.__class__ is _METHOD_WRAPPER and func.__name__ in _ATTRIBUTE_ACCESS:
        return _original(func, types, args, kwargs)
    observer = _observer_here()
    if observer is None:  # a context with no window recording ops (another thread): straight through
        return _original(func, types, args, kwargs)
    # Most calls are attribute reads (`__get__`): out first, allocating nothing.
    try:
        name = getattr(func, "__name__", None)
        traced = (
            observer.accepting
            and name is not None
            and name not in SKIPPED_FUNCTIONS
            # inside backward (recomputes included) the mode it replaces saw nothing: the autograd
            # engine runs nodes with an empty TorchFunctionMode stack; keep the same spans
            and _graph_task_id() == -1
            # dynamo runs DTensor ops on fake tensors while it compiles: nothing of ours in its
            # graphs (it never traces this hook itself: DTensors are plain tensor variables to it)
            and not _is_compiling()
        )
    except Exception as exc:  # our check failed: run the user's call untraced
        observer.on_fault("op_before", exc)
        traced = False
    if not traced:
        return _original(func, types, args, kwargs)
    # No closure here: one would turn this function's arguments into cells on every call, untraced ones too.
    return report_op(observer, name, _original, (func, types, args, kwargs), args, kwargs, _no_subclass_hooks)


def report_op(
    observer: Observer,
    name: str,
    run: Callable[..., Any],
    run_args: tuple[Any, ...],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    quiet: Callable[[], contextlib.AbstractContextManager[Any]],
) -> Any:
    """One traced op, the class hook's and the mode's (`dtensor._OpMode`) alike: its tensors read,
    `on_op_enter`, `run(*run_args)` (the op as torch would run it), `on_op_exit` with its outputs or
    its error.

    A fault in reading the tensors is counted and the op still runs; the op's own error reaches
    the caller unchanged. Reading happens inside `quiet()`, so that the reads of shapes and dtypes
    do not come back to the hook (the class hook: torch's subclass hooks disabled).
    """
    try:
        with quiet():
            inputs = tensor_infos(*args, *kwargs.values())
    except Exception as exc:
        observer.on_fault("op_inputs", exc)
        inputs = []
    observer.on_op_enter(name, inputs)
    try:
        out = run(*run_args)
    except BaseException as error:
        observer.on_op_exit(name, (), error)
        raise
    try:
        with quiet():
            outputs = tensor_infos(out)
    except Exception as exc:
        observer.on_fault("op_outputs", exc)
        outputs = []
    observer.on_op_exit(name, outputs)
    return out


_HOOK = classmethod(_torch_function)


class _NativeHook:
    """The native filter in front of `_torch_function`, made once per loaded gate."""

    hook: Any = None
    made_from: Any = None


_native_hook = _NativeHook()


def wrap_hook(python_hook: Callable[..., Any]) -> Any:
    """`python_hook` (cls, func, types, args, kwargs) as DTensor's `__torch_function__`: behind the
    native filter where the gate is loaded (a builtin, as torch's own disabled impl is, that calls it
    with cls=DTensor), else as a classmethod. A gate that cannot make the filter is
    disabled (said once) and the Python hook serves."""
    gate = native.gate()
    if gate is not None:
        try:
            return gate.op_filter(_slot.var, python_hook, _original, _METHOD_WRAPPER, _NO_KWARGS, DTensor)
        except Exception as exc:
            native.disable(exc)
    return classmethod(python_hook)


def installed_hook() -> Any:
    """What a window installs as `DTensor.__torch_function__`: the native filter in front of the hook
    where the gate is built (and `HP_OTEL_TORCH_NATIVE` is not off), else `_HOOK`."""
    gate = native.gate()
    if gate is None:
        return _HOOK
    if _native_hook.made_from is not gate:
        made = wrap_hook(_torch_function)
        if native.gate() is not gate:  # it could not make the filter
            return _HOOK
        _native_hook.hook, _native_hook.made_from = made, gate
    return _native_hook.hook


def _plan_class_hook() -> list[AttributePatch] | None:
    """The swap of `DTensor.__torch_function__`, or None where it cannot serve (`why_mode()`): use the mode."""
    if why_mode() is not None:
        return None
    hook = installed_hook()
    return [AttributePatch(DTensor, _NAME, lambda _original: hook)]


# Never kept between windows: a kept hook would cost every DTensor call outside windows a frame.
class_hook = SharedPatches(_plan_class_hook, lingers=False)


class OpWindow:
    """One window's hold on the class hook; `close()` lets go (idempotent)."""

    __slots__ = ("_observer", "_token")

    def __init__(self, observer: Observer, token: contextvars.Token[Observer | None]) -> None:
        self._observer: Observer | None = observer
        self._token = token

    def close(self) -> None:
        observer, self._observer = self._observer, None
        if observer is None:
            return
        try:
            _slot.pop(observer, self._token)
        finally:
            class_hook.release()


def open_window(observer: Observer) -> OpWindow | None:
    """Report this context's DTensor ops to `observer` until `close()`; None: use the mode."""
    if not class_hook.acquire():
        return None
    try:
        token = _slot.push(observer)
    except BaseException:
        class_hook.release()
        raise
    return OpWindow(observer, token)
