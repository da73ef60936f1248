"""The window's collective timer: times each collective the hooks hand it and reports it
to the observer twice (when issued and when its op returns), with a completion probe when
the observer asks for one.  Both collective hooks (the kernels and the dispatch mode) call it."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from hp_otel.record import phase as phase_of
from hp_otel.record.observer import Observer
from hp_otel.sources.pytorch import _compat
from hp_otel.sources.pytorch.collectives import CollectiveSpec
from hp_otel.sources.pytorch.completion import Completions
from hp_otel.sources.pytorch.device_timing import DeviceSpan, DeviceTimer
from hp_otel.sources.pytorch.fsdp import param_module

_in_backward: Callable[[], int] = _compat.current_graph_task_id  # -1 outside autograd
_cuda_initialized: Callable[[], bool] = torch.cuda.is_initialized

_monotonic_ns = time.monotonic_ns


class _Waited:
    """A functional collective's result: done once `wait_tensor` returned for it."""

    __slots__ = ("done",)

    def __init__(self) -> None:
        self.done = False

    def __call__(self) -> bool:
        return self.done


class _WorkDone:
    """An eager c10d collective's Work: done when the backend says so (asked from the watchdog thread)."""

    __slots__ = ("_boxed",)

    def __init__(self, boxed: Any) -> None:
        self._boxed = boxed

    def __call__(self) -> bool:
        work = _compat.unbox_work(self._boxed)
        if isinstance(work, _FAKE_WORK):  # the fake process group's work never reports completion
            return True
        return bool(work.is_completed())


_FAKE_WORK: type = _compat.FakeWork


