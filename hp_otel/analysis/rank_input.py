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
from hp_otel.spans import schema as s


class RankInputError(ValueError):
    """A file `hp-otel ranks` cannot compare (missing, not spans, no rank, two files of one rank)."""


def read_bytes(path: str) -> bytes:
    """The file's bytes by the one bounded reader (`common/input_files.py`: a regular file, the size limit first)."""
    try:
        return input_files.read_bytes(path, "spans file")
    except input_files.InputFileError as exc:
        raise RankInputError(str(exc)) from None


def decode_json(path: str, data: bytes) -> Any:
    try:
        return input_files.parse_json(data, path, "spans file")
    except input_files.InputFileError as exc:
        raise RankInputError(str(exc)) from None


def otlp_int(value: Any, field: str = "an int64 value") -> int:
    """An OTLP/JSON int64 (a JSON integer or its decimal text, as the protobuf JSON mapping allows)."""
    return input_files.checked_int(value, field)


def any_value(value: Any) -> Any:
    """An OTLP/JSON AnyValue as Python (what `otlp_json.read_trace_file` gives for it): arrays as tuples."""
    if not isinstance(value, Mapping):
        raise ValueError(f"an attribute value must be an object, got {value!r}")
    if "stringValue" in value:
        text = value["stringValue"]
        if not isinstance(text, str):
            raise ValueError(f"stringValue is not a string: {text!r}")
        return text
    if "intValue" in value:
        return otlp_int(value["intValue"])
    if "boolValue" in value:
        flag = value["boolValue"]
        if not isinstance(flag, bool):
            raise ValueError(f"boolValue is not a boolean: {flag!r}")
        return flag
    if "doubleValue" in value:
        number = value["doubleValue"]
        if isinstance(number, bool) or not isinstance(number, (int, float, str)):
            raise ValueError(f"doubleValue is not a number: {number!r}")
        return float(number)
    if "arrayValue" in value:
        return tuple(any_value(v) for v in (value["arrayValue"] or {}).get("values", ()))
    return None  # kvlist and bytes values: nothing `ranks` reads


def attribute_values(attributes: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    return {kv["key"]: any_value(kv.get("value", {})) for kv in attributes}


@dataclass(frozen=True, slots=True)
class CollectiveSpan:
    """A collective span as `reading` and `exposure.by_window` see one (the ReadableSpan fields they use)."""

    name: str
    attributes: Mapping[str, Any]
    start_time: int
    end_time: int


def _is_collective(attributes: Iterable[Mapping[str, Any]]) -> bool:
    for kv in attributes:
        if kv.get("key") == s.CALL_KIND:
            return (kv.get("value") or {}).get("stringValue") == s.KIND_COLLECTIVE
    return False


def resources_and_collectives(path: str, payload: Any) -> tuple[list[dict[str, Any]], Iterator[CollectiveSpan]]:
    """The attributes of each resource, and (lazily) the collective spans of an OTLP/JSON traces payload."""
    if not isinstance(payload, dict) or "resourceSpans" not in payload:
        raise RankInputError(f"spans file {path!r} is not OTLP/JSON traces (no 'resourceSpans' key)")
    entries = payload["resourceSpans"] or []
    try:
        if not isinstance(entries, list):
            raise ValueError("'resourceSpans' is not a list")
        resources = [attribute_values(((e or {}).get("resource") or {}).get("attributes") or ()) for e in entries]
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
                        attribute_values(attributes),
                        otlp_int(span.get("startTimeUnixNano", 0), "startTimeUnixNano"),
                        otlp_int(span.get("endTimeUnixNano", 0), "endTimeUnixNano"),
                    )
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise RankInputError(f"spans file {path!r} is not valid OTLP/JSON traces: {exc}") from exc
