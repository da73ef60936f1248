"""One rank of the Lightning DDP proof (run by torchrun, 2 gloo ranks): a tiny LightningModule whose
forward all-reduces an activation and whose `sync` layer all-reduces its gradient in backward,
trained 6 steps by a real `Trainer` with `HpOtelCallback(steps=...)` and the test's referee windows
over the same steps. Writes `lightning_rank<R>.json` into the folder argv[1]."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from callback_referee import RefereeWindows, write_result
from lightning.pytorch.strategies import DDPStrategy
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from hp_otel.integrations.lightning import HpOtelCallback

STEPS = 6
TRACED = range(2, 6)  # after DDP's bucket rebuild in the second step


class _SyncGrad(torch.autograd.Function):
    """Identity forward; its backward all-reduces the gradient (runs inside optimizer.step(closure))."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


class _Sync(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _SyncGrad.apply(x)


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 8)
        self.sync = _Sync()
        self.fc2 = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc2(self.sync(torch.relu(self.fc1(x))))
        dist.all_reduce(y.detach().clone())  # a forward collective inside the closure
        return y


class TinyModule(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = _Net()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        (x,) = batch
        return self(x).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class RefereeCallback(pl.Callback):
    """The test's own windows: a referee from each listed step's batch start to its batch end."""

    def __init__(self, windows: RefereeWindows) -> None:
        self.windows = windows

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.windows.begin(trainer.global_step, pl_module)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.windows.end()


def main(out_dir: str) -> None:
    torch.manual_seed(0)
    exporter = InMemorySpanExporter()
    resource = Resource.create({"hp.rank": int(os.environ["RANK"])})  # torchrun's
    tracer_provider = TracerProvider(resource=resource, shutdown_on_exit=False)
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader], resource=resource, shutdown_on_exit=False)
    callback = HpOtelCallback(
        steps=TRACED, tracer_provider=tracer_provider, meter_provider=meter_provider, metric_module_depth="full"
    )
    referee = RefereeWindows(set(TRACED))
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=DDPStrategy(process_group_backend="gloo"),
        max_steps=STEPS,
        callbacks=[RefereeCallback(referee), callback],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    data = TensorDataset(torch.randn(64, 8))
    trainer.fit(TinyModule(), DataLoader(data, batch_size=4))
    rank = trainer.global_rank
    write_result(Path(out_dir) / f"lightning_rank{rank}.json", rank, referee, exporter, reader, callback.faults)


if __name__ == "__main__":
    main(sys.argv[1])
