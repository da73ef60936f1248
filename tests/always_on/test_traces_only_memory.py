"""Always-on with traces only (a meter provider with no reader, `OTEL_METRICS_EXPORTER=none`):
nothing collects the duration histogram, so the durations wait; what waits is bounded and holds
no step's span (before: each sampled step's span, 5,904 of them after 6,000 steps)."""

from __future__ import annotations

import gc

import torch
import torch.distributed as dist
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider

import hp_otel
from hp_otel.always_on.instrumentor import HpOtelInstrumentor
from hp_otel.record.instruments import get_instruments

STEPS = 600


def _spans_alive() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if isinstance(o, ReadableSpan))


def test_traces_only_steps_keep_no_span_and_a_bounded_backlog(fake_world) -> None:
    tracer_provider, meter_provider = TracerProvider(), MeterProvider(metric_readers=[])
    model = torch.nn.Linear(4, 4)
    before = _spans_alive()
    instrumentor = HpOtelInstrumentor()
    instrumentor.instrument(tracer_provider=tracer_provider, meter_provider=meter_provider)
    waiting = get_instruments(meter_provider).durations
    most = 0
    try:
        for step in range(STEPS):
            with hp_otel.step(step, module=model) as spans:
                model(torch.ones(1, 4))
                dist.all_reduce(torch.ones(4))
            assert spans.sampled
            most = max(most, len(waiting._labels))
        alive = _spans_alive() - before
    finally:
        instrumentor.uninstrument()
    assert alive <= 1, f"{alive} spans of {STEPS} sampled steps kept alive"  # (the last step's window's)
    assert 0 < most <= 256  # (attributes, step) pairs waiting at most
