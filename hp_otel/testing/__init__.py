"""Helpers for users' own tests: assertions on a window's spans and counts
(`assertions`) and the pytest fixtures that wire hp_otel to a test (`pytest_plugin`,
registered as the `hp_otel` plugin).

The helpers load on first use (PEP 562): pytest imports the plugin, and so this package, in
every run in a venv with hp_otel, and a run that uses none of them pays nothing for them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what type checkers and the API reference see
    from hp_otel.testing.assertions import (
        assert_collective_counts,
        assert_no_callback_errors,
        assert_span_tree,
        collective_counts,
        metric_points,
        span_outline,
        spans_named,
    )
    from hp_otel.testing.snapshots import assert_comm_snapshot

__all__ = [
    "assert_collective_counts",
    "assert_comm_snapshot",
    "assert_no_callback_errors",
    "assert_span_tree",
    "collective_counts",
    "metric_points",
    "span_outline",
    "spans_named",
]

# name -> the module that defines it
_LAZY = {name: "hp_otel.testing.assertions" for name in __all__} | {"assert_comm_snapshot": "hp_otel.testing.snapshots"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'hp_otel.testing' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once: the next use is a plain global
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
