"""Device time of CUDA collectives from events, never a sync: the bookkeeping with fake events on
CPU (what is recorded when, what the span says), and the real path where CUDA is present."""

from __future__ import annotations

import time
from typing import ClassVar

import pytest
import torch
import torch.multiprocessing as mp

from hp_otel import CommDebugMode
from hp_otel.sources.pytorch import collective_timer
from hp_otel.sources.pytorch.device_timing import DeviceSpan, DeviceTimer
from hp_otel.spans import schema


class FakeEvent:
    """A CUDA event stand-in: complete when the test says so; a sync is a test failure."""

    made: ClassVar[list[FakeEvent]] = []

    def __init__(self) -> None:
        self.recorded_at: int | None = None
        self.complete = False
        self.ms = 0.0
        FakeEvent.made.append(self)

    def record(self) -> None:
        self.recorded_at = time.perf_counter_ns()

    def query(self) -> bool:
        return self.complete

    def elapsed_time(self, end: FakeEvent) -> float:
        assert self.complete and end.complete, "elapsed_time on an incomplete event would sync"
        return end.ms - self.ms

    def synchronize(self) -> None:
        raise AssertionError("synchronize() on the step's path")


class EveryTensorIsCuda(DeviceTimer):
    """Times every collective, as if its tensor were on a CUDA device."""

    def start(self, tensor):  # type: ignore[no-untyped-def]
        start = self._make()
        start.record()
        return DeviceSpan(start, self._make())


@pytest.fixture
def fake_cuda(monkeypatch):
    FakeEvent.made = []
    monkeypatch.setattr(collective_timer, "DeviceTimer", lambda: EveryTensorIsCuda(FakeEvent))
    return FakeEvent.made


def test_device_span_says_nothing_until_both_events_are_complete() -> None:
    span = DeviceTimer(FakeEvent).start(type("T", (), {"is_cuda": True})())
    assert span is not None and span() is None  # end not recorded yet
    span.finish()
    start, end = FakeEvent.made[-2:]
    assert span() is None  # recorded, not complete: no waiting for it
    start.complete = end.complete = True
    end.ms = 2.5
    assert span() == 2_500_000
    assert DeviceTimer(FakeEvent).start(torch.ones(1)) is None  # a CPU tensor: nothing made


def _functional_all_reduce_waited() -> None:
    import torch.distributed as dist

    out = torch.ops._c10d_functional.all_reduce(torch.ones(4), "sum", dist.group.WORLD.group_name)
    torch.ops._c10d_functional.wait_tensor(out)


def test_span_takes_the_device_time_when_the_events_are_complete(fake_world, fake_cuda) -> None:
    with CommDebugMode() as mode:
        _functional_all_reduce_waited()
        start, end = fake_cuda
        assert start.recorded_at is not None and end.recorded_at is not None  # end: after wait_tensor
    start.complete = end.complete = True  # the device got there after the window closed
    end.ms = 3.0
    (span,) = [x for x in mode.get_finished_spans() if x.attributes[schema.CALL_KIND] == schema.KIND_COLLECTIVE]
    assert span.attributes[schema.COLLECTIVE_COMPLETION] == schema.COMPLETION_DEVICE
    assert span.end_time - span.start_time == 3_000_000
    assert mode.get_callback_error_counts() == {}


def test_incomplete_events_leave_the_host_time(fake_world, fake_cuda) -> None:
    with CommDebugMode() as mode:
        _functional_all_reduce_waited()
    (span,) = [x for x in mode.get_finished_spans() if x.attributes[schema.CALL_KIND] == schema.KIND_COLLECTIVE]
    assert span.attributes[schema.COLLECTIVE_COMPLETION] == schema.COMPLETION_WAIT
    assert mode.get_callback_error_counts() == {}


def test_cpu_collectives_make_no_events(fake_world) -> None:
    with CommDebugMode() as mode:
        _functional_all_reduce_waited()
    (span,) = [x for x in mode.get_finished_spans() if x.attributes[schema.CALL_KIND] == schema.KIND_COLLECTIVE]
    assert span.attributes[schema.COLLECTIVE_COMPLETION] == schema.COMPLETION_WAIT


def _nccl_worker(rank: int, path: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("nccl", init_method=f"file://{path}", rank=0, world_size=1)
    try:
        x = torch.ones(1 << 22, device="cuda")
        with CommDebugMode() as mode:
            dist.all_reduce(x)
            dist.all_reduce(x, async_op=True).wait()
        torch.cuda.synchronize()  # the test's sync, after the window: the events are complete now
        spans = [x for x in mode.get_finished_spans() if x.attributes[schema.CALL_KIND] == schema.KIND_COLLECTIVE]
        completions = [x.attributes[schema.COLLECTIVE_COMPLETION] for x in spans]
        assert completions == [schema.COMPLETION_DEVICE] * 2, completions
        assert all(x.end_time > x.start_time for x in spans)
        print("device ns:", [x.end_time - x.start_time for x in spans])
    finally:
        dist.destroy_process_group()


@pytest.mark.multiprocess
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: the device-time path runs on a GPU only")
def test_nccl_collectives_take_the_device_time(tmp_path) -> None:
    mp.spawn(_nccl_worker, args=(str(tmp_path / "pg"),), nprocs=1, join=True)
