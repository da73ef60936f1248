"""MindSpore collectives (without hyper-parallel): `mindspore.mint.distributed.*` and `mindspore.ops.communication.*`.

Both modules hold their own implementations of the same functions, so each attribute
gets its own wrapper and count key (`mint.distributed.all_reduce`,
`ops.communication.all_reduce`); a collective called from inside another traced one is
not counted twice.  Groups are names (size via `get_group_size`; None is the world).
With `async_op=True` the call is reported when its handle's `wait()` returns (or when
the window ends, if never waited).  Functions a release lacks are skipped.
"""

from __future__ import annotations

import contextvars
import importlib
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from hp_otel.record.observer import Observer
from hp_otel.sources.function_collectives import AsyncHandles, CallReader, GroupResolver, wrap_collective
from hp_otel.sources.patching import AttributePatch, ObserverSlot, SharedPatches, all_or_nothing, patch_owned

# module -> the prefix of its count keys
COLLECTIVE_MODULES: Mapping[str, str] = MappingProxyType(
    {
        "mindspore.mint.distributed": "mint.distributed",
        "mindspore.ops.communication": "ops.communication",
    }
)
# function -> normalised op
COLLECTIVES: Mapping[str, str] = MappingProxyType(
    {
        "all_reduce": "all_reduce",
        "all_gather": "all_gather",
        "all_gather_into_tensor": "all_gather",
        "broadcast": "broadcast",
        "barrier": "barrier",
        "reduce_scatter": "reduce_scatter",
        "reduce_scatter_tensor": "reduce_scatter",
        "all_to_all": "all_to_all",
        "all_to_all_single": "all_to_all",
        "reduce": "reduce",
        "gather": "gather",
        "scatter": "scatter",
        "send": "send",
        "recv": "recv",
        "isend": "send",
        "irecv": "recv",
    }
)

_slot: ObserverSlot[Observer] = ObserverSlot("hp_otel_mindspore_observer")
_handles = AsyncHandles()


def _plan() -> list[AttributePatch]:
    resolver = GroupResolver()
    with all_or_nothing() as patches:
        for module_name, prefix in COLLECTIVE_MODULES.items():
            module = importlib.import_module(module_name)

            def wrap_for(name: str, prefix: str = prefix) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
                def wrap(function: Callable[..., Any]) -> Callable[..., Any]:
                    reader = CallReader(f"{prefix}.{name}", COLLECTIVES[name], function, resolver)
                    return wrap_collective(function, reader, _slot, _handles)

                return wrap

            patches += patch_owned(module, COLLECTIVES, wrap_for)
    return patches


_patches = SharedPatches(_plan)


def hooked_functions() -> list[str]:
    """`module.name` of every function traced right now."""
    return [f"{patch.owner.__name__}.{patch.name}" for patch in _patches.patches]


class MindSporeCollectiveSource:
    """Wraps MindSpore's communication functions while installed."""

    def __init__(self) -> None:
        self._observer: Observer | None = None
        self._token: contextvars.Token[Observer | None] | None = None
        self._acquired = False

    def attach(self, observer: Observer) -> None:
        self._observer = observer
        self._token = _slot.push(observer)
        _patches.acquire()
        self._acquired = True

    def detach(self) -> None:
        observer, token = self._observer, self._token
        self._observer = self._token = None
        try:
            if observer is not None:
                _handles.close_all(observer)
            if self._acquired:
                self._acquired = False
                _patches.release()
        finally:
            if observer is not None and token is not None:
                _slot.pop(observer, token)
