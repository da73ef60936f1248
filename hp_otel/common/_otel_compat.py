"""The OpenTelemetry SDK's private members, in one place: every `._x` of an OTel object and
every private OTel module hp_otel relies on is named here and nowhere else.

Why: the SDK may rename any of them in a minor release.  `MEMBERS` lists each one (owner,
what hp_otel uses it for, what happens without it) and the repository's test suite
(not shipped) probes every entry on the installed SDK, so an upgrade that drops one fails there by name.
Every accessor has a fallback that keeps hp_otel working (slower, or with less detail);
none raises.  Checked on opentelemetry-sdk 1.45.

Lowest layer (spans/, record/ and export/ import it); it imports OpenTelemetry only.
"""

from __future__ import annotations

import operator
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from opentelemetry.trace import SpanContext, TraceFlags
from opentelemetry.trace.span import TraceState


@dataclass(frozen=True)
class Member:
    """One private SDK member: where it lives, what hp_otel uses it for, what happens without it."""

    owner: str  # "module:Class" (or "module" for a private module)
    member: str  # the private attribute ("" for a module)
    purpose: str
    fallback: str


MEMBERS: Mapping[str, Member] = MappingProxyType(
    {
        "span_attribute_dict": Member(
            "opentelemetry.sdk.trace:ReadableSpan",
            "_attributes",
            "a span's attributes as the SDK's own dict (BoundedAttributes._dict), "
            "without a new mapping proxy per read: "
            "reading 100 000 spans through `span.attributes` costs more than rendering them",
            "`span.attributes` (correct, slower)",
        ),
        "bounded_attributes_dict": Member(
            "opentelemetry.attributes:BoundedAttributes",
            "_dict",
            "as span_attribute_dict",
            "as span_attribute_dict",
        ),
        "instrumentation_scope": Member(
            "opentelemetry.sdk.trace:Tracer",
            "_instrumentation_scope",
            "the watchdog's in-flight spans carry the tracer's instrumentation scope, as the spans it ends do",
            "those spans have no instrumentation scope",
        ),
        "span_limits": Member(
            "opentelemetry.sdk.trace:Tracer",
            "_span_limits",
            "a deferred window's spans (record/readable_spans.py) are bounded by the provider's span limits, as the "
            "SDK bounds the spans it starts",
            "the limits the environment sets (SpanLimits())",
        ),
        "tracer_enabled": Member(
            "opentelemetry.sdk.trace:Tracer",
            "_is_enabled",
            "a tracer the provider's tracer configurator disabled makes no spans: neither does a deferred window's",
            "every tracer is taken as enabled",
        ),
        "default_max_queue_size": Member(
            "opentelemetry.sdk.trace.export:BatchSpanProcessor",
            "_default_max_queue_size",
            "the batch processor's queue size as the SDK reads it (OTEL_BSP_MAX_QUEUE_SIZE): "
            "drops are counted against it",
            "OTEL_BSP_MAX_QUEUE_SIZE, else 2048 (the SDK's default)",
        ),
        "default_max_export_batch_size": Member(
            "opentelemetry.sdk.trace.export:BatchSpanProcessor",
            "_default_max_export_batch_size",
            "the export batch is capped at the queue size the SDK would use (OTEL_BSP_MAX_EXPORT_BATCH_SIZE)",
            "OTEL_BSP_MAX_EXPORT_BATCH_SIZE, else 512 (the SDK's default)",
        ),
        "preferred_temporality": Member(
            "opentelemetry.sdk.metrics.export:MetricExporter",
            "_preferred_temporality",
            "the fork-silenced wrapper exports with the wrapped exporter's temporality",
            "the SDK's default (cumulative)",
        ),
        "preferred_aggregation": Member(
            "opentelemetry.sdk.metrics.export:MetricExporter",
            "_preferred_aggregation",
            "the fork-silenced wrapper exports with the wrapped exporter's aggregation",
            "the SDK's default aggregation",
        ),
        "exporter_endpoint": Member(
            "opentelemetry.exporter.otlp.proto.http.trace_exporter:OTLPSpanExporter",
            "_endpoint",
            "messages name where spans go, as the exporter resolved it from arguments and variables",
            "messages name no endpoint",
        ),
        "span_context_tuple": Member(
            "opentelemetry.trace:SpanContext",
            "",
            "a span context made and read as the tuple it is, (trace_id, span_id, is_remote, trace_flags, "
            "trace_state, is_valid) (its declared base), without its Python-level __new__ and properties: the "
            "local store makes and reads two a span (docs/how-it-works/costs.md)",
            "SpanContext(...) and its properties (correct, slower), where the layout differs",
        ),
        "readable_span_fields": Member(
            "opentelemetry.sdk.trace:ReadableSpan",
            "__dict__",
            "a ReadableSpan made by hp_otel (a kept span read back, a deferred span built) is given the fields "
            "ReadableSpan.__init__ sets (_name, _context, _parent, ...), by name, not through __init__'s keyword "
            "arguments: the local store makes one a span on every read",
            "ReadableSpan.__init__ (correct, slower), where its fields differ",
        ),
        "ProxyMeterProvider": Member(
            "opentelemetry.metrics._internal:_ProxyMeterProvider",
            "",
            "the instrumentor tells a meter provider someone configured from the API's placeholder",
            "only NoOpMeterProvider counts as unconfigured",
        ),
    }
)
# The SDK's and exporters' private modules whose loggers (getLogger(__name__)) log per export attempt.
PRIVATE_LOGGER_MODULES = (
    "opentelemetry.exporter.otlp.proto.http._common",
    "opentelemetry.sdk.metrics._internal.export",
    "opentelemetry.sdk._shared_internal",
)

