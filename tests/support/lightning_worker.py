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
from callback_referee import RefereeWindows, in_memory_providers, write_result
from lightning.pytorch.strategies import DDPStrategy
from sync_net import SyncNet
from torch.utils.data import DataLoader, TensorDataset

from hp_otel.integrations.lightning import HpOtelCallback

STEPS = 6
TRACED = range(2, 6)  # after DDP's bucket rebuild in the second step


class TinyModule(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = SyncNet()

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
    exporter, tracer_provider, reader, meter_provider = in_memory_providers(int(os.environ["RANK"]))  # torchrun's
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
