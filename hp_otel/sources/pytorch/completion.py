"""When an async torch collective completes, not just when it was launched.

At dispatch level every collective op returns once it is launched: a functional
collective (`_c10d_functional.all_reduce`) returns its output tensor before the
transfer is done, an eager c10d op (`c10d.allreduce_`) returns a `Work` — also for
`async_op=False`, whose Python wrapper waits right after.  This helper pairs the two:

- a functional collective with the `_c10d_functional.wait_tensor` of its output —
  called directly (`AsyncCollectiveTensor.wait()`), or inside an op that reads an
  `AsyncCollectiveTensor` (which runs the wait out of any mode's sight, so the op's
  return is the moment the wait is known to be done).  Outputs are matched by storage,
  as torch's own work registry does, so a view of the output waits for it too;
- an eager op with its `Work`: a callback on the work's future records the moment the
  work completed (gloo completes it on its own thread).

The observer moves the collective's end to that moment (`on_collective_complete`).
How long the thread waited for it (`wait_tensor`'s call, `Work.wait()` — see `waits.py`) is
reported too (`on_collective_wait`): the communication the step did not overlap.  On CUDA the
device span's end event is recorded at those moments too (`device_timing.py`).
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist

from hp_otel.record.observer import Observer
from hp_otel.sources.pytorch import _compat
from hp_otel.spans import schema

WAIT_TENSOR = _compat.WAIT_TENSOR
AsyncCollectiveTensor = _compat.AsyncCollectiveTensor
_MAX_PENDING = 4096  # outputs never waited (a step that raised) must not pile up
_storage_key = _compat.storage_key


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


class Completions:
    """Pending async collectives of one observer, and what completes them."""

    def __init__(self, observer: Observer) -> None:
        self._observer = observer
        # storage of a functional output -> (the observer's token, its clock anchor: see `launched`)
        self._by_storage: dict[int, tuple[Any, int]] = {}
        self._probes: dict[int, Any] = {}  # storage of a functional output -> the watchdog's probe (`.done`)
        self._devices: dict[int, Any] = {}  # storage of a functional output -> its DeviceSpan (CUDA)
        self._by_work: dict[Any, tuple[Any, Any, int]] = {}  # an eager op's Work -> (token, DeviceSpan or None, anchor)
        self._on_wait = getattr(observer, "on_collective_wait", None)  # optional for observers

    def launched(
        self, functional: bool, result: Any, token: Any, device: Any = None, anchor: int | None = None
    ) -> None:
        """A collective op returned `result` without finishing; `token` is the observer's;
        `device` its DeviceSpan on CUDA (its end is recorded when the collective is waited for).
        `anchor`: its start's epoch time less the monotonic clock then: its completion is
        `anchor + time.monotonic_ns()`, so a wall-clock step cannot end it before it began."""
        if anchor is None:
            anchor = time.time_ns() - time.monotonic_ns()
        if functional:
            pending = self._by_storage
            if len(pending) >= _MAX_PENDING:
                pending.clear()
                self._devices.clear()
            for tensor in (result,) if isinstance(result, torch.Tensor) else _tensors(result):
                key = _storage_key(tensor)
                pending[key] = (token, anchor)
                if device is not None:
                    self._devices[key] = device
            return
        work = result[-1] if isinstance(result, (tuple, list)) and result else result
        if isinstance(work, torch.ScriptObject):
            work = _compat.unbox_work(work)
        if not isinstance(work, dist.distributed_c10d.Work):
            return
        by_work = self._by_work
        if len(by_work) >= _MAX_PENDING:  # works never waited for: forget them
            by_work.clear()
        by_work[work] = (token, device, anchor)
        try:
            future = work.get_future()
        except RuntimeError:  # a backend without futures: only the launch is known
            return
        observer = self._observer

        def completed(_future: Any) -> None:  # on the backend's thread: record the time, nothing more
            try:
                if device is not None:  # a CUDA future runs this with its streams synchronised
                    device.finish()
                observer.on_collective_complete(token, anchor + time.monotonic_ns(), schema.COMPLETION_WORK)
            except Exception as exc:
                observer.on_fault("collective_complete", exc)

        future.then(completed)

    def probe(self, output: torch.Tensor, probe: Any) -> None:
        """Set `probe.done` when the wait of `output` is seen (the hang watchdog asks it)."""
        probes = self._probes
        if len(probes) >= _MAX_PENDING:  # results never waited for: forget the oldest
            probes.pop(next(iter(probes)))
        probes[_storage_key(output)] = probe

    def waited(self, tensor: Any, start_ns: int | None = None) -> None:
        """`wait_tensor(tensor)` returned (called at `start_ns` of the monotonic clock, when known):
        the collective that made its storage is done."""
        if not (self._by_storage or self._probes) or not isinstance(tensor, torch.Tensor):
            return
        key = _storage_key(tensor)
        probe = self._probes.pop(key, None)
        if probe is not None:
            probe.done = True
        pending = self._by_storage.pop(key, None)
        if pending is not None:
            token, anchor = pending
            now = anchor + time.monotonic_ns()
            device = self._devices.pop(key, None)
            if device is not None:  # the current stream now waits for the collective
                device.finish()
            if start_ns is not None and self._on_wait is not None:
                self._on_wait(token, min(anchor + start_ns, now), now)
            self._observer.on_collective_complete(token, now, schema.COMPLETION_WAIT)

    def work_waited(self, work: Any, start_ns: int, end_ns: int) -> None:
        """`work.wait()` ran from `start_ns` to `end_ns` (monotonic clock) on a Work this window launched."""
        pending = self._by_work.pop(work, None)
        if pending is None:
            return
        token, device, anchor = pending
        if device is not None:
            device.finish()
        if self._on_wait is not None:
            self._on_wait(token, anchor + start_ns, anchor + end_ns)

    def waited_in(self, args: Any, kwargs: Any) -> None:
        """An op that read AsyncCollectiveTensors returned: their waits are done."""
        if not (self._by_storage or self._probes):
            return
        for value in (*args, *kwargs.values()):
            for item in value if isinstance(value, (list, tuple)) else (value,):
                # a view of one is not a wait: it stays pending until something reads it
                if isinstance(item, AsyncCollectiveTensor) and item.completed:
                    self.waited(item.elem)

    def clear(self) -> None:
        self._by_storage.clear()
        self._probes.clear()
        self._devices.clear()
        self._by_work.clear()
