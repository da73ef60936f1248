"""OpenTelemetry plumbing: the zero-configuration providers and hp_otel's instruments.

CommDebugMode works with no configuration: it then uses one process-wide SDK
TracerProvider (no processors: the mode hands spans to its own local store) and one
SDK MeterProvider read by an InMemoryMetricReader.  Both are made on first use, so
importing hp_otel costs nothing.  A caller's providers replace them.
"""

from __future__ import annotations

import os
import socket
import threading
from dataclasses import dataclass
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.metrics import Counter, Histogram, Meter, MeterProvider
from opentelemetry.sdk.metrics import MeterProvider as SdkMeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
from opentelemetry.trace import Tracer, TracerProvider

from hp_otel import schema as s
from hp_otel.version import __version__

_lock = threading.Lock()
_default_tracer_provider: SdkTracerProvider | None = None
_default_meter_provider: SdkMeterProvider | None = None
_default_metric_reader: InMemoryMetricReader | None = None


def _int_env(*names: str) -> int | None:
    for name in names:
        value = os.environ.get(name)
        if value is not None and value.strip().lstrip("-").isdigit():
            return int(value)
    return None


def build_resource(extra: dict[str, Any] | None = None) -> Resource:
    """Resource with host, pid and the rank layout that torchrun/msrun put in the environment.

    `Resource.create` also applies OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES.
    """
    attrs: dict[str, Any] = {"host.name": socket.gethostname(), "process.pid": os.getpid()}
    for key, names in (
        (s.RESOURCE_RANK, ("RANK", "RANK_ID")),
        (s.RESOURCE_LOCAL_RANK, ("LOCAL_RANK", "DEVICE_ID")),
        (s.RESOURCE_WORLD_SIZE, ("WORLD_SIZE", "RANK_SIZE")),
    ):
        value = _int_env(*names)
        if value is not None:
            attrs[key] = value
    run_id = os.environ.get("HP_OTEL_RUN_ID") or os.environ.get("TORCHELASTIC_RUN_ID")
    if run_id:
        attrs[s.RESOURCE_RUN_ID] = run_id
    if extra:
        attrs.update(extra)
    if not os.environ.get("OTEL_SERVICE_NAME"):
        attrs.setdefault("service.name", "hp_otel")
    return Resource.create(attrs)


def default_tracer_provider() -> SdkTracerProvider:
    global _default_tracer_provider
    with _lock:
        if _default_tracer_provider is None:
            _default_tracer_provider = SdkTracerProvider(resource=build_resource())
        return _default_tracer_provider


def default_meter_provider() -> tuple[SdkMeterProvider, InMemoryMetricReader]:
    global _default_meter_provider, _default_metric_reader
    with _lock:
        if _default_meter_provider is None:
            _default_metric_reader = InMemoryMetricReader()
            _default_meter_provider = SdkMeterProvider(
                metric_readers=[_default_metric_reader], resource=build_resource()
            )
        assert _default_metric_reader is not None
        return _default_meter_provider, _default_metric_reader


def get_tracer(tracer_provider: TracerProvider | None) -> Tracer:
    return trace.get_tracer(s.INSTRUMENTATION_NAME, __version__, tracer_provider)


@dataclass(frozen=True)
class Instruments:
    """hp_otel's metric instruments on one meter."""

    calls: Counter
    bytes: Counter
    duration: Histogram
    callback_errors: Counter

    @classmethod
    def create(cls, meter: Meter) -> Instruments:
        return cls(
            calls=meter.create_counter(
                s.METRIC_CALLS, unit=s.METRIC_CALLS_UNIT, description="Collective calls issued."
            ),
            bytes=meter.create_counter(
                s.METRIC_BYTES, unit=s.METRIC_BYTES_UNIT, description="Bytes handed to collectives (input size)."
            ),
            duration=meter.create_histogram(
                s.METRIC_DURATION,
                unit=s.METRIC_DURATION_UNIT,
                description="Wall time of the collective call (launch time for async collectives).",
                explicit_bucket_boundaries_advisory=list(s.DURATION_BUCKETS_S),
            ),
            callback_errors=meter.create_counter(
                s.METRIC_CALLBACK_ERRORS,
                unit=s.METRIC_CALLBACK_ERRORS_UNIT,
                description="Faults inside hp_otel's own callbacks, isolated from the traced code.",
            ),
        )


_instruments: dict[int, tuple[MeterProvider | None, Instruments]] = {}


def get_instruments(meter_provider: MeterProvider | None) -> Instruments:
    """Instruments for a provider, made once per provider (creating them is not free)."""
    key = id(meter_provider)
    with _lock:
        cached = _instruments.get(key)
        if cached is not None and cached[0] is meter_provider:
            return cached[1]
        meter = metrics.get_meter(s.INSTRUMENTATION_NAME, __version__, meter_provider)
        instruments = Instruments.create(meter)
        _instruments[key] = (meter_provider, instruments)
        return instruments
