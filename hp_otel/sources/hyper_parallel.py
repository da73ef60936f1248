"""hyper-parallel source: its OpDispatcher and its platform collectives, on torch and MindSpore.

- ops: through the `_debug_mode_observer` ContextVar of `OpDispatcher` where the
  installed release has it (set with a token on install, reset on uninstall), else
  by wrapping `OpDispatcher.dispatch` on the class;
- collectives: the six `differentiable_*` functions wherever the release has them —
  staticmethods of `TorchPlatform`, `MindSporePlatform`, `MindSporeGraphPlatform`
  and/or functions of `hyper_parallel.core.dtensor._utils` — and the platform's
  non-differentiable `all_reduce`, `all_gather_into_tensor`, `reduce_scatter_tensor`,
  `broadcast`.  Missing ones are skipped; a platform module is imported only when its
  framework already is (tracing torch never imports MindSpore);
- on torch, also the `torch.distributed` collectives (`torch.distributed.all_reduce`,
  ...) that hyper-parallel calls directly: its `fully_shard` all-gathers and
  reduce-scatters with them, and the backward of every `differentiable_*` runs them
  (`torch.distributed.nn.functional`'s autograd functions).  One called from inside a
  traced platform collective is not reported again, so a forward `differentiable_*`
  stays one call.  The design document counts platform collectives only; without these
  a backward pass and FSDP would show no communication at all;
- its `fully_shard` (torch platform): the state methods that issue a unit's collectives
  are wrapped, so they count for that unit (`hyper_parallel_fsdp.py`).

Counts use hyper-parallel's own names (`differentiable_all_reduce`), spans carry the
normalised op (`all_reduce`) like every other source.  Module tracking is separate
(torch `nn.Module` or MindSpore `Cell` trackers).
"""

from __future__ import annotations

import contextvars
import functools
import importlib
import logging
import sys
from collections.abc import Callable, Mapping
from types import MappingProxyType, ModuleType
from typing import Any

from hp_otel.record import phase as phase_of
from hp_otel.record.observer import Observer
from hp_otel.sources.function_collectives import (
    AsyncHandles,
    CallReader,
    GroupResolver,
    is_tensor_like,
    shape_of,
    wrap_collective,
)
from hp_otel.sources.hyper_parallel_fsdp import state_patches
from hp_otel.sources.patching import (
    AttributePatch,
    ObserverSlot,
    SharedPatches,
    all_or_nothing,
    patch_owned,
    run_every,
)
from hp_otel.spans.infos import TensorInfo

logger = logging.getLogger("hp_otel")

OP_DISPATCH_MODULE = "hyper_parallel.core.shard._op_dispatch"
OBSERVER_VARIABLE = "_debug_mode_observer"
DTENSOR_MODULE = "hyper_parallel.core.dtensor"
UTILS_MODULE = "hyper_parallel.core.dtensor._utils"
PLATFORM_MODULE = "hyper_parallel.platform.platform"
# (module, class, the framework that module needs)
PLATFORM_CLASSES: tuple[tuple[str, str, str], ...] = (
    ("hyper_parallel.platform.torch.platform", "TorchPlatform", "torch"),
    ("hyper_parallel.platform.mindspore.platform", "MindSporePlatform", "mindspore"),
    ("hyper_parallel.platform.mindspore.platform_graph", "MindSporeGraphPlatform", "mindspore"),
)
# hyper-parallel's name -> normalised op
DIFFERENTIABLE_COLLECTIVES: Mapping[str, str] = MappingProxyType(
    {
        "differentiable_all_gather_concat": "all_gather",
        "differentiable_all_to_all": "all_to_all",
        "differentiable_all_reduce": "all_reduce",
        "differentiable_reduce_scatter": "reduce_scatter",
        "differentiable_all_to_all_single": "all_to_all",
        "differentiable_all_to_all_single_async": "all_to_all",
    }
)
PLATFORM_COLLECTIVES: Mapping[str, str] = MappingProxyType(
    {
        "all_reduce": "all_reduce",
        "all_gather_into_tensor": "all_gather",
        "reduce_scatter_tensor": "reduce_scatter",
        "broadcast": "broadcast",
    }
)
# torch.distributed function -> normalised op; count keys are "torch.distributed.<name>"
TORCH_DISTRIBUTED_MODULE = "torch.distributed"
TORCH_DISTRIBUTED_COLLECTIVES: Mapping[str, str] = MappingProxyType(
    {
        "all_reduce": "all_reduce",
        "all_gather": "all_gather",
        "all_gather_into_tensor": "all_gather",
        "reduce_scatter": "reduce_scatter",
        "reduce_scatter_tensor": "reduce_scatter",
        "all_to_all": "all_to_all",
        "all_to_all_single": "all_to_all",
        "broadcast": "broadcast",
        "scatter": "scatter",
        "gather": "gather",
        "reduce": "reduce",
        "barrier": "barrier",
    }
)
# Attribute access reaching the dispatcher is bookkeeping, not an op the user wrote; so is MindSpore's
# `CellBackwardHook`, the op a Cell backward hook (ours, when tracking modules) wraps a DTensor input in.
_SKIPPED_OPS = frozenset({"__get__", "__set__", "__delete__", "CellBackwardHook"})

