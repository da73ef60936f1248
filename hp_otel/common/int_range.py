"""The integers a span or metric attribute can carry: OTLP encodes them as int64, and an
exporter drops an attribute outside that range with an encoding error and a traceback, after
the step it belongs to has run. A user-given one is checked where it is given instead."""

from __future__ import annotations

from typing import Any

INT64_MAX = 2**63 - 1


def is_attribute_count(value: Any) -> bool:
    """A real int (not a bool) in 0..2**63 - 1."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= INT64_MAX


def check_attribute_count(value: Any, name: str, also: str = "") -> int:
    """`value` if it is a non-negative int64; else ValueError naming `name` and what is allowed."""
    if not is_attribute_count(value):
        allowed = f"a non-negative int of at most 2**63 - 1 (int64){also}"
        raise ValueError(f"{name} must be {allowed}, got {value!r}")
    return int(value)
