"""`HpOtelCallback` in a real Lightning `Trainer` in this process (one device, torch's fake group for
the model's all_reduce): a step is an optimizer step, so with `accumulate_grad_batches=2` one window
holds both micro-batches; the steps traced and the collectives counted equal the referee's, which a
callback of the test's own enters over its own list of steps. (2 gloo ranks under DDP:
test_callbacks_gloo.py.)"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

import lightning.pytorch as pl
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
from torch.utils.data import DataLoader, TensorDataset

from hp_otel.always_on.instrumentation import SessionSettings
from hp_otel.integrations.lightning import HpOtelCallback
from hp_otel.mode import registry
from hp_otel.record import installation
from hp_otel.spans import schema
from hp_otel.testing import metric_points

pytestmark = [
    pytest.mark.filterwarnings("ignore::UserWarning"),  # Lightning's advice on workers and logging
    pytest.mark.filterwarnings("ignore:`isinstance\\(treespec, LeafSpec\\)` is deprecated"),  # Lightning on torch 2.13
]


class _Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        (x,) = batch
        y = self.fc(x)
        dist.all_reduce(y.detach().clone())  # the fake group's: returns at once
        return y.pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class _RefereeCallback(pl.Callback):
    """A referee from the first micro-batch of each listed step to the batch where the optimizer stepped."""

    def __init__(self, steps: set[int]) -> None:
        self.steps = steps
        self.counts: Counter[str] = Counter()
        self.batches: dict[int, int] = {}
        self._open: tuple[int, Referee] | None = None

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        step = trainer.global_step
        if step in self.steps:
            self.batches[step] = self.batches.get(step, 0) + 1
            if self._open is None:
                self._open = (step, Referee(pl_module).__enter__())

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self._open is not None and trainer.global_step > self._open[0]:
            referee = self._open[1]
            referee.__exit__(None, None, None)
            self.counts.update(referee.counts)
            self._open = None


def _trainer(tmp_path, callbacks: list, max_steps: int = 5) -> pl.Trainer:
    return pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=max_steps,
        accumulate_grad_batches=2,
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )


def _data() -> DataLoader:
    return DataLoader(TensorDataset(torch.randn(40, 4)), batch_size=2)


def test_a_window_holds_every_micro_batch_of_its_step(fake_world, tmp_path, capsys) -> None:
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider(shutdown_on_exit=False)
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    callback = HpOtelCallback(
        steps=range(1, 4, 2),
        tracer_provider=tracer_provider,
        meter_provider=MeterProvider(metric_readers=[reader], shutdown_on_exit=False),
    )
    referee = _RefereeCallback({1, 3})
    _trainer(tmp_path, [referee, callback]).fit(_Tiny(), _data())
    spans = exporter.get_finished_spans()
    assert [s.attributes[schema.STEP] for s in spans if schema.is_rank_step_span(s.name, s.attributes)] == [1, 3]
    assert referee.batches == {1: 2, 3: 2}  # two micro-batches a step
    calls = Counter()
    for point in metric_points(reader, schema.METRIC_CALLS):
        calls[point.attributes[schema.COLLECTIVE_NAME]] += point.value
    assert calls == referee.counts == {"c10d.allreduce_": 4}
    assert callback.faults == 0 and not installation.keeping()
    # at the end of fit, by default: the traced steps' collectives per op (the referee's), where they went
    assert capsys.readouterr().err.splitlines()[-2:] == [
        "hp_otel: HpOtelCallback traced 2 steps (1..3) on rank 0: collectives per op all_reduce 4",
        "hp_otel: spans and metrics to the OpenTelemetry providers set by the program",
    ]


def test_a_fault_in_the_callback_never_stops_training(fake_world, tmp_path, monkeypatch, caplog) -> None:
    """Every traced step fails to open its window: training runs all its steps, the faults are
    counted, and the log says so once."""

    def broken(self):
        raise RuntimeError("no session today")

    monkeypatch.setattr(SessionSettings, "session", broken)
    callback = HpOtelCallback(steps=None)
    trainer = _trainer(tmp_path, [callback], max_steps=3)
    with caplog.at_level(logging.WARNING, logger="hp_otel"):
        trainer.fit(_Tiny(), _data())
    assert trainer.global_step == 3
    assert callback.faults == 3 * 2  # each micro-batch tries to open its step's window
    assert len([r for r in caplog.records if "HpOtelCallback: opening step" in r.getMessage()]) == 1


class _FailsAtStep2(_Tiny):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.trainer.global_step == 2:
            raise RuntimeError("step 2 failed")
        return super().training_step(batch, batch_idx)


def test_a_step_that_raises_is_closed_marked_failed(fake_world, tmp_path, capsys) -> None:
    """Lightning's `on_exception` closes the open step: its `rank_step` span carries the error, and no
    window or hook of hp_otel's is left behind; the error reaches the caller."""
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider(shutdown_on_exit=False)
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    callback = HpOtelCallback(tracer_provider=tracer_provider, meter_provider=MeterProvider(shutdown_on_exit=False))
    with pytest.raises(RuntimeError, match="step 2 failed"):
        _trainer(tmp_path, [callback]).fit(_FailsAtStep2(), _data())
    rank_steps = {
        s.attributes[schema.STEP]: s
        for s in exporter.get_finished_spans()
        if schema.is_rank_step_span(s.name, s.attributes)
    }
    assert sorted(rank_steps) == [0, 1, 2]
    statuses = [rank_steps[n].status.status_code for n in (0, 1, 2)]
    assert statuses == [StatusCode.UNSET, StatusCode.UNSET, StatusCode.ERROR]
    assert registry.current_mode.get() is None and not installation.keeping() and callback.faults == 0
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("hp_otel: HpOtelCallback")]
    assert said == [  # on the exception too; each step's window holds its 2 micro-batches' all_reduces
        "hp_otel: HpOtelCallback traced 3 steps (0..2) on rank 0 (training stopped: RuntimeError): "
        "collectives per op all_reduce 4"
    ]
