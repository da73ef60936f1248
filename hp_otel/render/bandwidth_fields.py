"""A collective's bandwidth in the JSON dump: the span's attributes as per-record fields."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hp_otel.spans import schema

# JSON field -> span attribute, in the order they are written.
_FIELDS = (
    ("bw_bytes", schema.COLLECTIVE_BW_BYTES),
    ("algbw_bytes_per_s", schema.COLLECTIVE_ALGBW),
    ("busbw_bytes_per_s", schema.COLLECTIVE_BUSBW),
)
FIELDS = tuple(name for name, _ in _FIELDS)
ATTRIBUTES = tuple(key for _, key in _FIELDS)


def json_fields(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """The bandwidth fields of one collective record (none when its span has no bandwidth)."""
    if schema.COLLECTIVE_BUSBW not in attrs:
        return {}
    return {
        "bw_bytes": int(attrs.get(schema.COLLECTIVE_BW_BYTES, 0)),
        "algbw_bytes_per_s": float(attrs.get(schema.COLLECTIVE_ALGBW, 0.0)),
        "busbw_bytes_per_s": float(attrs[schema.COLLECTIVE_BUSBW]),
    }
