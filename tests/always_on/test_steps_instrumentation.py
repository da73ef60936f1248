"""One trace per step across ranks, and the always-on BaseInstrumentor (OTel TestBase)."""

from __future__ import annotations

import contextlib
import importlib.metadata

import pytest
from events import design_mlp_forward
from installed_metadata import write_dist_info
from opentelemetry import trace
from opentelemetry.instrumentation.utils import suppress_instrumentation
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.test.test_base import TestBase

import hp_otel
from hp_otel import CommDebugMode
from hp_otel.always_on.instrumentation import active_session
from hp_otel.always_on.instrumentor import HpOtelInstrumentor
from hp_otel.always_on.steps import step_ids
from hp_otel.spans import schema


def _rank_provider(sampler=None) -> tuple[TracerProvider, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=sampler, shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, exporter


def _run_rank(rank: int, provider: TracerProvider, steps=(0,)) -> None:
    for n in steps:
        with hp_otel.step(n, run_id="run-a", rank=rank, tracer_provider=provider):
            with CommDebugMode(tracer_provider=provider, live_spans=False) as mode:
                design_mlp_forward(mode.observer)


def test_two_ranks_share_the_trace_of_a_step_under_one_root_from_rank_0() -> None:
    (p0, e0), (p1, e1) = _rank_provider(), _rank_provider()
    _run_rank(0, p0)
    _run_rank(1, p1)
    trace_id, root_id = step_ids("run-a", 0)
    spans0, spans1 = e0.get_finished_spans(), e1.get_finished_spans()
    assert {s.context.trace_id for s in (*spans0, *spans1)} == {trace_id}
    roots = [s for s in (*spans0, *spans1) if s.parent is None]
    assert [(r.name, r.context.span_id, r.attributes[schema.STEP]) for r in roots] == [("step 0", root_id, 0)]
    for rank, spans in ((0, spans0), (1, spans1)):
        by_id = {s.context.span_id: s for s in spans}
        (rank_step,) = [s for s in spans if s.name == f"rank {rank}"]
        assert rank_step.parent.span_id == root_id and rank_step.attributes[schema.RESOURCE_RANK] == rank
        assert rank_step.parent.is_remote == (rank != 0)
        module_root = next(s for s in spans if s.attributes.get(schema.MODULE_FQN) == "(root)")
        assert by_id[module_root.parent.span_id] is rank_step  # hp_otel's spans nest under the rank's span


def test_steps_and_runs_get_different_traces() -> None:
    ids = {step_ids("run-a", n)[0] for n in range(100)} | {step_ids("run-b", 0)[0]}
    assert len(ids) == 101
    assert step_ids("run-a", "window-3") != step_ids("run-a", 3)


def test_ranks_take_the_same_sampling_decision_for_each_step() -> None:
    sampler = ParentBased(TraceIdRatioBased(0.5))
    (p0, e0), (p1, e1) = _rank_provider(sampler), _rank_provider(sampler)
    _run_rank(0, p0, range(40))
    _run_rank(1, p1, range(40))
    steps0 = {
        s.attributes[schema.STEP] for s in e0.get_finished_spans() if schema.is_rank_step_span(s.name, s.attributes)
    }
    steps1 = {
        s.attributes[schema.STEP] for s in e1.get_finished_spans() if schema.is_rank_step_span(s.name, s.attributes)
    }
    assert steps0 == steps1 and 5 < len(steps0) < 35  # the same half-ish of the steps on both ranks


def test_bad_step_arguments_are_rejected() -> None:
    with pytest.raises(TypeError, match="step must be an int or a non-empty str"):
        with hp_otel.step(1.5):  # type: ignore[arg-type]
            pass
    with pytest.raises(ValueError, match="rank must be a non-negative int"):
        with hp_otel.step(1, rank=-1):
            pass


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"step": 2**64},
            r"step must be a non-negative int of at most 2\*\*63 - 1 \(int64\) or a non-empty str, got 18446",
        ),
        ({"step": 2**63}, r"step must be a non-negative int of at most 2\*\*63 - 1"),
        ({"step": -1}, r"step must be a non-negative int .*, got -1"),
        ({"step": 1, "rank": 2**63}, r"rank must be a non-negative int of at most 2\*\*63 - 1 \(int64\) or None"),
        ({"step": 1, "rank": True}, r"rank must be a non-negative int .* or None, got True"),
    ],
)
def test_a_step_or_rank_no_exporter_can_encode_is_refused_by_name(kwargs, message) -> None:
    """Not accepted, then dropped by the OTLP exporter (`Failed to encode key hp_otel.step`, a traceback)."""
    with pytest.raises(ValueError, match=message):
        with hp_otel.step(**kwargs):
            pass


