"""A Lightning `Callback` that traces a window of training steps with hp_otel.

```
from hp_otel.integrations.lightning import HpOtelCallback

trainer = Trainer(callbacks=[HpOtelCallback(steps=range(100, 110))], ...)
```

A step is one optimizer step, numbered by `trainer.global_step`: the window opens at
`on_train_batch_start` and closes at the first `on_train_batch_end` after the optimizer stepped,
so with gradient accumulation it holds every micro-batch of the step. Automatic optimization runs
forward and backward inside `optimizer.step(closure)`; the backward there counts as phase
backward for the modules whose autograd nodes ran (`docs/attribution.md`). Collectives are
attributed to the modules of the `LightningModule`. Needs `lightning` (`lightning.pytorch`), or
the standalone `pytorch_lightning` when `lightning` is not installed.
"""

from __future__ import annotations

from typing import Any

from hp_otel.integrations.tracer import StepTracer

try:
    from lightning.pytorch import Callback
except ImportError:  # the standalone package
    try:
        from pytorch_lightning import Callback
    except ImportError as exc:
        raise ImportError(
            "hp_otel.integrations.lightning needs Lightning: pip install lightning (or pytorch_lightning)"
        ) from exc


class HpOtelCallback(Callback):  # type: ignore[misc]
    """Traces the steps `steps` selects (None: every step, N: every N-th, a `range`: those steps).

    The other keyword arguments are `HpOtelInstrumentor.instrument()`'s settings (`tracer_provider`,
    `meter_provider`, `collective_hook`, `stack`, `metric_module_depth`, `collectives_dir`, ...);
    with the instrumentor active its own settings apply. `faults`: faults caught (training went on).
    `summary`: at the end of fit (or on an exception) rank 0 prints the traced steps' collectives per
    op and where the data went (`StepTracer`); False turns it off.
    """

    def __init__(self, steps: int | range | None = None, *, summary: bool = True, **settings: Any) -> None:
        super().__init__()
        self.tracer = StepTracer(steps, owner=type(self).__name__, summary=summary, **settings)

    @property
    def faults(self) -> int:
        return self.tracer.faults

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.tracer.begin(trainer.global_step, pl_module, trainer.global_rank)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        step = self.tracer.current
        if step is not None and trainer.global_step > step:  # the optimizer stepped: the step is over
            self.tracer.end()

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self.tracer.end()  # a step cut short (a hook returned -1 to end the epoch)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.tracer.close()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self.tracer.close(exception)
