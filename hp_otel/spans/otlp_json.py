"""Spans to and from OTLP/JSON files (the OTLP protobuf JSON mapping, ids in hex).

Writing uses the OTLP exporter's own protobuf encoder, so a file holds exactly what an
OTLP exporter would send; reading rebuilds SDK ReadableSpans, so the table and counts
can be rendered again later (`hp-otel render FILE`).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from google.protobuf.json_format import MessageToDict, ParseDict
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from hp_otel.common.files import write_text_atomically
from hp_otel.common.input_files import (
    DEFAULT_MAX_BYTES,
    MAX_BYTES_VARIABLE,
    InputFileError,
    max_bytes_limit,
    parse_json,
    read_bytes,
)
from hp_otel.spans import schema

__all__ = ["DEFAULT_MAX_BYTES", "MAX_BYTES_VARIABLE", "max_bytes_limit"]  # kept here for their old importers
_ID_FIELDS = ("traceId", "spanId", "parentSpanId")
MEMORY_PER_FILE_BYTE = 10  # peak memory / file size when reading (the measurement: docs/how-it-works/costs.md)


class SpanFileError(ValueError):
    """A spans file that is missing, not JSON, or not OTLP/JSON traces."""


def _ids(obj: Any, convert: Any) -> Any:
    """Apply `convert` to every trace/span id field, in place (iterative: files can nest deeply)."""
    stack = [obj]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key, value in item.items():
                if key in _ID_FIELDS and isinstance(value, str):
                    item[key] = convert(value)
                elif isinstance(value, (dict, list)):
                    stack.append(value)
        elif isinstance(item, list):
            stack.extend(value for value in item if isinstance(value, (dict, list)))
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
    pause: Callable[[], None] | None = None,
) -> None:
    """Write finished spans to `path` as OTLP/JSON (the format `read_spans` and `hp-otel render` read).

    `pause`: called between pieces of the encoding (the hang watchdog's thread yields to
    training there); the file then repeats the resource once per piece.

    `resource_defaults` are resource attributes set where the spans' resource lacks them
    (the rank, so a per-rank file names its rank even without launcher variables); with
    them, a file without spans still holds the resource.
    """
    spans = tuple(spans) if not isinstance(spans, (str, bytes)) and hasattr(spans, "__iter__") else spans
    if not isinstance(spans, tuple) or not all(isinstance(span, ReadableSpan) for span in spans):
        raise TypeError(f"spans must be a sequence of finished spans (ReadableSpan), got {type(spans).__name__}")
    if pause is not None:
        _write_spans_in_pieces(path, spans, argument, resource_defaults, pause)
        return
    payload = spans_to_otlp_json(spans)
    if resource_defaults:
        _add_resource_defaults(payload, resource_defaults)
    text = json.dumps(payload)  # one call of the C encoder: json.dump's streaming one is pure Python (much slower)
    write_text_atomically(path, lambda handle: handle.write(text), argument=argument)


_PIECE_SPANS = 64


def _write_spans_in_pieces(
    path: str | os.PathLike[str],
    spans: tuple[ReadableSpan, ...],
    argument: str,
    resource_defaults: Mapping[str, int | str] | None,
    pause: Callable[[], None],
) -> None:
    """The same file, encoded `_PIECE_SPANS` spans at a time with `pause()` between pieces.

    Each piece is its own `resourceSpans` entry (OTLP allows repeating a resource), so the
    writer never holds the interpreter for the whole file at once."""
    entries: list[str] = []
    for start in range(0, max(len(spans), 1), _PIECE_SPANS):
        payload = spans_to_otlp_json(spans[start : start + _PIECE_SPANS])
        if resource_defaults:
            _add_resource_defaults(payload, resource_defaults)
        entries.extend(json.dumps(entry) for entry in payload.get("resourceSpans", ()))
        pause()

    def write(handle: Any) -> None:
        handle.write('{"resourceSpans": [')
        for i, entry in enumerate(entries):
            handle.write("," + entry if i else entry)
        handle.write("]}")

    write_text_atomically(path, write, argument=argument)


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


def read_spans(path: str | os.PathLike[str], max_bytes: int | None = None) -> list[ReadableSpan]:
    """Read an OTLP/JSON traces file back into ReadableSpans; SpanFileError says what is wrong (see read_trace_file)."""
    return read_trace_file(path, max_bytes)[0]


def read_trace_file(
    path: str | os.PathLike[str], max_bytes: int | None = None
) -> tuple[list[ReadableSpan], list[dict[str, Any]]]:
    """The spans of an OTLP/JSON traces file, and the attributes of every resource in it (also one without spans).

    Read by the bounded reader (`common/input_files.py`): a file over `max_bytes` (default:
    `HP_OTEL_RENDER_MAX_BYTES`, else 256 MiB) is refused with its size and the limit before
    anything is parsed (parsing needs about 10x its size), and running out of memory is
    reported as such.
    """
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):  # an int would be read as a descriptor
        raise TypeError(f"path must be a non-empty path (str or os.PathLike), got {path!r}")
    name = os.fspath(path)
    try:
        data = read_bytes(name, "spans file", max_bytes)
        size = len(data)
        payload = parse_json(data, name, "spans file")
    except InputFileError as exc:
        raise SpanFileError(str(exc)) from None
    except MemoryError:
        raise SpanFileError(_out_of_memory(name, os.path.getsize(name))) from None
    del data
    return trace_from_payload(payload, name, size)


def _out_of_memory(name: str, size: int) -> str:
    return (
        f"spans file {name!r} ({size:,} bytes) needs more memory than is available to read "
        f"(about {MEMORY_PER_FILE_BYTE}x the file size); split the file or read it on a larger machine"
    )


def trace_from_payload(payload: Any, name: str, size: int = 0) -> tuple[list[ReadableSpan], list[dict[str, Any]]]:
    """`read_trace_file` on a file already parsed as JSON (`payload`; `size`: its bytes, for messages)."""
    try:
        message = _parse(name, payload)
        resources = [
            schema.normalise_attributes({kv.key: _any_value(kv.value) for kv in rs.resource.attributes})
            for rs in message.resource_spans
        ]
        return _spans_of(message), resources
    except MemoryError:
        raise SpanFileError(_out_of_memory(name, size)) from None
    except RecursionError:
        raise SpanFileError(
            f"spans file {name!r} nests values deeper than can be read ({sys.getrecursionlimit()} levels); "
            "an OTLP/JSON traces file nests about 10"
        ) from None


def _parse(name: str, payload: Any) -> ExportTraceServiceRequest:
    if not isinstance(payload, dict) or "resourceSpans" not in payload:
        raise SpanFileError(f"spans file {name!r} is not OTLP/JSON traces (no 'resourceSpans' key)")
    try:
        _ids(payload, _hex_to_b64)
    except ValueError as exc:
        raise SpanFileError(f"spans file {name!r} has a trace or span id that is not hex: {exc}") from exc
    try:
        return ParseDict(payload, ExportTraceServiceRequest())
    except (RecursionError, MemoryError):
        raise
    except Exception as exc:
        raise SpanFileError(f"spans file {name!r} is not valid OTLP/JSON traces: {exc}") from exc


def _spans_of(message: ExportTraceServiceRequest) -> list[ReadableSpan]:
    spans: list[ReadableSpan] = []
    for resource_spans in message.resource_spans:
        resource = Resource(
            schema.normalise_attributes({kv.key: _any_value(kv.value) for kv in resource_spans.resource.attributes})
        )
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
                        attributes=schema.normalise_attributes(
                            {kv.key: _any_value(kv.value) for kv in span.attributes}
                        ),
                        kind=SpanKind.INTERNAL,
                        status=status,
                        start_time=span.start_time_unix_nano,
                        end_time=span.end_time_unix_nano,
                        links=[_link_of(link) for link in span.links],  # a collective's to its peer's span
                    )
                )
    return spans


def _link_of(link: Any) -> Link:
    trace_id, span_id = int.from_bytes(link.trace_id, "big"), int.from_bytes(link.span_id, "big")
    return Link(SpanContext(trace_id, span_id, True, TraceFlags(1)))
