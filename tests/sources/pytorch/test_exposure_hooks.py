"""The waits behind the exposed-communication figures, in one process over the fake process group:
wait_tensor is timed, Work.wait() is patched only while a window records and restored exactly,
the figures reach the span attributes, the metrics and the plot."""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from hp_otel import CommDebugMode
from hp_otel.render.timeline import exposure_html, render_svg
from hp_otel.spans import schema
from hp_otel.testing import metric_points

# These tests time the waits around a collective, not a network: the fake group stands in for a real one.
pytestmark = pytest.mark.usefixtures("fake_group_timed")


def _busy(seconds: float) -> None:
    a = torch.randn(64, 64)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        a = torch.tanh(a @ a)


def test_functional_wait_is_timed_and_the_compute_before_it_overlaps(fake_world) -> None:
    reader = InMemoryMetricReader()
    group = dist.group.WORLD.group_name
    torch.ops._c10d_functional.wait_tensor(torch.ops._c10d_functional.all_reduce(torch.ones(8), "sum", group))
    with CommDebugMode(meter_provider=MeterProvider(metric_readers=[reader])) as mode:
        t0 = time.time_ns()
        out = torch.ops._c10d_functional.all_reduce(torch.ones(8), "sum", group)
        _busy(0.03)
        t1 = time.time_ns()
        torch.ops._c10d_functional.wait_tensor(out)
        t2 = time.time_ns()
    (span,) = [x for x in mode.get_finished_spans() if x.attributes[schema.CALL_KIND] == schema.KIND_COLLECTIVE]
    attrs = span.attributes
    assert attrs[schema.COLLECTIVE_ASYNC] and attrs[schema.COLLECTIVE_COMPLETION] == schema.COMPLETION_WAIT
    call_ns, waited_ns = (
        round(attrs[k] * 1e9) for k in (schema.COLLECTIVE_CALL_DURATION, schema.COLLECTIVE_WAIT_DURATION)
    )
    assert 0 <= waited_ns <= t2 - t1 and 0 < call_ns < t1 - t0  # in seconds on the span
    total = mode.get_comm_exposure().total
    # referee: in flight from issue to the wait's return, exposed = the call and the wait only
    assert t1 - t0 - 5_000_000 <= total.comm_ns <= t2 - t0  # its issue is stamped a little after t0
    assert total.exposed_ns == call_ns + waited_ns
    assert total.overlapped_ns >= 0.025e9 and total.overlap_fraction > 0.5
    points = {p.attributes[schema.COLLECTIVE_STATE]: p for p in metric_points(reader, schema.METRIC_COMM_TIME)}
    exposed, overlapped = points[schema.STATE_EXPOSED], points[schema.STATE_OVERLAPPED]
    assert exposed.value == total.exposed_ns / 1e9 and overlapped.value == total.overlapped_ns / 1e9
    assert exposed.value + overlapped.value == pytest.approx(total.comm_ns / 1e9)
    assert dict(exposed.attributes) == {
        schema.PHASE: schema.PHASE_FORWARD,
        schema.MODULE_FQN: "",
        schema.COLLECTIVE_STATE: schema.STATE_EXPOSED,
    }
    svg = render_svg({0: mode.get_finished_spans()})
    assert 'class="exposure" data-rank="0"' in svg and f'data-exposed-ns="{total.exposed_ns}"' in svg
    assert "Communication exposed" in exposure_html({0: mode.get_finished_spans()})


def test_work_wait_is_patched_only_while_a_window_records_spans(fake_world) -> None:
    saved = dist.Work.__dict__["wait"]
    with CommDebugMode():
        assert dist.Work.__dict__["wait"] is not saved
        dist.all_reduce(torch.ones(4))  # the wrapper's Python wait goes through the patch
    assert dist.Work.__dict__["wait"] is saved
    with CommDebugMode(record_spans=False):  # a counts-only window times no waits
        assert dist.Work.__dict__["wait"] is saved
    assert dist.Work.__dict__["wait"] is saved
