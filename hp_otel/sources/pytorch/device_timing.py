"""Device time of collectives on CUDA tensors, from CUDA events, without synchronising the step.

A start event is recorded on the current stream just before the collective is issued
(c10d makes the collective's stream wait for it); the end event once a stream that waits
for the collective is current: in the `Work` future's callback (CUDA futures run callbacks
with their streams synchronised), after `Work.wait()`, or after the functional collective's
`wait_tensor` returned.  The recorder asks `DeviceSpan()` when the span is built: the
elapsed time if both events are complete (`Event.query()`), else None and the span keeps
its host time.  Nothing here calls `synchronize()`.

The end event is an upper bound on the collective's end when the current stream had other
work queued before it.  UNVERIFIED on a GPU so far (see docs/overlap.md): the bookkeeping is
tested on CPU with fake events; the CUDA test skips without CUDA.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

EventFactory = Callable[[], Any]  # makes an object with record(), query(), elapsed_time(other) in ms


def cuda_timing_event() -> Any:
    import torch

    return torch.cuda.Event(enable_timing=True)


class DeviceSpan:
    """The two events of one collective; called, says its device time in ns once both are complete."""

    __slots__ = ("_end", "_finished", "_ns", "_start")

    def __init__(self, start: Any, end: Any) -> None:
        self._start = start
        self._end = end
        self._finished = False
        self._ns: int | None = None

    @property
    def finished(self) -> bool:
        return self._finished

    def finish(self) -> None:
        """Record the end event on the current stream (the first call only)."""
        if not self._finished:
            self._finished = True
            self._end.record()

    def __call__(self) -> int | None:
        if self._ns is not None:
            return self._ns
        if not self._finished or not (self._end.query() and self._start.query()):
            return None  # not complete yet: never wait for it
        self._ns = max(int(self._start.elapsed_time(self._end) * 1e6), 0)
        return self._ns


class DeviceTimer:
    """Starts a `DeviceSpan` for collectives whose tensor is on a CUDA device."""

    __slots__ = ("_make",)

    def __init__(self, make_event: EventFactory = cuda_timing_event) -> None:
        self._make = make_event

    def start(self, tensor: Any) -> DeviceSpan | None:
        """A started span when `tensor` is a CUDA tensor, else None (CPU: nothing is made)."""
        if tensor is None or not getattr(tensor, "is_cuda", False):
            return None
        start = self._make()
        start.record()
        return DeviceSpan(start, self._make())
