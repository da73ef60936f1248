"""What every training callback does (`StepTracer`), in one process on torch's fake group: a
window for each traced step and none for the others, one window across a step's micro-batches,
the hooks let go when a range is over, the instrumentor's session used when it is active (one
recording), bad settings refused when the callback is made, faults counted and logged once while
training goes on. Counts are checked against the suite's dispatch-mode referee."""

from __future__ import annotations

import contextlib
import logging
from collections import Counter

import pytest
import torch
import torch.distributed as dist
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from referee import Referee
from torch import nn

from hp_otel.always_on.instrumentation import SessionSettings
from hp_otel.always_on.instrumentor import HpOtelInstrumentor
from hp_otel.integrations.tracer import StepTracer
from hp_otel.mode import registry
from hp_otel.record import installation
from hp_otel.spans import schema
from hp_otel.testing import metric_points

ALL_REDUCE = "c10d.allreduce_"


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x)
        dist.all_reduce(y.detach().clone())
        return y


class _Run:
    """In-memory providers, a model, and the steps of a loop with a tracer in it."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.tracer_provider = TracerProvider(shutdown_on_exit=False)
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader], shutdown_on_exit=False)
        self.model = _Net()
        self.referee_counts: Counter[str] = Counter()

    def providers(self) -> dict:
        return {"tracer_provider": self.tracer_provider, "meter_provider": self.meter_provider}

    def train(self, tracer: StepTracer, steps: int, micro_batches: int = 1, refereed: set[int] = frozenset()) -> None:
        for n in range(steps):
            referee = Referee(self.model) if n in refereed else contextlib.nullcontext()
            with referee:
                for _ in range(micro_batches):
                    tracer.begin(n, self.model, rank=0)
                    self.model(torch.ones(2, 4)).sum().backward()
                tracer.end()
            if n in refereed:
                self.referee_counts.update(referee.counts)

    def steps(self) -> list[int]:
        return [
            s.attributes[schema.STEP]
            for s in self.exporter.get_finished_spans()
            if schema.is_rank_step_span(s.name, s.attributes)
        ]

    def calls(self) -> Counter[str]:
        counts: Counter[str] = Counter()
        for point in metric_points(self.reader, schema.METRIC_CALLS):
            counts[str(point.attributes[schema.COLLECTIVE_NAME])] += point.value
        return counts


@pytest.fixture
def run(fake_world) -> _Run:
    return _Run()


def test_a_range_traces_its_steps_then_lets_the_hooks_go(run) -> None:
    tracer = StepTracer(range(1, 3), **run.providers())
    kept_after: list[bool] = []
    for n in range(5):
        tracer.begin(n, run.model, rank=0)
        with Referee(run.model) if n in (1, 2) else contextlib.nullcontext() as referee:
            run.model(torch.ones(2, 4)).sum().backward()
        if referee is not None:
            run.referee_counts.update(referee.counts)
        tracer.end()
        kept_after.append(installation.keeping())
    assert run.steps() == [1, 2] == tracer.traced
    assert run.calls() == run.referee_counts == {ALL_REDUCE: 2}
    assert kept_after == [False, True, False, False, False]  # held between its windows, let go after the last
    assert tracer.faults == 0
    tracer.close()  # (its summary, captured)


def test_every_nth_step_and_one_window_across_micro_batches(run) -> None:
    tracer = StepTracer(2, **run.providers())
    run.train(tracer, steps=5, micro_batches=3, refereed={0, 2, 4})
    assert run.steps() == [0, 2, 4]
    assert run.calls() == run.referee_counts == {ALL_REDUCE: 9}  # 3 micro-batches, one window each step
    tracer.close()
    assert not installation.keeping()


def test_with_the_instrumentor_active_its_session_records_the_step_once(run, caplog) -> None:
    HpOtelInstrumentor().instrument(**run.providers())
    try:
        tracer = StepTracer(owner="test", stack=2)
        with caplog.at_level(logging.WARNING, logger="hp_otel"):
            run.train(tracer, steps=2, refereed={0, 1})
        tracer.close()
    finally:
        HpOtelInstrumentor().uninstrument()
    assert run.steps() == [0, 1]
    assert run.calls() == run.referee_counts == {ALL_REDUCE: 2}  # not twice
    warned = [r for r in caplog.records if "HpOtelInstrumentor is active" in r.getMessage()]
    assert len(warned) == 1 and "stack" in warned[0].getMessage()


def test_an_error_ends_the_step_marked_failed(run) -> None:
    tracer = StepTracer(**run.providers())
    tracer.begin(0, run.model, rank=0)
    tracer.close(RuntimeError("the step failed"))
    (rank_step,) = [s for s in run.exporter.get_finished_spans() if schema.is_rank_step_span(s.name, s.attributes)]
    assert rank_step.status.status_code is StatusCode.ERROR
    assert registry.current_mode.get() is None and not installation.keeping()


def test_faults_are_counted_and_logged_once_and_training_goes_on(run, monkeypatch, caplog) -> None:
    def broken(self):
        raise RuntimeError("no session today")

    monkeypatch.setattr(SessionSettings, "session", broken)
    tracer = StepTracer(**run.providers())
    with caplog.at_level(logging.WARNING, logger="hp_otel"):
        run.train(tracer, steps=3, refereed={0, 1, 2})
    assert tracer.faults == 3 and tracer.traced == []
    assert run.referee_counts == {ALL_REDUCE: 3}  # the steps ran
    assert len([r for r in caplog.records if "opening step" in r.getMessage()]) == 1


def test_a_fault_while_closing_leaves_no_window_open(run, caplog) -> None:
    tracer = StepTracer(**run.providers())
    tracer.begin(0, run.model, rank=0)
    tracer._open.callback(lambda: 1 / 0)  # runs first when the step closes
    with caplog.at_level(logging.WARNING, logger="hp_otel"):
        tracer.end()
    assert tracer.faults == 1 and "closing step 0" in caplog.text
    assert registry.current_mode.get() is None
    assert run.steps() == [0]
    tracer.close()


@pytest.mark.parametrize(
    ("settings", "error", "match"),
    [
        ({"stak": 2}, TypeError, r"unknown setting\(s\) stak; the settings are: tracer_provider, "),
        ({"stack": 99}, ValueError, r"stack must be True"),
        ({"metric_module_depth": "deep"}, ValueError, r"metric_module_depth must be"),
        ({"collective_hook": 3}, TypeError, r"collective_hook must be a callable"),
        ({"configure_export": "yes"}, ValueError, r"configure_export must be True or False"),
    ],
)
def test_a_bad_setting_is_refused_when_the_callback_is_made(settings, error, match) -> None:
    with pytest.raises(error, match=match):
        StepTracer(**settings)


class _TitanShapedTrainer:
    """torchtitan 0.3.0's loop, in shape (`Trainer.train`: `self.step += 1`, then `self.train_step(it)`;
    the model is `self.model_parts[0]`): not torchtitan, which this suite does not install."""

    def __init__(self, model: nn.Module, steps: int) -> None:
        self.model_parts = [model]
        self.steps = steps
        self.step = 0

    def train_step(self, data_iterator) -> None:
        self.model_parts[0](next(data_iterator)).sum().backward()

    def train(self) -> None:
        data = iter([torch.ones(2, 4)] * self.steps)
        while self.step < self.steps:
            self.step += 1
            self.train_step(data)


def test_the_torchtitan_recipe_wraps_train_step(run) -> None:
    """docs/guide/torchtitan.md's wrapping of `trainer.train_step`, on a loop of that shape; a failing
    step is closed, marked failed, and the error goes on to the loop."""
    trainer = _TitanShapedTrainer(run.model, steps=4)
    tracer = StepTracer(range(2, 4), **run.providers())
    train_step = trainer.train_step

    def traced_train_step(data_iterator) -> None:
        with tracer.step(trainer.step, trainer.model_parts[0]):
            train_step(data_iterator)

    trainer.train_step = traced_train_step
    with Referee(run.model) as referee:
        trainer.train()
    tracer.close()
    assert run.steps() == [2, 3]
    assert run.calls() == {ALL_REDUCE: 2} and referee.counts == {ALL_REDUCE: 4}  # 4 steps ran, 2 traced
    with pytest.raises(RuntimeError, match="step 2 failed"), tracer.step(2, run.model):
        raise RuntimeError("step 2 failed")
    failed = [s for s in run.exporter.get_finished_spans() if schema.is_rank_step_span(s.name, s.attributes)][-1]
    assert failed.status.status_code is StatusCode.ERROR and registry.current_mode.get() is None
    tracer.close()


# --- the summary at the end of training ------------------------------------------------


def test_by_default_rank_0_prints_the_traced_steps_collectives_per_op_and_where_they_went(run, capsys) -> None:
    tracer = StepTracer(range(1, 4), **run.providers())
    run.train(tracer, steps=5, refereed={1, 2, 3})
    tracer.close()
    lines = capsys.readouterr().err.splitlines()
    assert run.referee_counts == {ALL_REDUCE: 3}  # the referee: one all_reduce per traced step
    assert lines == [
        "hp_otel: StepTracer traced 3 steps (1..3) on rank 0: collectives per op all_reduce 3",
        "hp_otel: spans and metrics to the OpenTelemetry providers set by the program",
    ]


def test_with_nothing_configured_it_says_how_to_send_the_data(run, capsys, monkeypatch) -> None:
    from hp_otel.export import telemetry

    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_TRACES_EXPORTER", "OTEL_METRICS_EXPORTER",
                 "OTEL_EXPORTER_PROMETHEUS_PORT", "HP_OTEL_COLLECTIVES_DIR"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    tracer = StepTracer()  # as the docs' first example: no settings
    try:
        run.train(tracer, steps=2)
        tracer.close()
    finally:
        telemetry.shutdown()
    first, second = capsys.readouterr().err.splitlines()
    assert first == "hp_otel: StepTracer traced 2 steps (0..1) on rank 0: collectives per op all_reduce 2"
    assert second.startswith("hp_otel: nothing was exported; to see the traced steps set OTEL_TRACES_EXPORTER=console")


def test_the_summary_names_the_collectives_files_and_says_why_training_stopped(run, capsys, tmp_path) -> None:
    tracer = StepTracer(collectives_dir=str(tmp_path), **run.providers())
    run.train(tracer, steps=1)
    tracer.begin(1, run.model, rank=0)
    run.model(torch.ones(2, 4))
    tracer.close(ValueError("loss is nan"))
    first, second = capsys.readouterr().err.splitlines()
    assert first == (
        "hp_otel: StepTracer traced 2 steps (0..1) on rank 0 (training stopped: ValueError): "
        "collectives per op all_reduce 2"
    )
    assert second.endswith(f"the collectives of the last 4 sampled steps in {tmp_path / 'collectives-rank0.json'}")


def test_summary_false_and_other_ranks_print_nothing(run, capsys) -> None:
    quiet = StepTracer(summary=False, **run.providers())
    run.train(quiet, steps=1)
    quiet.close()
    other = StepTracer(**run.providers())
    other.begin(0, run.model, rank=1)
    other.close()
    assert capsys.readouterr().err == ""
    with pytest.raises(TypeError, match="summary must be True or False, got 'no'"):
        StepTracer(summary="no")


def test_the_integrations_package_exports_the_callbacks_without_importing_their_frameworks() -> None:
    import subprocess
    import sys

    code = (
        "import sys, hp_otel.integrations as i; "
        "print(sorted(i.__all__), 'lightning' in sys.modules, 'transformers' in sys.modules, i.StepTracer.__name__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out[:4] == ["['HpOtelCallback',", "'HpOtelTrainerCallback',", "'StepTracer',", "'StepWindow']"]
    assert out[4:] == ["False", "False", "StepTracer"]
    from hp_otel.integrations import HpOtelCallback, HpOtelTrainerCallback, StepWindow

    assert HpOtelCallback.__name__ == "HpOtelCallback" and HpOtelTrainerCallback.__name__ == "HpOtelTrainerCallback"
    assert StepWindow(2).steps == 2