_slot: ObserverSlot[Observer] = ObserverSlot("hp_otel_hyper_parallel_observer")
_handles = AsyncHandles()


_torch_graph_task_id: list[Callable[[], int]] = []  # torch's, bound once torch is imported


def _torch_phase() -> str | None:
    if not _torch_graph_task_id:
        if "torch" not in sys.modules:
            return None
        from hp_otel.sources.pytorch._compat import current_graph_task_id

        _torch_graph_task_id.append(current_graph_task_id)
    return phase_of.of_collective(_torch_graph_task_id[0]() != -1)


def _module_if_framework_loaded(module_name: str, framework: str) -> ModuleType | None:
    """The module if imported, or importable now that its framework is imported; else None."""
    module = sys.modules.get(module_name)
    if module is not None or framework not in sys.modules:
        return module
    try:
        return importlib.import_module(module_name)
    except Exception as exc:  # this release has no such module, or it cannot load here
        logger.debug("hp_otel: %s not traced: %s", module_name, exc)
        return None


# --- tensors ----------------------------------------------------------------------------


class _TensorInfos:
    """TensorInfo of hyper-parallel DTensors (global shape, placements, mesh shape) and plain tensors."""

    def __init__(self) -> None:
        self._dtensor: type | None = None

    def resolve(self) -> None:
        dtensor = getattr(importlib.import_module(DTENSOR_MODULE), "DTensor", None)
        self._dtensor = dtensor if isinstance(dtensor, type) else None

    def _is_dtensor(self, value: Any) -> bool:
        if self._dtensor is not None:
            return isinstance(value, self._dtensor)
        return hasattr(value, "placements") and hasattr(value, "device_mesh")

    def info(self, value: Any) -> TensorInfo:
        if self._is_dtensor(value):
            return TensorInfo(
                shape=shape_of(value),
                dtype=str(value.dtype),
                is_dtensor=True,
                placements=tuple(repr(p) for p in value.placements),
                mesh_shape=tuple(int(d) for d in value.device_mesh.mesh_shape),
            )
        return TensorInfo(shape=shape_of(value), dtype=str(value.dtype))

    def of(self, *values: Any) -> list[TensorInfo]:
        """Infos of the tensors among `values`, looking one level into lists, tuples and dicts."""
        out: list[TensorInfo] = []
        for value in values:
            if isinstance(value, (list, tuple)):
                out.extend(self.info(v) for v in value if is_tensor_like(v))
            elif isinstance(value, dict):
                out.extend(self.info(v) for v in value.values() if is_tensor_like(v))
            elif is_tensor_like(value):
                out.append(self.info(value))
        return out


_infos = _TensorInfos()


def _op_enter(observer: Observer, op_name: str, args: Any, kwargs: Any) -> bool:
    """Report an op entering dispatch; False when it is not reported (so its exit is not either)."""
    if not observer.accepting or op_name in _SKIPPED_OPS:
        return False
    try:
        inputs = _infos.of(*(args or ()), *((kwargs or {}).values()))
    except Exception as exc:
        observer.on_fault("op_inputs", exc)
        inputs = []
    observer.on_op_enter(op_name, inputs)
    return True


