"""Failed collectives per OTel's conventions: `error.type` on the span and on the collective metrics."""

from __future__ import annotations

import time

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from benchmarks.scale import _ALL_REDUCE
from hp_otel import CommDebugMode
from hp_otel.spans import schema
from hp_otel.testing import metric_points


class CollectiveTimeout(RuntimeError):
    pass


def _providers():
    exporter, reader = InMemorySpanExporter(), InMemoryMetricReader()
    tracer_provider = TracerProvider(shutdown_on_exit=False)
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    return tracer_provider, MeterProvider(metric_readers=[reader], shutdown_on_exit=False), exporter, reader


def test_a_failed_collective_has_error_type_on_its_span_and_metrics_and_a_good_one_has_none() -> None:
    tracer_provider, meter_provider, exporter, reader = _providers()
    with CommDebugMode(tracer_provider=tracer_provider, meter_provider=meter_provider) as mode:
        now = time.time_ns()
        mode.observer.on_collective(_ALL_REDUCE, now, now + 1000)
        mode.observer.on_collective(_ALL_REDUCE, now + 2000, now + 5000, error=CollectiveTimeout("peer gone"))
    spans = [sp for sp in exporter.get_finished_spans() if sp.attributes.get(schema.CALL_KIND) == "collective"]
    ok, failed = sorted(spans, key=lambda sp: sp.start_time)
    assert schema.ERROR_TYPE not in ok.attributes and ok.status.status_code is StatusCode.UNSET
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.attributes[schema.ERROR_TYPE] == f"{__name__}.CollectiveTimeout"  # fully qualified class
    for metric in (schema.METRIC_DURATION, schema.METRIC_CALLS):
        points = metric_points(reader, metric)
        by_error = {p.attributes.get(schema.ERROR_TYPE): p for p in points}
        assert set(by_error) == {None, f"{__name__}.CollectiveTimeout"}, metric
        assert all(p.attributes[schema.COLLECTIVE_OP] == "all_reduce" for p in points)


def test_a_builtin_exception_is_named_without_a_module() -> None:
    from hp_otel.spans.codec import error_type

    assert error_type(TimeoutError()) == "TimeoutError"
    assert error_type(CollectiveTimeout()) == f"{__name__}.CollectiveTimeout"


def test_duration_points_carry_exemplars_of_the_sampled_step_trace() -> None:
    """The SDK's trace-based exemplar filter links each duration to the step's trace (what a backend shows)."""
    import hp_otel

    tracer_provider, meter_provider, _, reader = _providers()
    with hp_otel.step(1, run_id="exemplars", rank=0, tracer_provider=tracer_provider) as spans:
        with CommDebugMode(tracer_provider=tracer_provider, meter_provider=meter_provider) as mode:
            now = time.time_ns()
            mode.observer.on_collective(_ALL_REDUCE, now, now + 1000)
    (point,) = metric_points(reader, schema.METRIC_DURATION)
    assert point.exemplars, "no exemplar on the duration histogram"
    assert {e.trace_id for e in point.exemplars} == {spans.trace_id}


def test_deferred_windows_of_the_instrumentor_carry_exemplars_of_their_step(tp_mlp) -> None:
    """Always-on windows record durations at their end: in the step's context, so exemplars still link to it."""
    import hp_otel
    from hp_otel.always_on.instrumentor import HpOtelInstrumentor
    from hp_otel.workloads.tp_mlp import train_step

    model, x = tp_mlp
    tracer_provider, meter_provider, _, reader = _providers()
    instrumentor = HpOtelInstrumentor()
    instrumentor.instrument(tracer_provider=tracer_provider, meter_provider=meter_provider)
    try:
        with hp_otel.step(5, run_id="exemplars", module=model) as spans:
            train_step(model, x)
    finally:
        instrumentor.uninstrument()
    points = metric_points(reader, schema.METRIC_DURATION)
    assert points and all(point.exemplars for point in points)
    assert {e.trace_id for point in points for e in point.exemplars} == {spans.trace_id}
