"""`hp_otel.collective.system.name`: the communication library a collective ran on, on its span and its metrics.

OTel's semantic conventions have no attribute for it (no collective-communication conventions
exist; `db.system.name` / `rpc.system.name` are the pattern, with well-known lowercase values),
so it is ours, named as torch and MindSpore call it: the referee is the backend the test itself
gave `init_process_group` (torch's fake process group here; gloo in test_dashboard_live.py).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from hp_otel import CommDebugMode
from hp_otel.spans import schema


def test_collective_spans_and_metrics_name_the_backend(fake_world) -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    try:
        with CommDebugMode(meter_provider=provider) as mode:
            funcol.wait_tensor(funcol.all_reduce(torch.ones(4), "sum", dist.group.WORLD))
            dist.all_reduce(torch.ones(4))  # the c10d path as well
        spans = [
            sp for sp in mode.get_finished_spans() if sp.attributes.get(schema.CALL_KIND) == schema.KIND_COLLECTIVE
        ]
        assert len(spans) == 2
        assert {sp.attributes.get(schema.COLLECTIVE_BACKEND) for sp in spans} == {"fake"}  # init_process_group("fake")
        data = reader.get_metrics_data()
        points = [
            point
            for rm in data.resource_metrics
            for sm in rm.scope_metrics
            for metric in sm.metrics
            if metric.name == schema.METRIC_CALLS
            for point in metric.data.data_points
        ]
        assert points and {p.attributes.get(schema.COLLECTIVE_BACKEND) for p in points} == {"fake"}
    finally:
        provider.shutdown()


def test_a_counts_only_window_names_it_too(fake_world) -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    try:
        with CommDebugMode(record_spans=False, meter_provider=provider):
            funcol.wait_tensor(funcol.all_reduce(torch.ones(4), "sum", dist.group.WORLD))
        (point,) = [
            p
            for rm in reader.get_metrics_data().resource_metrics
            for sm in rm.scope_metrics
            for m in sm.metrics
            if m.name == schema.METRIC_CALLS
            for p in m.data.data_points
        ]
        assert point.attributes[schema.COLLECTIVE_BACKEND] == "fake"
    finally:
        provider.shutdown()
