"""A Hugging Face `TrainerCallback` that traces a window of training steps with hp_otel.

```
from hp_otel.integrations.transformers import HpOtelTrainerCallback

trainer = Trainer(model=model, args=args, callbacks=[HpOtelTrainerCallback(steps=10)], ...)
```

A step is one optimizer step, numbered by `state.global_step` when it begins: the window opens at
`on_step_begin` (the first micro-batch) and closes at `on_step_end` (after `optimizer.step()`), so
it holds every micro-batch of a gradient-accumulation step. The `Trainer` gathers the step's token
count (`average_tokens_across_devices`) before `on_step_begin`, and logs (an all_gather of the
loss) after `on_step_end`: those collectives are outside the window. Collectives are attributed
to the modules of the model the callback is handed (the unwrapped one).
"""

from __future__ import annotations

from typing import Any

from hp_otel.integrations.tracer import StepTracer

try:
    from transformers import TrainerCallback
except ImportError as exc:
    raise ImportError("hp_otel.integrations.transformers needs transformers: pip install transformers") from exc


class HpOtelTrainerCallback(TrainerCallback):  # type: ignore[misc]
    """Traces the steps `steps` selects (None: every step, N: every N-th, a `range`: those steps).

    The other keyword arguments are `HpOtelInstrumentor.instrument()`'s settings (`tracer_provider`,
    `meter_provider`, `collective_hook`, `stack`, `metric_module_depth`, `collectives_dir`, ...);
    with the instrumentor active its own settings apply. `faults`: faults caught (training went on).
    `summary`: at the end of training rank 0 prints the traced steps' collectives per op and where the
    data went (`StepTracer`; the `Trainer` has no exception callback: a run that dies prints it at exit);
    False turns it off.
    """

    def __init__(self, steps: int | range | None = None, *, summary: bool = True, **settings: Any) -> None:
        self.tracer = StepTracer(steps, owner=type(self).__name__, summary=summary, **settings)

    @property
    def faults(self) -> int:
        return self.tracer.faults

    def on_step_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        self.tracer.begin(state.global_step, model, args.process_index)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.tracer.end()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.tracer.close()
