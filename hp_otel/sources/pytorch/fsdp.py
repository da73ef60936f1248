"""FSDP2 (`torch.distributed.fsdp.fully_shard`): which module's parameters a collective moves.

FSDP issues its all_gathers (unshard, also when prefetching another module's parameters
while the current one runs) and its reduce_scatters / HSDP all_reduces (post-backward,
also from the root's final callback) inside two methods of the module's parameter
group.  Both are wrapped while a window is active: they name the group's module for the
duration of the call, and the collective source attaches that name to every collective
issued meanwhile (`hp_otel.collective.param.module`).  The name is FSDP's own module fqn,
relative to the module `fully_shard` was last applied to (the root, "(root)").

FSDP1 (`FullyShardedDataParallel`) issues a flat parameter's all-gather in
`_runtime_utils._unshard(state, handle)` (its own pre-forward and pre-backward, and when
prefetching another unit's) and its gradient reduction in `_reduce_grad(state, handle)`; both
are wrapped likewise and name the module the handle shards: with `use_orig_params=True` the
flat parameter is no registered parameter of any module, so its gradient hook's collectives
would otherwise count for none.
"""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Callable
from types import MappingProxyType
from typing import Any

from hp_otel.sources.patching import AttributePatch, SharedPatches, patch_owned
from hp_otel.sources.pytorch import _compat
from hp_otel.spans import schema

_METHODS = _compat.FSDP_GROUP_METHODS  # where FSDP2 issues every collective of a parameter group
_param_module: contextvars.ContextVar[str] = contextvars.ContextVar("hp_otel_fsdp_param_module", default="")
# The module objects of that group (what the module tracker maps to its calls: the counts and
# backward spans of the collective go to the group's module, see `modules.TorchModuleTracker`).
_param_modules: contextvars.ContextVar[tuple[Any, ...]] = contextvars.ContextVar("hp_otel_fsdp_modules", default=())
_wrappers: dict[Callable[..., Any], Callable[..., Any]] = {}  # original -> its wrapper, made once
# The phase of the group method running: what its collective is part of when it runs outside every
# module and outside autograd (a pipeline schedule calls `unshard()` and `post_backward()` so).
_param_phase: contextvars.ContextVar[str] = contextvars.ContextVar("hp_otel_fsdp_phase", default="")
_PHASES = MappingProxyType(
    {  # FSDP2's and hyper-parallel's group methods, FSDP1's handle functions
        "unshard": schema.PHASE_FORWARD,
        "_unshard": schema.PHASE_FORWARD,
        "post_backward": schema.PHASE_BACKWARD,
        "_reduce_grad": schema.PHASE_BACKWARD,
        "_reduce_grad_no_shard": schema.PHASE_BACKWARD,
    }
)
# Module trackers' namers (innermost window last): a group's module by its path in the traced model.
_namers: list[Callable[[Any], str | None]] = []


def param_module() -> str:
    """The module whose FSDP parameters the collectives issued now move ("" outside FSDP): named by
    its path in the model a window traces when a module tracker knows every module of the group
    (", " between several, as FSDP does), else by FSDP's own name (relative to the module
    `fully_shard` was last applied to: each pipeline stage's is "(root)")."""
    fqn = _param_module.get()
    if fqn and _namers:  # (FSDP1 and hyper-parallel name none)
        modules = _param_modules.get()
        if modules:
            names = [_namers[-1](module) for module in modules]
            if None not in names:
                return ", ".join(dict.fromkeys(names))  # type: ignore[arg-type]
    return fqn


def add_namer(namer: Callable[[Any], str | None]) -> None:
    """A window's module tracker names group modules from now on (until `remove_namer`)."""
    _namers.append(namer)


def remove_namer(namer: Callable[[Any], str | None]) -> None:
    for i in range(len(_namers) - 1, -1, -1):
        if _namers[i] == namer:
            del _namers[i]
            return


