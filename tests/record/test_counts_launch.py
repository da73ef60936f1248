"""A counts-only window's launched (async) collectives: without a watchdog the issue's ticket is the
launch's record (`ev.Launch`), with one a `Collective`; both give the duration histogram, the bus
bandwidth and the staleness gauges that the reported times give (worked out here from those times
and nccl-tests' bus factor, not from our own output)."""

from __future__ import annotations

import time

import pytest
from events import ALL_REDUCE
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from hp_otel import CommDebugMode
from hp_otel.record import events as ev
from hp_otel.spans import schema
from hp_otel.testing import metric_points

pytestmark = pytest.mark.torch_free  # needs no torch: not rerun on torch 2.14.1 (tests/support/markers.py)


def _histogram(reader: InMemoryMetricReader, name: str) -> tuple[int, float, float, float]:
    (point,) = metric_points(reader, name)  # one series: one op, group, phase and module
    return point.count, point.sum, point.min, point.max


def _in_flight(reader: InMemoryMetricReader) -> tuple[list[float], list[tuple[float, dict]]]:
    count = [p.value for p in metric_points(reader, schema.METRIC_IN_FLIGHT)]
    oldest = [(p.value, dict(p.attributes)) for p in metric_points(reader, schema.METRIC_OLDEST_IN_FLIGHT)]
    return count, oldest


@pytest.mark.parametrize("watchdog", [False, True])
def test_launched_collectives_measure_what_their_times_give(watchdog: bool) -> None:
    reader = InMemoryMetricReader()
    mode = CommDebugMode(meter_provider=MeterProvider(metric_readers=[reader]), record_spans=False)
    us = 1_000
    with mode:
        mode._recorder.wants_completion = watchdog  # what the hang watchdog switches on
        obs = mode.observer
        t = time.time_ns() - 400_000 * us  # issued 0.4 s ago
        # waited for: its wait returns at its completion, 50 µs after its issue
        first = obs.on_collective_issue(ALL_REDUCE, t)
        waited = obs.on_collective(ALL_REDUCE, t, t + 10 * us, ticket=first, awaits_completion=True)
        assert type(waited) is (ev.Collective if watchdog else ev.Launch)
        # its Work completed first, stamped late (the GIL): its wait's return ends it, 30 µs after its issue
        second = obs.on_collective_issue(ALL_REDUCE, t + 100 * us)
        late = obs.on_collective(ALL_REDUCE, t + 100 * us, t + 105 * us, ticket=second, awaits_completion=True)
        # never completed: counted with its launch, 20 µs
        third = obs.on_collective_issue(ALL_REDUCE, t + 200 * us)
        never = obs.on_collective(ALL_REDUCE, t + 200 * us, t + 220 * us, ticket=third, awaits_completion=True)
        assert never is not None
        count, oldest = _in_flight(reader)
        assert count == [3]
        ((age, attrs),) = oldest  # the oldest is the first, with its op and group
        assert 0.4 <= age < 5.0 and attrs == {schema.COLLECTIVE_OP: "all_reduce", schema.COLLECTIVE_GROUP: "tp"}

        obs.on_collective_wait(waited, t + 20 * us, t + 50 * us)
        obs.on_collective_complete(waited, t + 50 * us, schema.COMPLETION_WAIT)
        obs.on_collective_complete(waited, t + 90 * us, schema.COMPLETION_WORK)  # a second report: ignored
        obs.on_collective_complete(late, t + 190 * us, schema.COMPLETION_WORK)
        obs.on_collective_wait(late, t + 110 * us, t + 130 * us)
        count, oldest = _in_flight(reader)
        assert count == [1]
        ((age, _),) = oldest  # the third now, 0.2 s younger than the first
        assert 0.2 <= age < 4.8
        since = [p.value for p in metric_points(reader, schema.METRIC_SINCE_COMPLETION)]
        assert len(since) == 1 and 0.2 <= since[0] < 4.9  # the last completion: the second's Work, at t + 190 µs
    count, oldest = _in_flight(reader)
    assert count == [0] and oldest == []  # the third's completion will never be seen: not a hang

    durations_s = [50e-6, 30e-6, 20e-6]
    n, total, low, high = _histogram(reader, schema.METRIC_DURATION)
    assert n == 3 and total == pytest.approx(sum(durations_s)) and (low, high) == pytest.approx((20e-6, 50e-6))
    # nccl-tests: all_reduce's bus bandwidth is bytes / time x 2(n-1)/n (1 for n = 2); the never completed
    # one has no bandwidth (its launch is not its transfer)
    n, total, low, high = _histogram(reader, schema.METRIC_BUSBW)
    assert n == 2 and total == pytest.approx(ALL_REDUCE.bytes / 50e-6 + ALL_REDUCE.bytes / 30e-6)
    assert mode.get_callback_error_counts() == {}
