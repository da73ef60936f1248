"""Telemetry volume per rank, bounded (issue 30 item 4): with the always-on instrumentor's defaults on
the llama step over 4 gloo ranks, a rank's Prometheus series do not grow with the model's depth, an
unsampled step sends no span byte, and a metrics export stays the same size step after step.

The receiver (`telemetry.OtlpReceiver`) counts the bytes of the real OTLP/HTTP requests; the
series are counted on the rank's real `/metrics` page."""

from __future__ import annotations

import pytest

from benchmarks.telemetry import format_telemetry_bench, run_telemetry_bench

pytestmark = pytest.mark.multiprocess


def test_a_ranks_series_and_bytes_are_bounded_whatever_the_depth() -> None:
    shallow, deep = run_telemetry_bench(layers=(2, 8), steps=6, ratio=0.5)
    print("\n" + "\n".join(format_telemetry_bench([shallow, deep])))
    for ranks in (shallow, deep):
        assert len({(v.prometheus_series, v.hp_otel_series) for v in ranks}) == 1  # every rank alike
        rank = ranks[0]
        assert rank.sampled() and rank.unsampled()  # the ratio kept some steps and dropped others
        for step in rank.unsampled():
            assert step.span_bytes == 0 and step.span_requests == 0, step
        for step in rank.sampled():
            assert step.span_bytes > 10_000 and step.span_requests >= 1, step
        exports = [s.metric_bytes for s in rank.steps]
        assert min(exports) > 0 and max(exports) < 1.2 * min(exports), exports  # the same series each time
    # depth adds spans to a sampled step, not series to the metrics
    assert deep[0].series_by_metric == shallow[0].series_by_metric
    assert deep[0].prometheus_series == shallow[0].prometheus_series
    assert min(s.span_bytes for s in deep[0].sampled()) > 2 * max(s.span_bytes for s in shallow[0].sampled())
    assert max(s.metric_bytes for s in deep[0].steps) < 1.2 * min(s.metric_bytes for s in shallow[0].steps)