def param_group_phase() -> str:
    """The phase of the group method issuing the collectives now (forward: gathering; backward:
    reducing; "" outside FSDP)."""
    return _param_phase.get()


def param_group_modules() -> tuple[Any, ...]:
    """The modules whose FSDP parameter group issues the collectives now (() outside FSDP)."""
    return _param_modules.get()


def _fsdp_group(group: Any) -> tuple[str, tuple[Any, ...]]:
    return _compat.fsdp_module_fqn(group) or schema.ROOT_MODULE_FQN, _compat.fsdp_group_modules(group)


def _wrap_for(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    return lambda original: group_method_wrapper(original, _fsdp_group, name)


def group_method_wrapper(
    original: Callable[..., Any], describe: Callable[[Any], tuple[str, tuple[Any, ...]]], name: str
) -> Callable[..., Any]:
    """`original` (the group method `name` of a framework's parameter group, issuing its collectives)
    naming, while it runs, the group's module: `describe(group)` says (its name for
    `hp_otel.collective.param.module`, "" for none; the modules it was applied to).  Made once per
    original; hyper-parallel's `fully_shard` uses it too (`hp_otel.sources.hyper_parallel_fsdp`)."""
    wrapper = _wrappers.get(original)
    if wrapper is None:
        wrapper = _wrappers[original] = _make_wrapper(original, describe, _PHASES.get(name, ""))
    return wrapper


def _make_wrapper(
    original: Callable[..., Any], describe: Callable[[Any], tuple[str, tuple[Any, ...]]], phase: str
) -> Callable[..., Any]:
    @functools.wraps(original)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            fqn, modules = describe(self)
            token = _param_module.set(fqn)
            modules_token = _param_modules.set(modules)
            phase_token = _param_phase.set(phase)
        except Exception:  # never stand between FSDP and its work
            return original(self, *args, **kwargs)
        try:
            return original(self, *args, **kwargs)
        finally:
            _param_phase.reset(phase_token)
            _param_modules.reset(modules_token)
            _param_module.reset(token)

    wrapper.__hp_otel_original__ = original  # type: ignore[attr-defined]
    return wrapper


def _handle_wrapper_for(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    return lambda original: _handle_wrapper(original, _PHASES.get(name, ""))


def _handle_wrapper(original: Callable[..., Any], phase: str) -> Callable[..., Any]:
    """FSDP1's `original(state, handle, ...)` naming, while it runs, the module `handle` shards."""
    wrapper = _wrappers.get(original)
    if wrapper is not None:
        return wrapper

    @functools.wraps(original)
    def handle_wrapper(state: Any, handle: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            module = _compat.fsdp1_handle_module(handle)
            token = _param_modules.set((module,) if module is not None else ())
            phase_token = _param_phase.set(phase)
        except Exception:  # never stand between FSDP and its work
            return original(state, handle, *args, **kwargs)
        try:
            return original(state, handle, *args, **kwargs)
        finally:
            _param_phase.reset(phase_token)
            _param_modules.reset(token)

    handle_wrapper.__hp_otel_original__ = original  # type: ignore[attr-defined]
    wrapper = _wrappers[original] = handle_wrapper
    return wrapper


def _plan() -> list[AttributePatch]:
    group = _compat.loaded_fsdp_param_group()  # None when FSDP2 is not imported: nobody uses it here
    if group is None:
        return []
    return patch_owned(group, _METHODS, _wrap_for)


def _plan_fsdp1() -> list[AttributePatch]:
    runtime = _compat.loaded_fsdp1_runtime()
    if runtime is None:
        return []
    return patch_owned(runtime, _compat.FSDP1_HANDLE_FUNCTIONS, _handle_wrapper_for)


fsdp_patches = SharedPatches(_plan)
# Taken by the module tracker only for a tree holding an FSDP1 unit (only module counts need them):
# FSDP1's runtime is imported with torch.distributed.fsdp, by most models that never use it.
fsdp1_patches = SharedPatches(_plan_fsdp1)