def _op_exit(observer: Observer, op_name: str, result: Any, error: BaseException | None) -> None:
    if not observer.accepting or op_name in _SKIPPED_OPS:
        return
    outputs: list[TensorInfo] = []
    if error is None:
        try:
            outputs = _infos.of(result)
        except Exception as exc:
            observer.on_fault("op_outputs", exc)
    observer.on_op_exit(op_name, outputs, error)


class DispatchObserver:
    """What hyper-parallel's `_debug_mode_observer` slot calls; answers both spellings the framework uses."""

    __slots__ = ("observer",)

    def __init__(self, observer: Observer) -> None:
        self.observer = observer

    def on_op_dispatch_enter(self, op_name: Any, op_call: Any = None, args: Any = (), kwargs: Any = None) -> None:
        try:
            _op_enter(self.observer, str(op_name), args, kwargs)
        except Exception as exc:
            self.observer.on_fault("op_dispatch_enter", exc)

    def on_op_dispatch_exit(self, op_name: Any, result: Any = None) -> None:
        try:
            error = sys.exc_info()[1]  # called from dispatch()'s `finally`: set when the op raised
            _op_exit(self.observer, str(op_name), result, error if isinstance(error, BaseException) else None)
        except Exception as exc:
            self.observer.on_fault("op_dispatch_exit", exc)

    _on_op_dispatch_enter = on_op_dispatch_enter  # the design document's spelling
    _on_op_dispatch_exit = on_op_dispatch_exit


# --- OpDispatcher.dispatch wrapper, for releases without the observer slot ---------------


def _op_name(op_call: Any) -> str:
    """`platform.get_op_name(op_call)` when hyper-parallel's platform is already chosen, else the callable's name."""
    module = sys.modules.get(PLATFORM_MODULE)
    platform = getattr(module, "platform", None) if module is not None else None
    get_op_name = getattr(platform, "get_op_name", None)
    if get_op_name is not None:
        try:
            return str(get_op_name(op_call))
        except Exception:
            pass
    return str(getattr(op_call, "__name__", op_call))


