"""The pytest plugin, as a user's test session sees it (pytester runs a session inline)."""

from __future__ import annotations

import pytest

pytest_plugins = ("pytester",)
pytestmark = pytest.mark.torch_free  # needs no torch: not rerun on torch 2.14.1 (tests/support/markers.py)

USER_TESTS = """
from hp_otel.spans.infos import CollectiveInfo
from hp_otel.testing import assert_collective_counts, assert_span_tree, metric_points

AR = CollectiveInfo("_c10d_functional.all_reduce", "all_reduce", 2, bytes=64)


def test_counts_and_tree(comm_debug_mode, hp_span_exporter, hp_metric_reader):
    with comm_debug_mode as mode:
        mode.observer.on_op_enter("linear", [])
        mode.observer.on_collective(AR, 1, 2)
        mode.observer.on_op_exit("linear", [])
    assert_collective_counts(hp_span_exporter, {"all_reduce": 1}, normalized=True)
    assert_span_tree(hp_span_exporter, "linear\\n  all_reduce")
    assert [p.value for p in metric_points(hp_metric_reader, "hp_otel.collective.calls")] == [1]
    assert [p.value for p in metric_points(hp_metric_reader, "hp_otel.collective.input.size")] == [64]
    assert metric_points(hp_metric_reader, "no.such.metric") == []


def test_wrong_count_fails_readably(comm_debug_mode):
    with comm_debug_mode as mode:
        mode.observer.on_collective(AR, 1, 2)
    assert_collective_counts(mode, {"_c10d_functional.all_reduce": 5})


def test_left_active(make_comm_debug_mode):
    make_comm_debug_mode().__enter__()
"""


def test_plugin_fixtures_and_helpers_in_a_user_session(pytester) -> None:
    pytester.makepyfile(test_user=USER_TESTS)
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, failed=1, errors=1)
    result.stdout.fnmatch_lines(
        [
            "*1 CommDebugMode window(s) were left active by the test*",
            "*_c10d_functional.all_reduce  expected 5, got 1*",
        ]
    )


def test_metric_points_names_a_wrong_reader() -> None:
    import pytest

    from hp_otel.testing import metric_points

    with pytest.raises(TypeError, match="reader must be an InMemoryMetricReader, got list"):
        metric_points([], "hp_otel.collective.calls")
