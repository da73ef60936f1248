"""Spans to and from OTLP/JSON files (the OTLP protobuf JSON mapping, ids in hex).

Writing uses the OTLP exporter's own protobuf encoder, so a file holds exactly what an
OTLP exporter would send; reading rebuilds SDK ReadableSpans, so the table and counts
can be rendered again later (`hp-otel render FILE`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from google.protobuf.json_format import MessageToDict, ParseDict
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from hp_otel.files import write_text_atomically

_ID_FIELDS = ("traceId", "spanId", "parentSpanId")


class SpanFileError(ValueError):
    """A spans file that is missing, not JSON, or not OTLP/JSON traces."""


def _ids(obj: Any, convert: Any) -> Any:
    """Apply `convert` to every trace/span id field, recursively."""
    if isinstance(obj, dict):
        return {k: (convert(v) if k in _ID_FIELDS and isinstance(v, str) else _ids(v, convert)) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_ids(v, convert) for v in obj]
    return obj


def _b64_to_hex(value: str) -> str:
    import base64

    return base64.b64decode(value).hex()


def _hex_to_b64(value: str) -> str:
    import base64

    return base64.b64encode(bytes.fromhex(value)).decode("ascii")


def spans_to_otlp_json(spans: Sequence[ReadableSpan]) -> dict[str, Any]:
    """The OTLP/JSON mapping: ids in hex, enums (span kind, status code) as integers, as the OTLP spec says."""
    message = encode_spans(spans)
    return _ids(MessageToDict(message, use_integers_for_enums=True), _b64_to_hex)


def write_spans(
    path: str | os.PathLike[str],
    spans: Sequence[ReadableSpan],
    argument: str = "path",
    resource_defaults: Mapping[str, int | str] | None = None,
) -> None:
    """Write finished spans to `path` as OTLP/JSON (the format `read_spans` and `hp-otel render` read).

    `resource_defaults` are resource attributes set where the spans' resource lacks them
    (the rank, so a per-rank file names its rank even without launcher variables); with
    them, a file without spans still holds the resource.
    """
    spans = tuple(spans) if not isinstance(spans, (str, bytes)) and hasattr(spans, "__iter__") else spans
    if not isinstance(spans, tuple) or not all(isinstance(span, ReadableSpan) for span in spans):
        raise TypeError(f"spans must be a sequence of finished spans (ReadableSpan), got {type(spans).__name__}")
    payload = spans_to_otlp_json(spans)
    if resource_defaults:
        _add_resource_defaults(payload, resource_defaults)
    write_text_atomically(path, lambda handle: json.dump(payload, handle), argument=argument)


def _add_resource_defaults(payload: dict[str, Any], defaults: Mapping[str, int | str]) -> None:
    resource_spans = payload.setdefault("resourceSpans", [])
    if not resource_spans:
        resource_spans.append({"resource": {"attributes": []}, "scopeSpans": []})
    for entry in resource_spans:
        attributes = entry.setdefault("resource", {}).setdefault("attributes", [])
        present = {kv.get("key") for kv in attributes}
        for key, value in defaults.items():
            if key not in present:
                encoded = {"intValue": str(value)} if isinstance(value, int) else {"stringValue": str(value)}
                attributes.append({"key": key, "value": encoded})


def _any_value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return tuple(_any_value(v) for v in value.array_value.values)
    if kind is None:
        return None
    return getattr(value, kind)


def read_spans(path: str | os.PathLike[str]) -> list[ReadableSpan]:
    """Read an OTLP/JSON traces file back into ReadableSpans; SpanFileError says what is wrong."""
    return read_trace_file(path)[0]


def read_trace_file(path: str | os.PathLike[str]) -> tuple[list[ReadableSpan], list[dict[str, Any]]]:
    """The spans of an OTLP/JSON traces file, and the attributes of every resource in it (also one without spans)."""
    payload = _load(path)
    try:
        message = ParseDict(_ids(payload, _hex_to_b64), ExportTraceServiceRequest())
    except Exception as exc:
        raise SpanFileError(f"spans file {os.fspath(path)!r} is not valid OTLP/JSON traces: {exc}") from exc
    resources = [{kv.key: _any_value(kv.value) for kv in rs.resource.attributes} for rs in message.resource_spans]
    return _spans_of(message), resources


def _load(path: str | os.PathLike[str]) -> dict[str, Any]:
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):  # an int would be read as a descriptor
        raise TypeError(f"path must be a non-empty path (str or os.PathLike), got {path!r}")
    try:
        with open(path, encoding="utf-8") as handle:
            payload = json.load(handle)
    except FileNotFoundError as exc:
        raise SpanFileError(f"spans file {os.fspath(path)!r} does not exist") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise SpanFileError(f"spans file {os.fspath(path)!r} cannot be read: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise SpanFileError(f"spans file {os.fspath(path)!r} is not JSON: {exc}") from exc
    if not isinstance(payload, dict) or "resourceSpans" not in payload:
        raise SpanFileError(f"spans file {os.fspath(path)!r} is not OTLP/JSON traces (no 'resourceSpans' key)")
    return payload


def _spans_of(message: ExportTraceServiceRequest) -> list[ReadableSpan]:
    spans: list[ReadableSpan] = []
    for resource_spans in message.resource_spans:
        resource = Resource({kv.key: _any_value(kv.value) for kv in resource_spans.resource.attributes})
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                trace_id = int.from_bytes(span.trace_id, "big")
                context = SpanContext(trace_id, int.from_bytes(span.span_id, "big"), True, TraceFlags(1))
                parent = (
                    SpanContext(trace_id, int.from_bytes(span.parent_span_id, "big"), True, TraceFlags(1))
                    if span.parent_span_id
                    else None
                )
                status = (
                    Status(StatusCode.ERROR, span.status.message or None)
                    if span.status.code == 2
                    else Status(StatusCode.UNSET)
                )
                spans.append(
                    ReadableSpan(
                        name=span.name,
                        context=context,
                        parent=parent,
                        resource=resource,
                        attributes={kv.key: _any_value(kv.value) for kv in span.attributes},
                        kind=SpanKind.INTERNAL,
                        status=status,
                        start_time=span.start_time_unix_nano,
                        end_time=span.end_time_unix_nano,
                    )
                )
    return spans
