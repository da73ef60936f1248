"""Collective durations come from the monotonic clock: a wall-clock step back mid-collective (NTP,
an operator's `date -s`) must not end a span before it starts, nor zero the exposed communication."""

from __future__ import annotations

import logging
import time

import pytest
import torch
import torch.distributed as dist

from hp_otel import CommDebugMode
from hp_otel.sources.pytorch import collective_timer
from hp_otel.sources.pytorch.device_timing import DeviceTimer
from hp_otel.spans import schema

HOUR_NS = 3600 * 10**9


class _WallClock:
    """`time.time_ns` that the test can step back, as a clock adjustment would."""

    def __init__(self) -> None:
        self.real = time.time_ns
        self.back_ns = 0

    def __call__(self) -> int:
        return self.real() - self.back_ns


@pytest.fixture
def wall_clock(monkeypatch):
    clock = _WallClock()
    monkeypatch.setattr(time, "time_ns", clock)
    return clock


@pytest.fixture
def step_back_mid_collective(monkeypatch, wall_clock):
    """The clock steps back 1 h after the timer read the collective's start, before the op runs
    (the device-timer hook sits exactly there)."""

    class StepBack(DeviceTimer):
        def start(self, tensor):  # type: ignore[no-untyped-def]
            wall_clock.back_ns += HOUR_NS
            return None

    monkeypatch.setattr(collective_timer, "DeviceTimer", lambda: StepBack())
    return wall_clock


def _functional() -> None:
    out = torch.ops._c10d_functional.all_reduce(torch.ones(4), "sum", dist.group.WORLD.group_name)
    torch.ops._c10d_functional.wait_tensor(out)


def _eager() -> None:
    dist.all_reduce(torch.ones(4))


@pytest.mark.parametrize("collective", [_functional, _eager], ids=["functional", "eager"])
def test_a_clock_step_back_mid_collective_leaves_its_duration_positive(
    fake_world, fake_group_timed, step_back_mid_collective, collective, caplog
) -> None:
    with caplog.at_level(logging.WARNING):
        with CommDebugMode() as mode:
            collective()
        spans = [x for x in mode.get_finished_spans() if x.attributes[schema.CALL_KIND] == schema.KIND_COLLECTIVE]
        exposure = mode.get_comm_exposure().total
    assert step_back_mid_collective.back_ns == HOUR_NS  # the step happened, once
    (span,) = spans
    assert 0 <= span.end_time - span.start_time < 10 * 10**9  # not -3,600 s
    assert exposure.collectives == 1 and exposure.comm_ns > 0
    assert not [r for r in caplog.records if "non-negative" in r.getMessage()]
    assert mode.get_callback_error_counts() == {}