def _wrap_dispatch(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def dispatch(self: Any, op_call: Any, *rest: Any, **kw: Any) -> Any:
        observer = _slot.current()
        if observer is None or not observer.accepting:
            return original(self, op_call, *rest, **kw)
        try:
            name = _op_name(op_call)
            args = rest[0] if rest else kw.get("args", ())
            kwargs = rest[1] if len(rest) > 1 else kw.get("kwargs")
            reported = _op_enter(observer, name, args, kwargs)
        except Exception as exc:
            observer.on_fault("op_dispatch_enter", exc)
            reported = False
        if not reported:
            return original(self, op_call, *rest, **kw)
        try:
            result = original(self, op_call, *rest, **kw)
        except BaseException as error:
            _op_exit(observer, name, None, error)
            raise
        _op_exit(observer, name, result, None)
        return result

    dispatch.__hp_otel_original__ = original  # type: ignore[attr-defined]
    return dispatch


def _plan_dispatch() -> list[AttributePatch]:
    dispatcher = importlib.import_module(OP_DISPATCH_MODULE).OpDispatcher
    return [AttributePatch(dispatcher, "dispatch", _wrap_dispatch)]


# --- collectives ------------------------------------------------------------------------


def _plan_collectives() -> list[AttributePatch]:
    resolver = GroupResolver()
    ops = {**DIFFERENTIABLE_COLLECTIVES, **PLATFORM_COLLECTIVES}

    def wrap_for(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def wrap(function: Callable[..., Any]) -> Callable[..., Any]:
            reader = CallReader(name, ops[name], function, resolver)
            return wrap_collective(function, reader, _slot, _handles, _torch_phase)

        return wrap

    def wrap_torch_distributed(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def wrap(function: Callable[..., Any]) -> Callable[..., Any]:
            reader = CallReader(f"{TORCH_DISTRIBUTED_MODULE}.{name}", TORCH_DISTRIBUTED_COLLECTIVES[name], function,
                                resolver)  # fmt: skip
            return wrap_collective(function, reader, _slot, _handles, _torch_phase)

        return wrap

    with all_or_nothing() as patches:
        for module_name, class_name, framework in PLATFORM_CLASSES:
            module = _module_if_framework_loaded(module_name, framework)
            cls = getattr(module, class_name, None) if module is not None else None
            if isinstance(cls, type):
                patches += patch_owned(cls, ops, wrap_for)
        utils = _module_if_framework_loaded(UTILS_MODULE, "torch")
        if utils is not None:
            patches += patch_owned(utils, DIFFERENTIABLE_COLLECTIVES, wrap_for)
        distributed = sys.modules.get(TORCH_DISTRIBUTED_MODULE)
        if distributed is not None:
            patches += patch_owned(distributed, TORCH_DISTRIBUTED_COLLECTIVES, wrap_torch_distributed)
    return patches


_dispatch_patches = SharedPatches(_plan_dispatch)
_collective_patches = SharedPatches(_plan_collectives)


def hooked_functions() -> list[str]:
    """`Owner.name` of every function traced right now (for tests and reports)."""
    out = []
    for patch in _dispatch_patches.patches + _collective_patches.patches:
        owner = patch.owner
        out.append(f"{getattr(owner, '__qualname__', getattr(owner, '__name__', owner))}.{patch.name}")
    return out


class HyperParallelSource:
    """Installs the op observer (or dispatch wrapper) and the collective wrappers."""

    def __init__(self) -> None:
        self._observer: Observer | None = None
        self._slot_token: contextvars.Token[Observer | None] | None = None
        self._collectives = False
        self._dispatch_patched = False
        self._observer_var: contextvars.ContextVar[Any] | None = None
        self._observer_token: contextvars.Token[Any] | None = None
        self._fully_shard = False

    @property
    def uses_observer_slot(self) -> bool:
        """True when ops come from the release's `_debug_mode_observer` (False: dispatch is wrapped)."""
        return self._observer_var is not None

    def attach(self, observer: Observer) -> None:
        self._observer = observer
        self._slot_token = _slot.push(observer)
        _collective_patches.acquire()
        self._collectives = True
        try:  # fully_shard's per-module state: whose parameters its collectives move (hyper_parallel_fsdp.py)
            state_patches.acquire()
            self._fully_shard = True
        except Exception as exc:
            observer.on_fault("attach:hyper_parallel_fully_shard", exc)
        try:
            _infos.resolve()
            variable = getattr(importlib.import_module(OP_DISPATCH_MODULE), OBSERVER_VARIABLE, None)
            if isinstance(variable, contextvars.ContextVar):
                self._observer_token = variable.set(DispatchObserver(observer))
                self._observer_var = variable
            else:
                _dispatch_patches.acquire()
                self._dispatch_patched = True
        except Exception as exc:  # ops cannot be traced in this release; collectives still are
            observer.on_fault("attach:hyper_parallel_op_dispatch", exc)

    def detach(self) -> None:
        """Undo attach in reverse order; every step runs even if an earlier one fails."""
        run_every(
            (self._reset_observer_slot, self._unpatch_dispatch, self._unpatch_fully_shard, self._unpatch_collectives)
        )

    def _unpatch_fully_shard(self) -> None:
        if self._fully_shard:
            self._fully_shard = False
            state_patches.release()

    def _reset_observer_slot(self) -> None:
        variable, token = self._observer_var, self._observer_token
        self._observer_var = self._observer_token = None
        if variable is not None and token is not None:
            try:
                variable.reset(token)
            except ValueError:  # exited in another context than entered
                pass

    def _unpatch_dispatch(self) -> None:
        if self._dispatch_patched:
            self._dispatch_patched = False
            _dispatch_patches.release()

    def _unpatch_collectives(self) -> None:
        observer, token = self._observer, self._slot_token
        self._observer = self._slot_token = None
        if observer is not None:
            _handles.close_all(observer)
        if self._collectives:
            self._collectives = False
            _collective_patches.release()
        if observer is not None and token is not None:
            _slot.pop(observer, token)