_SDK_DEFAULT_MAX_QUEUE_SIZE = 2048
_SDK_DEFAULT_MAX_EXPORT_BATCH_SIZE = 512


def span_attribute_dict(span: Any) -> Mapping[str, Any] | None:
    """The span's attributes as the SDK's own dict (read-only use), or None where it keeps none
    (`span._attributes._dict`; a span read from a file keeps a plain dict in `_attributes`)."""
    raw = getattr(span, "_attributes", None)
    inner = getattr(raw, "_dict", None)  # the SDK's BoundedAttributes
    if isinstance(inner, dict):
        return inner
    if isinstance(raw, dict):
        return raw
    return None


def _span_context_is_tuple() -> bool:
    """True when SpanContext is the tuple (trace_id, span_id, is_remote, trace_flags, trace_state, is_valid)."""
    try:
        flags, state = TraceFlags(1), TraceState([("k", "v")])
        probe = SpanContext(3, 5, True, flags, state)
        return tuple(probe) == (3, 5, True, flags, state, True) and (
            probe.trace_id,
            probe.span_id,
            probe.is_remote,
            probe.trace_flags,
            probe.trace_state,
            probe.is_valid,
        ) == tuple(probe)
    except Exception:
        return False


SPAN_CONTEXT_IS_TUPLE = _span_context_is_tuple()
_TRACE_ID_MAX = 2**128 - 1
_SPAN_ID_MAX = 2**64 - 1
_tuple_new = tuple.__new__


def _new_span_context_fast(
    trace_id: int, span_id: int, is_remote: bool, trace_flags: TraceFlags, trace_state: TraceState
) -> SpanContext:
    valid = 0 < trace_id <= _TRACE_ID_MAX and 0 < span_id <= _SPAN_ID_MAX  # as SpanContext.__new__ says it
    return _tuple_new(SpanContext, (trace_id, span_id, is_remote, trace_flags, trace_state, valid))


def _span_context_fields_slow(context: SpanContext) -> tuple[int, int, bool, TraceFlags, TraceState]:
    return (context.trace_id, context.span_id, context.is_remote, context.trace_flags, context.trace_state)


# new_span_context(trace_id, span_id, is_remote, trace_flags, trace_state): SpanContext(...) with those
# arguments (given, never None); span_context_fields(context): (trace_id, span_id, is_remote, trace_flags,
# trace_state), read in C (an itemgetter) where SpanContext is the tuple it declares.
new_span_context: Callable[[int, int, bool, TraceFlags, TraceState], SpanContext]
span_context_fields: Callable[[SpanContext], tuple[int, int, bool, TraceFlags, TraceState]]
if SPAN_CONTEXT_IS_TUPLE:
    new_span_context = _new_span_context_fast
    span_context_fields = operator.itemgetter(0, 1, 2, 3, 4)  # type: ignore[assignment]
