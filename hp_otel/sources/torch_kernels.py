"""Python kernels on torch's collective ops: how collectives are seen without a dispatch mode.

A TorchDispatchMode sends every aten op of a step through Python (measured 1.24–1.33×
per step with a mode that does nothing).  Instead, each collective op overload that
`collective_specs()` knows gets a Python kernel on its CPU (and CUDA) dispatch key that
calls the kernel it replaced (`torch.library.get_kernel`); no other op pays anything.
Kernels sit below DTensor, autograd and tensor subclasses, so they see what reaches a
backend: every DTensor redistribute, FSDP2, DDP's C++ reducer, the backward of the
functional autograd collectives, direct `torch.ops` and `ProcessGroup` calls and the
eager API — and the collectives of compiled graphs, which keep running compiled.

Rules:
- registered once per process, on the first window, and never unregistered (a
  `torch.library.Library` lives as long as the process; registering costs ms): while no
  window records, a kernel reads one slot and calls the original;
- a collective op can call another (a functional `all_reduce` runs `c10d.allreduce_`
  through the dispatcher): only the outermost one on a thread is recorded, as a
  dispatch mode would;
- `_c10d_functional.wait_tensor` gets a kernel too: it completes functional collectives;
- kernels are hidden from dynamo (`torch._dynamo.disable`): a compiled graph that
  calls a collective must not try to compile our Python.
"""

from __future__ import annotations

import functools
import threading
import warnings
from typing import Any, Protocol

import torch

from hp_otel.sources.patching import ObserverSlot
from hp_otel.sources.torch_collectives import CollectiveSpec

_KEYS = ("CPU", "CUDA")
_WAIT_TENSOR = "_c10d_functional::wait_tensor"


class KernelRecorder(Protocol):
    """What a window puts in the slot (`torch_dtensor.CollectiveRecorder`)."""

    @property
    def accepting(self) -> bool: ...

    def collective(self, spec: CollectiveSpec, call: Any, args: Any, kwargs: Any) -> Any: ...

    def waited(self, tensor: Any) -> None: ...

    def on_fault(self, where: str, exc: BaseException) -> None: ...


# The recorder of this context's window, else the latest window's (autograd and
# communication threads): read once per collective call.
recorder_slot = ObserverSlot("hp_otel_collective_recorder")
_depth = threading.local()  # .active: a collective of this thread is being recorded
_lock = threading.Lock()
_libraries: dict[str, torch.library.Library] = {}  # namespace -> library; kept alive for the process
_state: dict[str, Any] = {"registered": False, "error": None}


def available() -> bool:
    """This torch can hand out the kernel an op has (`torch.library.get_kernel`, torch ≥ 2.9)."""
    return hasattr(torch.library, "get_kernel")


def registered() -> bool:
    return bool(_state["registered"])


def registration_error() -> BaseException | None:
    """Why registering failed (then the dispatch mode is used), or None."""
    error: BaseException | None = _state["error"]
    return error


def _hide_from_dynamo(fn: Any) -> Any:
    try:
        import torch._dynamo

        return torch._dynamo.disable(fn, recursive=True)
    except Exception:  # no dynamo in this build: nothing to hide from
        return fn


def _fault(recorder: Any, where: str, exc: BaseException) -> None:
    """Count a fault of ours on the window's observer; never let it reach the user's op."""
    try:
        if recorder is not None:
            recorder.on_fault(where, exc)
    except Exception:
        pass


def _collective_kernel(spec: CollectiveSpec, original: Any) -> Any:
    call_boxed = original.call_boxed

    def kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
        recorder = None
        try:
            recorder = recorder_slot.current()
            traced = recorder is not None and not getattr(_depth, "active", False) and recorder.accepting
        except Exception as exc:  # our check failed: run the user's op untraced
            _fault(recorder, "collective_before", exc)
            traced = False
        if not traced:
            return call_boxed(keyset, *args, **kwargs)
        _depth.active = True
        try:
            return recorder.collective(spec, functools.partial(call_boxed, keyset), args, kwargs)
        finally:
            _depth.active = False

    kernel.__name__ = f"hp_otel_{spec.name.replace('.', '_')}"
    return _hide_from_dynamo(kernel)


def _wait_kernel(original: Any) -> Any:
    call_boxed = original.call_boxed

    def kernel(keyset: Any, *args: Any, **kwargs: Any) -> Any:
        result = call_boxed(keyset, *args, **kwargs)
        recorder = None
        try:
            recorder = recorder_slot.current()
            if recorder is not None:
                recorder.waited(args[0] if args else kwargs.get("tensor"))
        except Exception as exc:
            _fault(recorder, "collective_complete", exc)
        return result

    return _hide_from_dynamo(kernel)


def _has_kernel(name: str, key: str) -> bool:
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    return bool(has(name, key) or has(name, "CompositeExplicitAutograd"))


def _library(namespace: str) -> torch.library.Library:
    library = _libraries.get(namespace)
    if library is None:
        library = _libraries[namespace] = torch.library.Library(namespace, "IMPL")
    return library


def _register_one(op: Any, make_kernel: Any) -> int:
    """Register `make_kernel(original)` on each key the op has a kernel for; how many keys."""
    namespace, name = op._schema.name.split("::", 1)
    if op._overloadname != "default":
        name = f"{name}.{op._overloadname}"
    count = 0
    for key in _KEYS:
        if not _has_kernel(op._schema.name, key):
            continue
        original = torch.library.get_kernel(op, key)
        _library(namespace).impl(name, make_kernel(original), key, with_keyset=True)
        count += 1
    return count


def ensure_registered(specs: dict[Any, CollectiveSpec]) -> bool:
    """Register the kernels once per process; False (and the reason kept) if that failed."""
    if _state["registered"]:
        return True
    with _lock:
        if _state["registered"] or _state["error"] is not None:
            return bool(_state["registered"])
        try:
            with warnings.catch_warnings():  # "Overriding a previously registered kernel": that is the point
                warnings.simplefilter("ignore", UserWarning)
                for op, spec in specs.items():
                    _register_one(op, functools.partial(_collective_kernel, spec))
                _register_one(torch.ops._c10d_functional.wait_tensor.default, _wait_kernel)
        except Exception as exc:  # leave torch as it was: drop what was registered
            _state["error"] = exc
            for library in _libraries.values():
                library._destroy()
            _libraries.clear()
            return False
        _state["registered"] = True
        return True
