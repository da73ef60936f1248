"""Which training steps a callback traces: every step, every N-th, or a range of steps.

One rule for every callback, so `steps=` means the same in Lightning and in the Hugging Face
`Trainer`. Steps are numbered from 0 as the framework counts optimizer steps (Lightning's
`trainer.global_step`, the `Trainer`'s `state.global_step` when the step begins).
"""

from __future__ import annotations

from typing import Any

_ALLOWED = (
    "None (every step), an int N >= 1 (every N-th step: 0, N, 2N, ...) or a range of steps "
    "with start >= 0 and step >= 1 (range(10, 20), range(0, 1000, 100))"
)


class StepWindow:
    """The steps to trace; `step in window`. `steps`: None, N, or a `range` (see `_ALLOWED`)."""

    def __init__(self, steps: int | range | None = None) -> None:
        self.steps = _checked(steps)

    def __contains__(self, step: object) -> bool:
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            return False
        steps = self.steps
        if steps is None:
            return True
        if isinstance(steps, int):
            return step % steps == 0
        return step in steps

    def finished(self, step: int) -> bool:
        """True when no step from `step` on is traced (past the range's end): hooks can go."""
        return isinstance(self.steps, range) and step > self.steps[-1]

    def __repr__(self) -> str:
        return f"StepWindow({self.steps!r})"


def _checked(steps: Any) -> int | range | None:
    if steps is None:
        return None
    if isinstance(steps, int) and not isinstance(steps, bool):
        if steps < 1:
            raise ValueError(f"steps must be {_ALLOWED}; got {steps!r}")
        return steps
    if isinstance(steps, range):
        if steps.start < 0 or steps.step < 1:
            raise ValueError(f"steps must be {_ALLOWED}; got {steps!r}")
        if not steps:
            raise ValueError(f"steps={steps!r} holds no step; steps must be {_ALLOWED}")
        return steps
    raise TypeError(f"steps must be {_ALLOWED}; got {type(steps).__name__} {steps!r}")
