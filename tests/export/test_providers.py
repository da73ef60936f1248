"""A user's own tracer and meter providers receive hp_otel's spans and metrics (OTel TestBase)."""

from __future__ import annotations

import pytest
from events import design_mlp_forward
from opentelemetry import trace
from opentelemetry.test.test_base import TestBase

from hp_otel import CommDebugMode
from hp_otel.spans import schema

pytestmark = pytest.mark.torch_free  # needs no torch: not rerun on torch 2.14.1 (tests/support/markers.py)


class TestUserProviders(TestBase):
    def test_spans_reach_the_users_exporter_live_and_the_table_still_renders(self) -> None:
        live = CommDebugMode(tracer_provider=self.tracer_provider, meter_provider=self.meter_provider, live_spans=True)
        with live as mode:
            design_mlp_forward(mode.observer, modules=False)
            # live spans reach the user's processors as they end, inside the window
            assert {s.name for s in self.memory_exporter.get_finished_spans()} == {"linear", "gelu", "all_reduce"}
        users = self.memory_exporter.get_finished_spans()
        ours = mode.get_finished_spans()
        assert [s.context.span_id for s in users] == [s.context.span_id for s in ours]
        collective = next(s for s in users if s.name == "all_reduce")
        self.assertSpanHasAttributes(
            collective,
            {schema.COLLECTIVE_NAME: "differentiable_all_reduce", schema.COLLECTIVE_GROUP_SIZE: 2},
        )
        assert "Op(gelu)" in mode.generate_comm_debug_tracing_table()
        assert collective.instrumentation_scope.name == "hp_otel"

    def test_deferred_spans_reach_the_users_exporter_at_window_end(self) -> None:
        with CommDebugMode(tracer_provider=self.tracer_provider) as mode:  # the default: deferred
            design_mlp_forward(mode.observer, modules=False)
            assert self.memory_exporter.get_finished_spans() == ()  # nothing built inside the window
            assert trace.get_current_span() is trace.INVALID_SPAN  # no span of ours is ever current
        users = self.memory_exporter.get_finished_spans()
        assert {s.name for s in users} == {"linear", "gelu", "all_reduce"}
        assert [s.context.span_id for s in users] == [s.context.span_id for s in mode.get_finished_spans()]

    def test_spans_nest_under_the_users_current_span(self) -> None:
        tracer = self.tracer_provider.get_tracer("train")
        with tracer.start_as_current_span("step 7") as step:
            with CommDebugMode(tracer_provider=self.tracer_provider) as mode:
                design_mlp_forward(mode.observer, modules=False)
        ids = {s.name: s for s in self.memory_exporter.get_finished_spans()}
        assert ids["linear"].parent.span_id == step.get_span_context().span_id
        assert ids["all_reduce"].parent.span_id == ids["linear"].context.span_id
        assert trace.get_current_span() is trace.INVALID_SPAN  # the mode left the context as it found it

    def test_live_op_span_is_current_while_it_runs(self) -> None:
        with CommDebugMode(tracer_provider=self.tracer_provider, live_spans=True) as mode:
            mode.observer.on_op_enter("linear", [])
            current = trace.get_current_span()
            mode.observer.on_op_exit("linear", [])
            after = trace.get_current_span()
        assert current.name == "linear"  # type: ignore[attr-defined]
        assert after is trace.INVALID_SPAN

    def test_metrics_reach_the_users_reader(self) -> None:
        with CommDebugMode(meter_provider=self.meter_provider) as mode:
            design_mlp_forward(mode.observer)
        metrics = {m.name: m for m in self.get_sorted_metrics()}
        assert metrics[schema.METRIC_CALLS].data.data_points[0].value == 1
        assert metrics[schema.METRIC_CALLS].data.data_points[0].attributes[schema.MODULE_FQN] == "fc2"
        assert metrics[schema.METRIC_DURATION].data.data_points[0].count == 1
        assert mode.get_metric_reader() is None
