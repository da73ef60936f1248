"""Reading a rank's file once: its bytes, one JSON decode, and the OTLP/JSON values `hp-otel ranks` needs.

`hp-otel ranks` reads thousands of files; the protobuf round trip of `spans.otlp_json`
(ParseDict, then SDK spans) cost half its time, and each file was decoded three times
(Flight Recorder probe, JSON dump probe, spans).  Here a file is read once
(`read_bytes`, by the one bounded reader of `common/input_files.py`), decoded once
(`decode_json`), and only the collective spans' attributes are converted
(`attribute_values`), with every integer checked in one place (`otlp_int`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from hp_otel.common import input_files
from hp_otel.spans import schema

try:  # decodes only the collective spans of a spans file, skipping the others unparsed (optional)
    import msgspec
except ImportError:  # pragma: no cover - the standard library's decoder reads every span instead
    msgspec = None


class RankInputError(ValueError):
    """A file `hp-otel ranks` cannot compare (missing, not spans, no rank, two files of one rank)."""


def read_bytes(path: str) -> bytes:
    """The file's bytes by the one bounded reader (`common/input_files.py`: a regular file, the size limit first)."""
    try:
        return input_files.read_bytes(path, "spans file")
    except input_files.InputFileError as exc:
        raise RankInputError(str(exc)) from None


def decode_json(path: str, data: bytes) -> Any:
    """The file's JSON; a step loop's collectives file cut in an append is read up to its last whole step."""
    try:
        return input_files.parse_json(data, path, "spans file")
    except input_files.InputFileError as exc:
        from hp_otel.spans.collectives_file import recover_torn_ring

        recovered = recover_torn_ring(data, path)
        if recovered is not None:
            return recovered
        raise RankInputError(str(exc)) from None


_INT64_MIN, _INT64_MAX = input_files.INT64_MIN, input_files.INT64_MAX


def otlp_int(value: Any, field: str = "an int64 value") -> int:
    """An OTLP/JSON int64 (a JSON integer or its decimal text, as the protobuf JSON mapping allows)."""
    kind = type(value)
    if kind is int or kind is str:  # the common case, as `checked_int` takes it, without its checks' calls
        try:
            number = int(value)
        except ValueError:
            number = None
        if number is not None and _INT64_MIN <= number <= _INT64_MAX:
            return number
    return input_files.checked_int(value, field)  # everything else, and the error naming the field


def any_value(value: Any) -> Any:
    """An OTLP/JSON AnyValue as Python (what `otlp_json.read_trace_file` gives for it): arrays as tuples."""
    if type(value) is not dict:
        if not isinstance(value, Mapping):
            raise ValueError(f"an attribute value must be an object, got {value!r}")
        value = dict(value)
    get = value.get
    text = get("stringValue", _ABSENT)
    if text is not _ABSENT:
        if type(text) is not str and not isinstance(text, str):
            raise ValueError(f"stringValue is not a string: {text!r}")
        return text
    number = get("intValue", _ABSENT)
    if number is not _ABSENT:
        return otlp_int(number)
    flag = get("boolValue", _ABSENT)
    if flag is not _ABSENT:
        if not isinstance(flag, bool):
            raise ValueError(f"boolValue is not a boolean: {flag!r}")
        return flag
    number = get("doubleValue", _ABSENT)
    if number is not _ABSENT:
        if isinstance(number, bool) or not isinstance(number, (int, float, str)):
            raise ValueError(f"doubleValue is not a number: {number!r}")
        return float(number)
    array = get("arrayValue", _ABSENT)
    if array is not _ABSENT:
        return _array((array or {}).get("values", ()))
    return None  # kvlist and bytes values: nothing `ranks` reads


def _array(values: Iterable[Any]) -> tuple[Any, ...]:
    """An arrayValue's values: ints (group ranks, shapes) taken at once, anything else by `any_value`."""
    out = []
    for v in values:
        if type(v) is dict and len(v) == 1:
            number = v.get("intValue", _ABSENT)
            if type(number) is str or type(number) is int:
                try:
                    n = int(number)
                except ValueError:
                    n = None
                if n is not None and _INT64_MIN <= n <= _INT64_MAX:
                    out.append(n)
                    continue
        out.append(any_value(v))
    return tuple(out)


_ABSENT = object()


