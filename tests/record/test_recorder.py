"""The recorder on synthetic event sequences: span tree, counts, metrics, faults, bounds."""

from __future__ import annotations

import logging

import pytest
from events import ALL_REDUCE, collective, design_mlp_forward
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.trace import StatusCode

from hp_otel import CommDebugMode
from hp_otel.spans import schema
from hp_otel.spans.call_tree import build_call_tree
from hp_otel.spans.groups import group
from hp_otel.spans.infos import CollectiveInfo, ModuleInfo

pytestmark = pytest.mark.torch_free  # needs no torch: not rerun on torch 2.14.1 (tests/support/markers.py)


def _tree_names(mode: CommDebugMode) -> list:
    def walk(record):
        return (record.name, [walk(c) for c in record.children])

    return [walk(r) for r in build_call_tree(mode.get_finished_spans())]


def test_call_tree_is_the_span_tree() -> None:
    with CommDebugMode() as mode:
        design_mlp_forward(mode.observer)
    assert _tree_names(mode) == [
        ("MLP", [("fc1", [("linear", [])]), ("gelu", []), ("fc2", [("linear", [("all_reduce", [])])])])
    ]
    spans = {s.name: s for s in mode.get_finished_spans()}
    coll = spans["all_reduce"]
    assert coll.attributes[schema.CALL_KIND] == schema.KIND_COLLECTIVE
    assert coll.attributes[schema.COLLECTIVE_OP] == "all_reduce"
    # the group described once (the window's only collective on it), the id every rank derives alike
    assert (
        coll.attributes[schema.COLLECTIVE_GROUP_MEMBERS] == "0,1" and coll.attributes[schema.COLLECTIVE_GROUP] == "tp"
    )
    assert coll.attributes[schema.COLLECTIVE_GROUP_ID] == group("tp", (0, 1)).id
    assert schema.COLLECTIVE_GROUP_RANKS not in coll.attributes
    assert all(s.end_time >= s.start_time for s in mode.get_finished_spans())


def test_counts_by_name_normalised_and_module() -> None:
    gather = CollectiveInfo(name="differentiable_all_gather_concat", op="all_gather", group_size=2)
    with CommDebugMode() as mode:
        design_mlp_forward(mode.observer)
        mode.observer.on_module_enter(ModuleInfo("fc1", "fc1", "Linear"), "backward")
        collective(mode.observer, gather)
        collective(mode.observer)
        mode.observer.on_backward_end()
    assert mode.get_comm_counts() == {"differentiable_all_reduce": 2, "differentiable_all_gather_concat": 1}
    assert mode.get_comm_counts(normalized=True) == {"all_reduce": 2, "all_gather": 1}
    assert mode.get_total_counts() == 3
    assert mode.get_comm_module_counts() == {
        "(root)": {"forward": {"differentiable_all_reduce": 1}},
        "fc2": {"forward": {"differentiable_all_reduce": 1}},
        "fc1": {"backward": {"differentiable_all_gather_concat": 1, "differentiable_all_reduce": 1}},
    }
    assert mode.get_comm_module_counts(normalized=True) == {  # the demo prints these (issue 47)
        "(root)": {"forward": {"all_reduce": 1}},
        "fc2": {"forward": {"all_reduce": 1}},
        "fc1": {"backward": {"all_gather": 1, "all_reduce": 1}},
    }
    with pytest.raises(TypeError, match="normalized must be True or False"):
        mode.get_comm_module_counts(normalized="yes")  # type: ignore[arg-type]


def test_metrics_follow_the_collectives() -> None:
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    with CommDebugMode(meter_provider=provider) as mode:
        design_mlp_forward(mode.observer)
        collective(mode.observer)
    metrics = {
        m.name: m for rm in reader.get_metrics_data().resource_metrics for sm in rm.scope_metrics for m in sm.metrics
    }
    calls = metrics[schema.METRIC_CALLS]
    assert calls.unit == "{call}"
    points = {tuple(sorted(p.attributes.items())): p.value for p in calls.data.data_points}
    assert sum(points.values()) == 2
    inside_fc2 = next(p for p in calls.data.data_points if p.attributes[schema.MODULE_FQN] == "fc2")
    assert inside_fc2.value == 1
    assert inside_fc2.attributes[schema.COLLECTIVE_OP] == "all_reduce"
    assert inside_fc2.attributes[schema.COLLECTIVE_GROUP_SIZE] == 2
    assert inside_fc2.attributes[schema.PHASE] == "forward"
    assert sum(p.value for p in metrics[schema.METRIC_BYTES].data.data_points) == 2 * ALL_REDUCE.bytes
    assert metrics[schema.METRIC_BYTES].unit == "By"
    duration = metrics[schema.METRIC_DURATION]
    assert duration.unit == "s"
    assert sum(p.count for p in duration.data.data_points) == 2
    assert duration.data.data_points[0].explicit_bounds[0] == pytest.approx(1e-6)
    assert mode.get_metric_reader() is None  # a user's provider: no reader of ours


