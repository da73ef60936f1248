"""Helpers for users' own tests: assertions on a window's spans and counts
(`assertions`) and the pytest fixtures that wire hp_otel to a test (`pytest_plugin`,
registered as the `hp_otel` plugin)."""

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