def attribute_values(attributes: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    return {kv["key"]: any_value(kv.get("value", {})) for kv in attributes}


def span_attribute_values(attributes: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """A span's attributes, under today's names (`schema.normalise_attributes`: older files' too)."""
    return schema.normalise_attributes(attribute_values(attributes))


@dataclass(frozen=True, slots=True)
class CollectiveSpan:
    """A collective span as `reading` and `exposure.by_window` see one (the ReadableSpan fields they use)."""

    name: str
    attributes: Mapping[str, Any]
    start_time: int
    end_time: int


# The call kind's key now and in files of earlier versions (schema.RENAMED).
_CALL_KIND_KEYS = frozenset(
    {schema.CALL_KIND, *(old for old, new in schema.RENAMED.items() if new == schema.CALL_KIND)}
)


def _is_collective(attributes: Iterable[Mapping[str, Any]]) -> bool:
    for kv in attributes:
        if kv.get("key") in _CALL_KIND_KEYS:
            return (kv.get("value") or {}).get("stringValue") == schema.KIND_COLLECTIVE
    return False


def resources_and_collectives(path: str, payload: Any) -> tuple[list[dict[str, Any]], Iterator[CollectiveSpan]]:
    """The attributes of each resource, and (lazily) the collective spans of an OTLP/JSON traces payload."""
    if not isinstance(payload, dict) or "resourceSpans" not in payload:
        raise RankInputError(f"spans file {path!r} is not OTLP/JSON traces (no 'resourceSpans' key)")
    entries = payload["resourceSpans"] or []
    try:
        if not isinstance(entries, list):
            raise ValueError("'resourceSpans' is not a list")
        resources = [span_attribute_values(((e or {}).get("resource") or {}).get("attributes") or ()) for e in entries]
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise RankInputError(f"spans file {path!r} is not valid OTLP/JSON traces: {exc}") from exc
    return resources, _collectives(path, entries)


def _collectives(path: str, entries: list[Any]) -> Iterator[CollectiveSpan]:
    try:
        for entry in entries:
            for scope in entry.get("scopeSpans") or ():
                for span in scope.get("spans") or ():
                    attributes = span.get("attributes") or ()
                    if not _is_collective(attributes):
                        continue
                    yield CollectiveSpan(
                        str(span.get("name", "")),
                        span_attribute_values(attributes),
                        otlp_int(span.get("startTimeUnixNano", 0), "startTimeUnixNano"),
                        otlp_int(span.get("endTimeUnixNano", 0), "endTimeUnixNano"),
                    )
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise RankInputError(f"spans file {path!r} is not valid OTLP/JSON traces: {exc}") from exc


if msgspec is not None:

    class _Span(msgspec.Struct):
        name: Any = ""
        startTimeUnixNano: Any = 0  # OTLP/JSON field names
        endTimeUnixNano: Any = 0
        attributes: msgspec.Raw = msgspec.Raw(b"null")

    class _Scope(msgspec.Struct):
        spans: list[_Span] | None = None

    class _Resource(msgspec.Struct):
        resource: msgspec.Raw = msgspec.Raw(b"null")
        scopeSpans: list[_Scope] | None = None

    class _Traces(msgspec.Struct):
        resourceSpans: list[_Resource] | None  # required: a file without it is not spans
        # a file that is also something else (a collectives file, a Flight Recorder or JSON dump) goes the
        # general way, which decides what it is
        format: Any = msgspec.UNSET
        entries: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET

    _traces = msgspec.json.Decoder(_Traces)
    _any = msgspec.json.Decoder()
    _COLLECTIVE = b'"' + schema.KIND_COLLECTIVE.encode() + b'"'


def fast_collectives(path: str, data: bytes) -> tuple[list[dict[str, Any]], list[CollectiveSpan]] | None:
    """A spans file's resources and collective spans without building its other spans (msgspec
    decodes the file's structure, each span's attributes kept as raw bytes; only those that can
    be a collective's are decoded).  None when msgspec is not installed, or for anything not plainly
    OTLP/JSON traces: the general reader (`decode_json`, `resources_and_collectives`) then reads it
    and says what is wrong, so both give the same result or error."""
    if msgspec is None:
        return None
    try:
        traces = _traces.decode(data)
        if traces.format is not msgspec.UNSET or traces.entries is not msgspec.UNSET:
            return None
        resources, spans = [], []
        for entry in traces.resourceSpans or ():
            resource = _any.decode(entry.resource) or {}
            resources.append(span_attribute_values(resource.get("attributes") or ()))
            for scope in entry.scopeSpans or ():
                for span in scope.spans or ():
                    raw = span.attributes
                    if memoryview(raw).tobytes().find(_COLLECTIVE) < 0:
                        continue
                    attributes = _any.decode(raw) or ()
                    if not _is_collective(attributes):
                        continue
                    spans.append(
                        CollectiveSpan(
                            str(span.name),
                            span_attribute_values(attributes),
                            otlp_int(span.startTimeUnixNano, "startTimeUnixNano"),
                            otlp_int(span.endTimeUnixNano, "endTimeUnixNano"),
                        )
                    )
    except (msgspec.DecodeError, msgspec.ValidationError, AttributeError, KeyError, TypeError, ValueError,
            RecursionError):  # fmt: skip
        return None  # the general reader names the problem
    return resources, spans