def test_the_largest_step_and_rank_reach_the_otlp_encoder_whole() -> None:
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    provider, exporter = _rank_provider()
    with hp_otel.step(2**63 - 1, run_id="run-a", rank=2**63 - 1, tracer_provider=provider):
        pass
    (span,) = encode_spans(exporter.get_finished_spans()).resource_spans[0].scope_spans[0].spans
    values = {a.key: a.value.int_value for a in span.attributes}
    assert values == {schema.STEP: 2**63 - 1, schema.RESOURCE_RANK: 2**63 - 1}


def test_the_instrumentor_is_registered_as_an_entry_point(tmp_path) -> None:
    # this checkout's pyproject.toml as pip installs it (the venv may hold another checkout's metadata)
    (dist,) = importlib.metadata.distributions(path=[str(write_dist_info(tmp_path))])
    (entry,) = [e for e in dist.entry_points if e.group == "opentelemetry_instrumentor" and e.name == "hp_otel"]
    assert entry.load() is HpOtelInstrumentor


class TestAlwaysOn(TestBase):
    def setUp(self) -> None:
        super().setUp()
        HpOtelInstrumentor().instrument(tracer_provider=self.tracer_provider, meter_provider=self.meter_provider)

    def tearDown(self) -> None:
        HpOtelInstrumentor().uninstrument()
        super().tearDown()

    def _calls(self) -> int:
        metrics = {m.name: m for m in self.get_sorted_metrics()}
        return sum(p.value for p in metrics[schema.METRIC_CALLS].data.data_points)

    def test_each_marked_step_is_recorded_with_the_callers_providers(self) -> None:
        from hp_otel.mode import registry

        for n in range(2):
            with hp_otel.step(n, run_id="r", rank=0) as spans:
                design_mlp_forward(registry.current_mode.get().observer)
                assert trace.get_current_span() is spans.rank_span
        finished = self.memory_exporter.get_finished_spans()
        steps = ("step 0", "step 1", "rank 0")
        assert sorted(s.name for s in finished if s.name in steps) == ["rank 0"] * 2 + ["step 0", "step 1"]
        collectives = [s for s in finished if s.name == "all_reduce"]
        assert {s.context.trace_id for s in collectives} == {step_ids("r", 0)[0], step_ids("r", 1)[0]}
        assert self._calls() == 2

    def test_unsampled_steps_count_but_build_no_spans(self) -> None:
        from hp_otel.mode import registry

        provider = TracerProvider(sampler=TraceIdRatioBased(0.0), shutdown_on_exit=False)
        provider.add_span_processor(SimpleSpanProcessor(self.memory_exporter))
        HpOtelInstrumentor().uninstrument()
        HpOtelInstrumentor().instrument(tracer_provider=provider, meter_provider=self.meter_provider)
        with hp_otel.step(0, run_id="r", rank=0) as spans:
            design_mlp_forward(registry.current_mode.get().observer)
        assert not spans.sampled
        assert self.memory_exporter.get_finished_spans() == ()
        assert self._calls() == 1

    def test_a_suppressed_step_is_not_recorded(self) -> None:
        from hp_otel.mode import registry

        with suppress_instrumentation(), hp_otel.step(0, run_id="r", rank=0):
            assert registry.current_mode.get() is None
        assert self.memory_exporter.get_finished_spans() == ()

    def test_the_instrumentor_refuses_a_step_out_of_range_too(self) -> None:
        for suppressed in (False, True):  # suppressed, the session once made its step spans unchecked
            with suppress_instrumentation() if suppressed else contextlib.nullcontext():
                with pytest.raises(ValueError, match=r"step must be a non-negative int of at most 2\*\*63 - 1"):
                    with hp_otel.step(2**64, run_id="r", rank=0):
                        pass
        assert self.memory_exporter.get_finished_spans() == ()

    def test_without_marked_steps_optimizer_steps_delimit_them(self) -> None:
        import torch

        from hp_otel.mode import registry

        session = active_session()
        assert session is not None
        param = torch.nn.Parameter(torch.ones(2))
        optimizer = torch.optim.SGD([param], lr=0.1)
        for _ in range(3):
            current = registry.current_mode.get()
            if current is not None:
                design_mlp_forward(current.observer)
            param.grad = torch.ones(2)
            optimizer.step()
        HpOtelInstrumentor().uninstrument()  # closes the open step
        assert registry.current_mode.get() is None
        rank_steps = [
            s for s in self.memory_exporter.get_finished_spans() if schema.is_rank_step_span(s.name, s.attributes)
        ]
        assert sorted(s.attributes[schema.STEP] for s in rank_steps) == [0, 1, 2]
        assert self._calls() == 2  # the window before the first optimizer.step() is not recorded
        HpOtelInstrumentor().instrument(tracer_provider=self.tracer_provider, meter_provider=self.meter_provider)
