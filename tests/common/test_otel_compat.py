"""`_otel_compat`, the one place hp_otel reaches the OpenTelemetry SDK's private members:
every entry exists on the installed SDK (an upgrade that drops one fails here, by name),
the accessors read the real values, and each has a working fallback."""

from __future__ import annotations

import importlib
import logging

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.metrics.export import ConsoleMetricExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from hp_otel.common import _otel_compat
from hp_otel.common._otel_compat import MEMBERS

pytestmark = pytest.mark.torch_free  # needs no torch: not rerun on torch 2.14.1 (tests/support/markers.py)


def _owner(spec: str):
    module, _, name = spec.partition(":")
    value = importlib.import_module(module)
    return getattr(value, name) if name else value


def _sample(name: str):
    """An object that must have the member (class members are checked on the class)."""
    if name == "span_attribute_dict":
        tracer = TracerProvider().get_tracer("t")
        with tracer.start_as_current_span("s", attributes={"k": 1}) as span:
            return span
    if name == "bounded_attributes_dict":
        from opentelemetry.attributes import BoundedAttributes

        return BoundedAttributes(attributes={"k": 1})
    if name in ("instrumentation_scope", "span_limits", "tracer_enabled"):
        return TracerProvider().get_tracer("t")
    if name in ("preferred_temporality", "preferred_aggregation"):
        return ConsoleMetricExporter()
    if name == "exporter_endpoint":
        return OTLPSpanExporter(endpoint="http://collector:4318/v1/traces")
    return None


@pytest.mark.parametrize("name", sorted(MEMBERS))
def test_every_private_member_exists_on_this_sdk(name: str) -> None:
    member = MEMBERS[name]
    owner = _owner(member.owner)
    if member.member:
        target = _sample(name)
        assert hasattr(owner if target is None else target, member.member), f"{member.owner}.{member.member}"
    assert member.purpose and member.fallback


@pytest.mark.parametrize("module", _otel_compat.PRIVATE_LOGGER_MODULES)
def test_the_private_logger_modules_exist_and_log_under_their_name(module: str) -> None:
    """Where the module logs, it logs under its own name; on the lowest releases pyproject.toml accepts
    (OTel 1.42) the OTLP/HTTP exporter's `_common` package exists and logs nothing (its retries are
    logged by the trace and metric exporters' modules, listed in NOISY_LOGGERS)."""
    imported = importlib.import_module(module)
    logger = getattr(imported, "_logger", getattr(imported, "logger", None))
    if logger is None:
        assert module == "opentelemetry.exporter.otlp.proto.http._common", f"{module} logs under no logger"
        from hp_otel.export import log_limits

        assert "opentelemetry.exporter.otlp.proto.http.trace_exporter" in log_limits.NOISY_LOGGERS
    else:
        assert logger.name == module


def test_the_accessors_read_the_sdk_values(monkeypatch) -> None:
    span = _sample("span_attribute_dict")
    assert _otel_compat.span_attribute_dict(span) == {"k": 1}
    assert _otel_compat.span_attribute_dict(span) is span._attributes._dict  # no copy
    tracer = _sample("instrumentation_scope")
    assert _otel_compat.instrumentation_scope(tracer).name == "t"
    assert _otel_compat.span_limits(tracer) is tracer._span_limits
    assert _otel_compat.tracer_enabled(tracer) is True
    assert _otel_compat.span_limits(object()) is None and _otel_compat.tracer_enabled(object()) is True
    exporter = ConsoleMetricExporter()
    assert _otel_compat.preferred_temporality(exporter) is exporter._preferred_temporality
    assert _otel_compat.preferred_aggregation(exporter) is exporter._preferred_aggregation
    assert _otel_compat.exporter_endpoint(_sample("exporter_endpoint")) == "http://collector:4318/v1/traces"
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "77")
    monkeypatch.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "11")
    assert (_otel_compat.default_max_queue_size(), _otel_compat.default_max_export_batch_size()) == (77, 11)
    from opentelemetry.metrics._internal import _ProxyMeterProvider

    assert _otel_compat.proxy_meter_provider_class() is _ProxyMeterProvider


def test_fallbacks_without_the_private_members(monkeypatch) -> None:
    class Bare:
        """An object with none of the SDK's private members."""

    assert _otel_compat.span_attribute_dict(Bare()) is None
    assert _otel_compat.instrumentation_scope(Bare()) is None
    assert _otel_compat.preferred_temporality(Bare()) is None
    assert _otel_compat.preferred_aggregation(Bare()) is None
    assert _otel_compat.exporter_endpoint(Bare()) is None
    monkeypatch.delattr(BatchSpanProcessor, "_default_max_queue_size")
    monkeypatch.delattr(BatchSpanProcessor, "_default_max_export_batch_size")
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "33")
    monkeypatch.delenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", raising=False)
    assert (_otel_compat.default_max_queue_size(), _otel_compat.default_max_export_batch_size()) == (33, 512)
    import sys

    monkeypatch.setitem(sys.modules, "opentelemetry.metrics._internal", None)  # as if the SDK moved it
    fallback = _otel_compat.proxy_meter_provider_class()
    assert not isinstance(object(), fallback)


def test_a_span_read_back_from_a_file_keeps_a_plain_dict() -> None:
    from opentelemetry.sdk.trace import ReadableSpan

    span = ReadableSpan(name="s", attributes={"k": 3})
    assert _otel_compat.span_attribute_dict(span) == {"k": 3}


def test_log_limits_still_cover_the_private_loggers() -> None:
    from hp_otel.export import log_limits

    assert set(_otel_compat.PRIVATE_LOGGER_MODULES) <= set(log_limits.NOISY_LOGGERS)
    flt = log_limits.limit_sdk_logs()
    try:
        for module in _otel_compat.PRIVATE_LOGGER_MODULES:
            assert flt in logging.getLogger(module).filters
    finally:
        log_limits.unlimit_sdk_logs()


def test_span_contexts_made_and_read_as_tuples_equal_the_sdks() -> None:
    from opentelemetry.trace import SpanContext, TraceFlags
    from opentelemetry.trace.span import TraceState

    assert _otel_compat.SPAN_CONTEXT_IS_TUPLE  # on this SDK: the fast path is the one tested everywhere
    state = TraceState([("vendor", "x")])
    for args in (
        (7, 9, False, TraceFlags(1), state),
        (0, 9, True, TraceFlags(0), state),
        (7, 2**64, False, TraceFlags(3), state),
    ):
        made, sdk = _otel_compat.new_span_context(*args), SpanContext(*args)
        assert type(made) is SpanContext and made == sdk and made.is_valid == sdk.is_valid  # invalid ids too
        assert _otel_compat.span_context_fields(sdk) == args


def test_a_readable_span_is_its_fields() -> None:
    """The store gives a span read back the fields __init__ sets, by name, without calling it."""
    from opentelemetry.sdk.trace import ReadableSpan

    assert _otel_compat.READABLE_SPAN_IS_ITS_FIELDS
    span = ReadableSpan("s", attributes={"k": 1}, start_time=3)
    assert set(vars(span)) == set(_otel_compat.READABLE_SPAN_FIELDS.values())
    assert span._start_time == 3 and span._name == "s"
