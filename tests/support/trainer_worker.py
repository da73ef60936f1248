"""One rank of the Hugging Face `Trainer` proof (run by torchrun, 2 gloo ranks): a tiny Llama built
from a config (no download) trained 6 optimizer steps of 2 micro-batches each (DDP, gradient
accumulation) with `HpOtelTrainerCallback(steps=2)` and the test's referee windows over the same
steps. Writes `trainer_rank<R>.json` into the folder argv[1]."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import torch
from callback_referee import RefereeWindows, in_memory_providers, write_result
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments

from hp_otel.integrations.transformers import HpOtelTrainerCallback

STEPS = 6
EVERY = 2  # steps 0, 2, 4
VOCAB, SEQ = 64, 8


class _Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        self.ids = torch.randint(0, VOCAB, (n, SEQ), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class RefereeCallback(TrainerCallback):
    """The test's own windows: a referee from each listed step's begin to its end."""

    def __init__(self, windows: RefereeWindows) -> None:
        self.windows = windows

    def on_step_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        self.windows.begin(state.global_step, model)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.windows.end()


def main(out_dir: str) -> None:
    rank = int(os.environ["RANK"])
    torch.manual_seed(0)
    exporter, tracer_provider, reader, meter_provider = in_memory_providers(rank)
    callback = HpOtelTrainerCallback(
        steps=EVERY, tracer_provider=tracer_provider, meter_provider=meter_provider, metric_module_depth="full"
    )
    referee = RefereeWindows(set(range(0, STEPS, EVERY)))
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=SEQ,
    )
    args = TrainingArguments(
        output_dir=os.path.join(out_dir, "trainer"),
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        max_steps=STEPS,
        use_cpu=True,
        ddp_backend="gloo",
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    trainer = Trainer(
        model=LlamaForCausalLM(config),
        args=args,
        train_dataset=_Tokens(64),
        callbacks=[RefereeCallback(referee), callback],
    )
    trainer.train()
    write_result(Path(out_dir) / f"trainer_rank{rank}.json", rank, referee, exporter, reader, callback.faults)


if __name__ == "__main__":
    main(sys.argv[1])
