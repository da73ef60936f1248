"""`Work.wait()` timed: how long the step waits for an eager c10d collective.

Eager collectives hand back a `Work`; the thread then blocks in `work.wait()` (the
Python wrapper of a synchronous `dist.all_reduce` calls it at once, `async_op=True` users
and FSDP2 later).  No dispatcher op marks that wait, so `torch.distributed.Work.wait` is
replaced while a window records spans (restored exactly, shared by every window like the
other patches) and reports each wait to the window's collective timer: the part of the
collective the step did not overlap (docs/overlap.md).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from hp_otel.sources.patching import AttributePatch, ObserverSlot, SharedPatches
from hp_otel.sources.pytorch.collective_timer import CollectiveTimer

wait_slot: ObserverSlot[CollectiveTimer] = ObserverSlot("hp_otel_work_wait")
_wrappers: dict[int, Callable[..., Any]] = {}  # id(original) -> its wrapper (which keeps it alive), made once


def _make_wrapper(original: Any) -> Callable[..., Any]:
    wrapper = _wrappers.get(id(original))  # pybind's instancemethod is not hashable
    if wrapper is not None:
        return wrapper

    def wait(self: Any, *args: Any, **kwargs: Any) -> Any:
        start = time.monotonic_ns()
        try:
            return original(self, *args, **kwargs)
        finally:
            timer = wait_slot.current()
            if timer is not None:  # never raises: faults are counted by the timer
                timer.work_waited(self, start, time.monotonic_ns())

    functools.update_wrapper(wait, original, assigned=("__name__", "__qualname__", "__doc__"), updated=())
    wait.__hp_otel_original__ = original  # type: ignore[attr-defined]
    _wrappers[id(original)] = wait
    return wait


class _PybindPatch(AttributePatch):
    """`Work` is a pybind11 class: its metaclass refuses `type.__setattr__`, plain setattr works."""

    def _set(self, value: Any) -> None:
        setattr(self.owner, self.name, value)


def _plan() -> list[AttributePatch]:
    work = getattr(dist, "Work", None)  # absent when torch is built without distributed
    if work is None or "wait" not in vars(work):
        return []
    return [_PybindPatch(work, "wait", _make_wrapper)]


work_wait_patches = SharedPatches(_plan)
