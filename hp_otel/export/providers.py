"""The zero-configuration OpenTelemetry providers, the resource, and hp_otel's tracer.

CommDebugMode works with no configuration: it then uses one process-wide SDK
TracerProvider (no processors: the mode hands spans to its own local store) and one
SDK MeterProvider read by an InMemoryMetricReader.  Both are made on first use, so
importing hp_otel costs nothing.  A caller's providers replace them.
"""

from __future__ import annotations

import threading
from typing import Any

from opentelemetry import trace
from opentelemetry.metrics import MeterProvider
from opentelemetry.sdk.metrics import MeterProvider as SdkMeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.resources import OTELResourceDetector, Resource
from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
from opentelemetry.trace import Tracer, TracerProvider

from hp_otel.common.per_provider import PerProvider
from hp_otel.export.resource_detector import (
    SERVICE_INSTANCE_ID,
    SERVICE_NAME,
    RankResourceDetector,
    service_instance_id,
)
from hp_otel.spans import schema
from hp_otel.version import __version__

_lock = threading.Lock()
_default_tracer_provider: SdkTracerProvider | None = None
_default_meter_provider: SdkMeterProvider | None = None
_default_metric_reader: InMemoryMetricReader | None = None


def build_resource(extra: dict[str, Any] | None = None) -> Resource:
    """Rank identity (the `hp_otel` resource detector) under the SDK's own resource.

    `Resource.create` adds the SDK's attributes, the detectors named in
    OTEL_EXPERIMENTAL_RESOURCE_DETECTORS, OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME,
    which win over what was detected; `extra` (configure()'s arguments) wins over all.
    The service is `hp_otel` unless one of them names it.
    """
    resource = RankResourceDetector().detect().merge(Resource.create())
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: "hp_otel"}))
    resource = resource.merge(Resource(dict(extra or {})))
    # service.instance.id: stable per run and rank, over the SDK's random UUID (Resource.create() puts
    # it last), unless the user names one (OTEL_RESOURCE_ATTRIBUTES, configure()'s resource attributes).
    attrs = resource.attributes
    instance = service_instance_id(attrs.get(schema.RESOURCE_RUN_ID), attrs.get(schema.RESOURCE_RANK))
    named = SERVICE_INSTANCE_ID in OTELResourceDetector().detect().attributes or SERVICE_INSTANCE_ID in (extra or {})
    if instance is not None and not named:
        resource = resource.merge(Resource({SERVICE_INSTANCE_ID: instance}))
    return resource


# Providers installed by `hp_otel.configure()` (export.py); they replace the in-memory defaults.
_configured_tracer_provider: TracerProvider | None = None
_configured_meter_provider: MeterProvider | None = None


def set_default_providers(tracer_provider: TracerProvider | None, meter_provider: MeterProvider | None) -> None:
    """Make these the providers CommDebugMode uses when given none (None: back to the in-memory defaults)."""
    global _configured_tracer_provider, _configured_meter_provider
    with _lock:
        _configured_tracer_provider, _configured_meter_provider = tracer_provider, meter_provider


def is_internal_tracer_provider(provider: Any) -> bool:
    """True for hp_otel's processor-less default provider (its spans go nowhere but the local store)."""
    return provider is not None and provider is _default_tracer_provider


def default_tracer_provider() -> TracerProvider:
    global _default_tracer_provider
    if _configured_tracer_provider is not None:
        return _configured_tracer_provider
    with _lock:
        if _default_tracer_provider is None:
            _default_tracer_provider = SdkTracerProvider(resource=build_resource())
        return _default_tracer_provider


def default_meter_provider() -> tuple[MeterProvider, InMemoryMetricReader | None]:
    global _default_meter_provider, _default_metric_reader
    if _configured_meter_provider is not None:
        return _configured_meter_provider, None
    with _lock:
        if _default_meter_provider is None:
            _default_metric_reader = InMemoryMetricReader()
            _default_meter_provider = SdkMeterProvider(
                metric_readers=[_default_metric_reader], resource=build_resource()
            )
        assert _default_metric_reader is not None
        return _default_meter_provider, _default_metric_reader


_tracers: PerProvider[Tracer] = PerProvider()


def get_tracer(tracer_provider: TracerProvider | None) -> Tracer:
    """hp_otel's tracer on a provider, made once per provider."""
    return _tracers.get(
        tracer_provider,
        lambda: trace.get_tracer(
            schema.INSTRUMENTATION_NAME, __version__, tracer_provider, schema_url=schema.SCHEMA_URL
        ),
    )