else:  # pragma: no cover - an SDK whose SpanContext changed its layout
    new_span_context = SpanContext
    span_context_fields = _span_context_fields_slow


# What ReadableSpan.__init__ sets, by argument: the fields a span hp_otel makes is given.
READABLE_SPAN_FIELDS: Mapping[str, str] = MappingProxyType(
    {
        "name": "_name",
        "context": "_context",
        "kind": "_kind",
        "instrumentation_info": "_instrumentation_info",
        "instrumentation_scope": "_instrumentation_scope",
        "parent": "_parent",
        "start_time": "_start_time",
        "end_time": "_end_time",
        "attributes": "_attributes",
        "events": "_events",
        "links": "_links",
        "resource": "_resource",
        "status": "_status",
    }
)


def _readable_span_is_its_fields() -> bool:
    """True when a ReadableSpan's instance dict is exactly READABLE_SPAN_FIELDS, each holding its argument."""
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import ReadableSpan

        given: dict[str, Any] = {name: object() for name in READABLE_SPAN_FIELDS}
        given["name"], given["resource"] = "probe", Resource.get_empty()
        probe = ReadableSpan(**given)
        return vars(probe) == {field: given[name] for name, field in READABLE_SPAN_FIELDS.items()}
    except Exception:
        return False


READABLE_SPAN_IS_ITS_FIELDS = _readable_span_is_its_fields()


def instrumentation_scope(tracer: Any) -> Any:
    """The SDK tracer's instrumentation scope (`tracer._instrumentation_scope`), or None."""
    return getattr(tracer, "_instrumentation_scope", None)


def span_limits(tracer: Any) -> Any:
    """The SDK tracer's span limits (`tracer._span_limits`), or None."""
    return getattr(tracer, "_span_limits", None)


def tracer_enabled(tracer: Any) -> bool:
    """False for an SDK tracer its provider's configurator disabled (`tracer._is_enabled()`); else True."""
    enabled = getattr(tracer, "_is_enabled", None)
    try:
        return bool(enabled()) if callable(enabled) else True
    except Exception:
        return True


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, "") or default)
    except ValueError:
        return default


def default_max_queue_size() -> int:
    """The span queue size the SDK's BatchSpanProcessor uses when given none (it reads OTEL_BSP_MAX_QUEUE_SIZE)."""
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    read = getattr(BatchSpanProcessor, "_default_max_queue_size", None)
    return int(read()) if callable(read) else _env_int("OTEL_BSP_MAX_QUEUE_SIZE", _SDK_DEFAULT_MAX_QUEUE_SIZE)


def default_max_export_batch_size() -> int:
    """The export batch size the SDK's BatchSpanProcessor uses when given none (OTEL_BSP_MAX_EXPORT_BATCH_SIZE)."""
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    read = getattr(BatchSpanProcessor, "_default_max_export_batch_size", None)
    if callable(read):
        return int(read())
    return _env_int("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", _SDK_DEFAULT_MAX_EXPORT_BATCH_SIZE)


def preferred_temporality(exporter: Any) -> Any:
    """The metric exporter's temporality per instrument type (`exporter._preferred_temporality`), or None."""
    return getattr(exporter, "_preferred_temporality", None)


def preferred_aggregation(exporter: Any) -> Any:
    """The metric exporter's aggregation per instrument type (`exporter._preferred_aggregation`), or None."""
    return getattr(exporter, "_preferred_aggregation", None)


def exporter_endpoint(exporter: Any) -> str | None:
    """Where an OTLP exporter sends, as it resolved it (`exporter._endpoint`), or None."""
    endpoint = getattr(exporter, "_endpoint", None)
    return endpoint if isinstance(endpoint, str) else None


class _NoInstances:
    """Stands for a class this SDK lacks: nothing is an instance of it."""


def proxy_meter_provider_class() -> type:
    """The API's placeholder meter provider class (before anyone sets one), or a class nothing is an instance of."""
    try:
        from opentelemetry.metrics._internal import _ProxyMeterProvider
    except ImportError:
        return _NoInstances
    return _ProxyMeterProvider
