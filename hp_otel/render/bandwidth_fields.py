"""A collective's bandwidth in the JSON dump: the span's attributes as per-record fields."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hp_otel.spans import schema as s

# JSON field -> span attribute, in the order they are written.
_FIELDS = (
    ("bw_bytes", s.COLLECTIVE_BW_BYTES),
    ("algbw_bytes_per_s", s.COLLECTIVE_ALGBW),
    ("busbw_bytes_per_s", s.COLLECTIVE_BUSBW),
)
FIELDS = tuple(name for name, _ in _FIELDS)
ATTRIBUTES = tuple(key for _, key in _FIELDS)


def json_fields(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """The bandwidth fields of one collective record (none when its span has no bandwidth)."""
    if s.COLLECTIVE_BUSBW not in attrs:
        return {}
    return {
        "bw_bytes": int(attrs.get(s.COLLECTIVE_BW_BYTES, 0)),
        "algbw_bytes_per_s": float(attrs.get(s.COLLECTIVE_ALGBW, 0.0)),
        "busbw_bytes_per_s": float(attrs[s.COLLECTIVE_BUSBW]),
    }
