"""A collective's place is decided once and read by everything: its span, its module counts and its
metric labels follow one `Attribution`, and its bandwidth is computed once for the span and the metric."""

from __future__ import annotations

import time

import pytest
from events import ALL_REDUCE
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from hp_otel import CommDebugMode
from hp_otel.record import attribution, collective_metrics
from hp_otel.spans import schema
from hp_otel.spans.bandwidth import bandwidth
from hp_otel.spans.infos import ModuleInfo

pytestmark = pytest.mark.torch_free  # needs no torch: not rerun on torch 2.14.1 (tests/support/markers.py)

SENTINEL = attribution.Attribution(
    phase="sentinel-phase",
    fqn="sentinel.module",
    owners=("sentinel.owner", "sentinel.module"),
    issued_by="sentinel.issuer",
    chain=None,
    opened=(),
    under=None,
)


def _metrics(reader: InMemoryMetricReader) -> dict:
    data = reader.get_metrics_data()
    return {m.name: m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}


def _run(mode: CommDebugMode, with_issue: bool, duration_ns: int = 1000) -> None:
    observer = mode.observer
    observer.on_module_enter(ModuleInfo("(root)", "MLP", "MLP"), schema.PHASE_FORWARD)  # what the sentinel overrides
    start = time.time_ns()
    ticket = observer.on_collective_issue(ALL_REDUCE, start, schema.PHASE_FORWARD) if with_issue else None
    observer.on_collective(ALL_REDUCE, start, start + duration_ns, None, schema.PHASE_FORWARD, ticket)


@pytest.mark.parametrize(
    ("record_spans", "with_issue"),
    [(True, True), (True, False), (False, True), (False, False)],
    ids=["spans-issued", "spans-no-issue", "counts-issued", "counts-no-issue"],
)
def test_span_counts_and_metric_labels_follow_one_attribution(monkeypatch, record_spans, with_issue) -> None:
    asked: list[str | None] = []

    def decided_once(self: attribution.Attributor, hint: str | None) -> attribution.Attribution:
        asked.append(hint)
        return SENTINEL

    monkeypatch.setattr(attribution.Attributor, "attribute", decided_once)
    reader = InMemoryMetricReader()
    with CommDebugMode(meter_provider=MeterProvider(metric_readers=[reader]), record_spans=record_spans) as mode:
        _run(mode, with_issue)
    assert asked == [schema.PHASE_FORWARD]  # one decision for the collective, whichever path reported it
    assert mode.get_comm_module_counts() == {
        "sentinel.owner": {"sentinel-phase": {ALL_REDUCE.name: 1}},
        "sentinel.module": {"sentinel-phase": {ALL_REDUCE.name: 1}},
    }
    (point,) = _metrics(reader)[schema.METRIC_CALLS].data.data_points
    labels = (point.attributes[schema.PHASE], point.attributes[schema.MODULE_FQN])
    assert labels == ("sentinel-phase", "sentinel.module")
    if record_spans:
        (span,) = [s for s in mode.get_finished_spans() if s.attributes[schema.CALL_KIND] == schema.KIND_COLLECTIVE]
        assert span.attributes[schema.PHASE] == "sentinel-phase"
        assert span.attributes[schema.COLLECTIVE_MODULE] == "sentinel.module"
        assert span.attributes[schema.COLLECTIVE_ISSUED_BY] == "sentinel.issuer"


@pytest.mark.parametrize("with_issue", [True, False])
def test_bandwidth_is_computed_once_and_the_span_and_histogram_share_it(monkeypatch, with_issue) -> None:
    calls: list[tuple] = []

    def counted(*args):
        calls.append(args)
        return bandwidth(*args)

    monkeypatch.setattr(collective_metrics, "bandwidth", counted)
    reader = InMemoryMetricReader()
    with CommDebugMode(meter_provider=MeterProvider(metric_readers=[reader])) as mode:
        _run(mode, with_issue, duration_ns=2000)
    (span,) = [s for s in mode.get_finished_spans() if s.attributes[schema.CALL_KIND] == schema.KIND_COLLECTIVE]
    expected = bandwidth(ALL_REDUCE.op, ALL_REDUCE.bytes, ALL_REDUCE.group_size, 2000)
    assert expected is not None and len(calls) == 1
    assert span.attributes[schema.COLLECTIVE_BUSBW] == expected.busbw
    (point,) = _metrics(reader)[schema.METRIC_BUSBW].data.data_points
    assert point.count == 1 and point.sum == expected.busbw
