"""The staleness gauges: collectives in flight, seconds since the last completion, the oldest in flight."""

from __future__ import annotations

import time

import pytest
from events import ALL_REDUCE
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from hp_otel import CommDebugMode
from hp_otel.record.liveness import Liveness
from hp_otel.spans import schema
from hp_otel.testing import metric_points

pytestmark = pytest.mark.torch_free  # needs no torch: not rerun on torch 2.14.1 (tests/support/markers.py)


def _mode(**kwargs: object) -> tuple[CommDebugMode, InMemoryMetricReader]:
    """A window on a provider of its own: the gauges' state is per provider, shared by its windows."""
    reader = InMemoryMetricReader()
    return CommDebugMode(meter_provider=MeterProvider(metric_readers=[reader]), **kwargs), reader  # type: ignore[arg-type]


def _gauges(reader: InMemoryMetricReader) -> dict[str, list]:
    return {
        name: [(p.value, dict(p.attributes)) for p in metric_points(reader, name)]
        for name in (schema.METRIC_IN_FLIGHT, schema.METRIC_SINCE_COMPLETION, schema.METRIC_OLDEST_IN_FLIGHT)
    }


@pytest.mark.parametrize("record_spans", [True, False])  # a sampled step, an unsampled (counts-only) one
def test_in_flight_until_returned_then_fresh(record_spans: bool) -> None:
    mode, reader = _mode(record_spans=record_spans)
    assert _gauges(reader) == {
        schema.METRIC_IN_FLIGHT: [],
        schema.METRIC_SINCE_COMPLETION: [],
        schema.METRIC_OLDEST_IN_FLIGHT: [],
    }
    with mode:
        obs = mode.observer
        start = time.time_ns()
        ticket = obs.on_collective_issue(ALL_REDUCE, start - 300_000_000)  # issued 0.3 s ago, not returned
        assert ticket is not None
        during = _gauges(reader)
        obs.on_collective(ALL_REDUCE, start - 300_000_000, time.time_ns(), ticket=ticket)
        after = _gauges(reader)
    assert during[schema.METRIC_IN_FLIGHT] == [(1, {})]
    ((age, attrs),) = during[schema.METRIC_OLDEST_IN_FLIGHT]
    assert 0.3 <= age < 5.0 and attrs == {schema.COLLECTIVE_OP: "all_reduce", schema.COLLECTIVE_GROUP: "tp"}
    ((since, _),) = during[schema.METRIC_SINCE_COMPLETION]  # none completed yet: since the first issue
    assert 0.3 <= since < 5.0
    assert after[schema.METRIC_IN_FLIGHT] == [(0, {})] and after[schema.METRIC_OLDEST_IN_FLIGHT] == []
    assert after[schema.METRIC_SINCE_COMPLETION][0][0] < 0.3


def test_async_in_flight_until_its_wait_and_forgotten_at_window_end() -> None:
    mode, reader = _mode()
    with mode:
        obs = mode.observer
        now = time.time_ns()
        waited = obs.on_collective(ALL_REDUCE, now, now + 1000, awaits_completion=True)
        obs.on_collective(ALL_REDUCE, now + 2000, now + 3000, awaits_completion=True)  # never waited
        assert _gauges(reader)[schema.METRIC_IN_FLIGHT] == [(2, {})]
        obs.on_collective_complete(waited, now + 5000, schema.COMPLETION_WAIT)
        assert _gauges(reader)[schema.METRIC_IN_FLIGHT] == [(1, {})]
    assert _gauges(reader)[schema.METRIC_IN_FLIGHT] == [(0, {})]  # its completion will never be seen: not a hang


def test_a_fault_in_a_gauge_callback_is_counted_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken():  # type: ignore[no-untyped-def]
        raise RuntimeError("boom")

    mode, reader = _mode()
    monkeypatch.setattr(mode._recorder._liveness, "snapshot", broken)
    with mode:
        mode.observer.on_collective_issue(ALL_REDUCE, time.time_ns())
        assert _gauges(reader)[schema.METRIC_OLDEST_IN_FLIGHT] == []
    assert mode.get_callback_error_counts().get("liveness_oldest", 0) >= 1


def test_in_flight_stays_bounded() -> None:
    liveness = Liveness()
    for i in range(5000):
        liveness.issued(object(), i, "all_reduce", "g")
    assert len(liveness.snapshot()) == 4096
    assert min(liveness.snapshot())[0] == 5000 - 4096  # the oldest were forgotten