class CollectiveTimer:
    """Times and reports the collectives of one window; both hook paths call it.

    Each collective is reported twice: when issued (its sequence number, and what a hang
    watchdog sees if it never returns) and when its op returns.  Collective ops return
    before the work is done (eager c10d ops hand back a Work, functional ones a tensor
    `wait_tensor` waits for); when the observer asks for it (`wants_completion`, set by
    the watchdog), the issue record carries a probe that says when the work is done.
    """

    def __init__(self, observer: Observer, device_timer: DeviceTimer | None = None) -> None:
        self._observer = observer
        self._completions = Completions(observer)
        self._device_timer = device_timer or DeviceTimer()  # CUDA tensors only (device_timing.py)
        # No CUDA tensor exists before CUDA is initialised: the default timer then looks at no tensor
        # (a window opened before the first CUDA use keeps host times only).
        self._times_devices = type(self._device_timer) is not DeviceTimer or _cuda_initialized()

    @property
    def accepting(self) -> bool:
        return bool(self._observer.accepting)

    def on_fault(self, where: str, exc: BaseException) -> None:
        self._observer.on_fault(where, exc)

    def collective(self, spec: CollectiveSpec, call: Callable[..., Any], args: Any, kwargs: Any) -> Any:
        """Run `call(*args, **kwargs)`, the collective op `spec` describes, and report it."""
        # The start is an epoch time (spans line up across ranks); every later time of this
        # collective is the start plus a monotonic duration: a wall-clock step never makes one negative.
        start = time.time_ns()
        anchor = start - _monotonic_ns()
        info, phase, ticket = self._issue(spec, args, kwargs, start)
        device = self._device_start(spec, args, kwargs) if ticket is not None and self._times_devices else None
        try:
            result = call(*args, **kwargs)
        except BaseException as error:
            self._report(spec, info, phase, ticket, args, kwargs, None, start, anchor, error)
            raise
        self._report(spec, info, phase, ticket, args, kwargs, result, start, anchor, None, device)
        return result

    def waited(self, tensor: Any, start_ns: int | None = None) -> None:
        """`wait_tensor(tensor)` returned (called at `start_ns`, monotonic clock): the watchdog's probe
        is done, its collective completes now."""
        try:
            self._completions.waited(tensor, start_ns)
        except Exception as exc:
            self._observer.on_fault("collective_complete", exc)

    def work_waited(self, work: Any, start_ns: int, end_ns: int) -> None:
        """`work.wait()` returned: how long the thread waited for that collective (monotonic clock)."""
        try:
            self._completions.work_waited(work, start_ns, end_ns)
        except Exception as exc:
            self._observer.on_fault("collective_wait", exc)

    def _device_start(self, spec: CollectiveSpec, args: Any, kwargs: Any) -> DeviceSpan | None:
        try:
            return self._device_timer.start(spec.first_input(args, kwargs))
        except Exception as exc:  # the host time stands
            self._observer.on_fault("collective_device_time", exc)
            return None

    def waited_in(self, args: Any, kwargs: Any) -> None:
        """An op that read AsyncCollectiveTensors (which waits inside) returned."""
        try:
            self._completions.waited_in(args, kwargs)
        except Exception as exc:
            self._observer.on_fault("collective_complete", exc)

    def _issue(self, spec: CollectiveSpec, args: Any, kwargs: Any, start: int) -> tuple[Any, str, Any]:
        observer = self._observer
        try:
            # A hint, not the phase (record/phase.py): whether autograd runs now. The recorder decides
            # the phase once (record/attribution.py: a recompute, the optimizer, outside every module).
            phase = phase_of.of_collective(_in_backward() != -1)
            if not observer.spans_enabled and not observer.wants_completion:  # a counts-only window
                info = spec.describe_counts(args, kwargs)
                return info, phase, observer.on_collective_issue(info, start, phase)  # the staleness gauges
            info = spec.describe(args, kwargs, None, param_module())
            return info, phase, observer.on_collective_issue(info, start, phase)
        except Exception as exc:
            observer.on_fault("collective_issue", exc)
            return None, "", None

    def _report(
        self, spec: CollectiveSpec, info: Any, phase: str, ticket: Any, args: Any, kwargs: Any, result: Any,
        start: int, anchor: int, error: Any, device: DeviceSpan | None = None,
    ) -> None:  # fmt: skip
        end = anchor + _monotonic_ns()
        observer = self._observer
        done = None
        try:
            watched = ticket is not None and observer.wants_completion  # (a property: asked once)
            if info is None:
                info = spec.describe(args, kwargs, result, param_module())
            elif info.output_shape or watched or (ticket is not None and observer.spans_enabled):
                # (a counts-only info has no shapes to complete)
                info = spec.complete(info, result)
            if watched and error is None:
                done = self._probe(spec, args, kwargs, result)
        except Exception as exc:
            observer.on_fault("collective_describe", exc)
            if ticket is not None:
                observer.on_collective(info, start, end, error, phase, ticket)  # closes the issue record
            return
        try:
            if not phase:
                phase = phase_of.of_collective(_in_backward() != -1)
            if device is None:
                token = observer.on_collective(
                    info, start, end, error, phase, ticket, awaits_completion=result is not None, done=done
                )
            else:  # CUDA: the recorder asks the events when it builds the span
                if result is None:
                    device.finish()
                token = observer.on_collective(
                    info, start, end, error, phase, ticket, awaits_completion=result is not None, done=done,
                    device=device,
                )  # fmt: skip
            if token is not None:  # launched, not finished: its wait or Work says when it is
                self._completions.launched(spec.functional, result, token, device, anchor)
        except Exception as exc:
            observer.on_fault("collective_after", exc)

    def _probe(self, spec: CollectiveSpec, args: Any, kwargs: Any, result: Any) -> Callable[[], bool] | None:
        """What says when the returned collective's work is done, or None (done when the op returned)."""
        if spec.functional:
            output = result if isinstance(result, torch.Tensor) else spec.first_input(args, kwargs)
            if output is None:
                return None
            waited = _Waited()
            self._completions.probe(output, waited)  # done when its wait is seen (by storage, views too)
            return waited
        work = result[-1] if isinstance(result, tuple) and result else result
        return _WorkDone(work) if isinstance(work, torch.ScriptObject) else None