def test_default_providers_need_no_configuration() -> None:
    with CommDebugMode() as mode:
        collective(mode.observer)
    reader = mode.get_metric_reader()
    assert reader is not None
    names = {m.name for rm in reader.get_metrics_data().resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    assert {schema.METRIC_CALLS, schema.METRIC_BYTES, schema.METRIC_DURATION} <= names


def test_nested_modes_inner_records_outer_resumes() -> None:
    with CommDebugMode() as outer:
        collective(outer.observer)
        with CommDebugMode() as inner:
            # the sources feed the innermost mode; the suspended outer ignores events
            collective(inner.observer)
            collective(outer.observer)
        collective(outer.observer)
    assert inner.get_total_counts() == 1
    assert outer.get_total_counts() == 2


def test_mode_cannot_be_entered_twice() -> None:
    mode = CommDebugMode()
    with mode, pytest.raises(RuntimeError, match="already active"), mode:
        pass


def test_unbalanced_events_never_raise() -> None:
    with CommDebugMode() as mode:
        obs = mode.observer
        obs.on_op_exit("linear", [])  # exit without enter
        obs.on_module_exit("fc9", "forward")
        obs.on_redistribute_exit()
        collective(obs)  # outside any op
        obs.on_module_enter(ModuleInfo("a", "a", "A"), "backward")
        obs.on_module_enter(ModuleInfo("b", "b", "B"), "backward")
        obs.on_module_exit("a", "backward")  # parent closes before child (MindSpore backward)
        obs.on_op_enter("never_closed", [])
    assert mode.get_callback_error_counts() == {}
    spans = mode.get_finished_spans()
    assert {s.name for s in spans} == {"all_reduce", "a backward", "b backward", "never_closed"}
    assert all(s.end_time is not None for s in spans)  # the window end closed what was open


def test_exception_in_window_ends_open_spans_with_error() -> None:
    with pytest.raises(KeyError), CommDebugMode() as mode:
        mode.observer.on_module_enter(ModuleInfo("(root)", "MLP", "MLP"), "forward")
        mode.observer.on_op_enter("linear", [])
        raise KeyError("boom")
    spans = {s.name: s for s in mode.get_finished_spans()}
    assert spans["linear"].status.status_code is StatusCode.ERROR
    assert "boom" in spans["MLP"].status.description


def test_retention_cap_keeps_counts_exact() -> None:
    with CommDebugMode(max_spans=10) as mode:
        for _ in range(25):
            collective(mode.observer)
    assert len(mode.get_finished_spans()) == 10
    assert mode.get_dropped_record_count() == 15
    assert mode.get_total_counts() == 25


def test_clear_releases_records() -> None:
    with CommDebugMode() as mode:
        design_mlp_forward(mode.observer)
    assert mode.get_finished_spans()
    mode.clear()
    assert mode.get_finished_spans() == ()
    assert mode.get_comm_counts() == {} and mode.get_comm_module_counts() == {}


def test_live_and_deferred_spans_are_the_same_tree() -> None:
    trees = []
    for live in (True, False):
        with CommDebugMode(live_spans=live) as mode:
            design_mlp_forward(mode.observer)
        trees.append(_tree_names(mode))
    assert trees[0] == trees[1]


def test_faults_in_span_building_are_counted_and_logged_once(caplog, monkeypatch) -> None:
    from hp_otel.spans import codec

    def broken(*args, **kwargs):
        raise RuntimeError("injected")

    monkeypatch.setattr(codec, "encoded_op", broken)  # what the builder calls for every op
    caplog.set_level(logging.WARNING, logger="hp_otel")
    with CommDebugMode() as mode:
        design_mlp_forward(mode.observer)
        design_mlp_forward(mode.observer)
    assert mode.get_total_counts() == 2  # counting is unaffected
    spans = mode.get_finished_spans()
    assert mode.get_callback_error_counts() == {"span_build": 6}  # 3 ops x 2 passes
    assert {s.name for s in spans} >= {"MLP", "fc1", "fc2", "all_reduce"}
    assert len([r for r in caplog.records if "span_build" in r.getMessage()]) == 1


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"module": "model"}, "module must be a torch.nn.Module"),
        ({"max_spans": -1}, "max_spans"),
        ({"tracer_provider": object()}, "tracer_provider"),
        ({"meter_provider": 3}, "meter_provider"),
        ({"live_spans": "yes"}, "live_spans"),
    ],
)
def test_constructor_rejects_bad_arguments(kwargs: dict, error: str) -> None:
    with pytest.raises((TypeError, ValueError), match=error):
        CommDebugMode(**kwargs)


def test_repr_says_state_and_counts() -> None:
    mode = CommDebugMode()
    assert "inactive" in repr(mode)
    with mode:
        collective(mode.observer)
        assert "CommDebugMode(active" in repr(mode)
    assert "collectives=1" in repr(mode)


def test_durations_reach_the_histogram_at_collection_or_when_too_many_wait() -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from hp_otel.record.instruments import DeferredDurations

    reader = InMemoryMetricReader()
    histogram = MeterProvider(metric_readers=[reader]).get_meter("t").create_histogram("d")
    deferred = DeferredDurations(histogram, max_pending=4)

    def recorded() -> int:
        data = reader.get_metrics_data()
        points = (
            [
                p
                for rm in data.resource_metrics
                for sm in rm.scope_metrics
                for m in sm.metrics
                for p in m.data.data_points
            ]
            if data
            else []
        )
        return sum(p.count for p in points)

    deferred.add({"k": "v"}, [1_000, 2_000])
    assert recorded() == 0  # waiting: nothing called the SDK yet (this reader has no hp_otel callback)
    deferred.add({"k": "v"}, [3_000, 4_000])  # the fourth point: recorded now, memory stays bounded
    assert recorded() == 4
    deferred.add({"k": "v"}, [5_000])
    deferred.flush()  # what the calls counter's callback does at every collection
    assert recorded() == 5
