"""What a training callback does, framework-free: one hp_otel step window per traced step.

A callback calls `begin(step, model)` where its framework starts a step and `end()` where the
optimizer has stepped (a loop of your own: `with tracer.step(n, model):`); `StepTracer` decides
whether the step is traced (`window.StepWindow`), and records it as `hp_otel.step(n, module=model)`
does under the always-on instrumentor: the step's spans share one trace across ranks, its
collectives are counted (spans when sampled). With `HpOtelInstrumentor` active, the step goes
through `hp_otel.step()` to its session (one recording, the instrumentor's settings); otherwise
through a session of the tracer's own, made from the same settings (`SessionSettings`), whose
hooks stay installed while steps remain.

Never breaks training: a fault here is counted in `faults` and logged once; the step goes on
unrecorded. A bad setting or `steps=` raises when the callback is made, before training.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import sys
from collections import Counter
from collections.abc import Iterator
from typing import Any

from hp_otel.always_on import destinations
from hp_otel.always_on import steps as step_spans
from hp_otel.always_on.instrumentation import SessionSettings, StepSession, active_session
from hp_otel.integrations.window import StepWindow
from hp_otel.record import installation

logger = logging.getLogger("hp_otel")


class StepTracer:
    """Opens and closes the windows of the traced steps for one callback (or one loop of your own).

    `steps`: None (every step), N (every N-th), a `range`; `settings`: `HpOtelInstrumentor.instrument()`'s
    (`tracer_provider`, `meter_provider`, `stack`, `metric_module_depth`, `collectives_dir`, ...);
    `owner`: the name in log lines. `summary`: at `close()` (the end of training, or an exception),
    rank 0 prints two lines to stderr: the traced steps' collectives per op, and where the data went
    (or how to send it somewhere); False: nothing printed.
    """

    def __init__(
        self, steps: int | range | None = None, *, owner: str = "StepTracer", summary: bool = True, **settings: Any
    ) -> None:
        if not isinstance(summary, bool):
            raise TypeError(f"summary must be True or False, got {summary!r}")
        self.owner = owner
        self.summary = summary
        self.counts: Counter[str] = Counter()  # the traced steps' collectives per normalised op (this rank)
        self.rank: int | None = None  # as the framework gave it at the last begin()
        self._counting: tuple[Any, Counter[str]] | None = None  # (the step's session, its counts before the step)
        self._recorded_by: Any = None  # the session of the last traced step (where its data went)
        self._to_summarise = False
        self.window = StepWindow(steps)
        self._given = settings
        self.settings = SessionSettings.checked(self._given, strict=True)
        self.faults = 0  # faults caught here (the step went on unrecorded)
        self.traced: list[int] = []  # the steps whose windows opened, in order
        self.current: int | None = None  # the step whose window is open
        self._open: contextlib.ExitStack | None = None
        self._session: StepSession | None = None
        self._holder = f"{owner} {id(self):x}"  # keeps hooks installed between this tracer's windows
        self._warned_instrumented = False

    @property
    def is_open(self) -> bool:
        return self._open is not None

    def begin(self, step: int, model: Any = None, rank: int | None = None) -> None:
        """The framework starts step `step`: open its window if it is traced and none is open."""
        if self._open is not None:  # still the step that began earlier (gradient accumulation)
            return
        if step not in self.window:
            if self.window.finished(step):
                self._let_hooks_go()
            return
        if rank is not None:
            self.rank = rank
        stack = contextlib.ExitStack()
        try:
            stack.enter_context(self._step(step, model, rank))
        except Exception as exc:  # never break training
            stack.close()
            self._fault(f"opening step {step}", exc)
            return
        self._open, self.current = stack, step
        self.traced.append(step)
        if not self._to_summarise:
            self._to_summarise = True
            atexit.register(self._at_exit)  # a loop that dies without close() (the Trainer on an exception)

    def end(self, error: BaseException | None = None) -> None:
        """The step's optimizer has stepped (or it failed with `error`): close its window."""
        stack, self._open = self._open, None
        if stack is None:
            return
        step, self.current = self.current, None
        try:
            if error is None:
                stack.close()
            else:
                stack.__exit__(type(error), error, error.__traceback__)  # the step's spans say it failed
        except Exception as exc:  # never break training
            if exc is not error:
                self._fault(f"closing step {step}", exc)
        if self._counting is not None:
            session, before = self._counting
            self._counting = None
            self.counts.update(session.op_counts - before)
        if step is not None and self.window.finished(step + 1):
            self._let_hooks_go()

    @contextlib.contextmanager
    def step(self, step: int, model: Any = None, rank: int | None = None) -> Iterator[None]:
        """`begin()` and `end()` around a block: a training loop of your own (torchtitan's `train_step`)."""
        self.begin(step, model, rank)
        try:
            yield
        except BaseException as exc:
            self.end(exc)
            raise
        self.end()

    def close(self, error: BaseException | None = None) -> None:
        """Training ended (with `error`): close an open window, print the summary, remove what stayed installed."""
        self._close(error, type(error).__name__ if error is not None else None)

    def _close(self, error: BaseException | None, stopped: str | None) -> None:
        self.end(error)
        if self._to_summarise:
            self._to_summarise = False
            atexit.unregister(self._at_exit)
            if self.summary and (self.rank or 0) == 0:
                try:
                    print(*self.summary_lines(stopped), sep="\n", file=sys.stderr, flush=True)
                except Exception as exc:  # never break training
                    self._fault("the summary", exc)
        self._let_hooks_go()

    def summary_lines(self, stopped: str | None = None) -> list[str]:
        """What `close()` prints: the traced steps' collectives per op (`stopped`: why training stopped),
        and where the data went (or how to send it)."""
        traced = self.traced
        steps = f"{len(traced)} step{'s' if len(traced) != 1 else ''}"
        if traced:
            steps += f" ({traced[0]}..{traced[-1]})" if len(traced) > 1 else f" ({traced[0]})"
        ops = ", ".join(f"{op} {n}" for op, n in sorted(self.counts.items(), key=lambda item: (-item[1], item[0])))
        first = f"hp_otel: {self.owner} traced {steps} on rank {self.rank or 0}"
        first += f" (training stopped: {stopped}): " if stopped else ": "
        first += f"collectives per op {ops}" if ops else "no collective"
        session = self._recorded_by
        where = destinations.where_it_went(session) if session is not None else destinations.HOW_TO_SEND
        return [first, f"hp_otel: {where}"]

    def _at_exit(self) -> None:
        """The process exits and `close()` never came (the `Trainer` has no exception callback)."""
        inside = self._open is not None
        self._close(None, "the process exited inside a traced step" if inside else None)

    def _step(self, step: int, model: Any, rank: int | None) -> contextlib.AbstractContextManager[Any]:
        if active_session() is not None:  # the instrumentor records every marked step itself
            if self._given and not self._warned_instrumented:
                self._warned_instrumented = True
                logger.warning(
                    "hp_otel: %s: HpOtelInstrumentor is active, so its settings apply; the callback's (%s) are unused",
                    self.owner,
                    ", ".join(sorted(self._given)),
                )
            session = self._recorded_by = active_session()
            self._counting = (session, Counter(session.op_counts)) if session is not None else None
            return step_spans.step(step, rank=rank, module=model)
        if self._session is None:
            self._session = self.settings.session()
            installation.hold(self._holder)
        self._recorded_by = self._session
        self._counting = (self._session, Counter(self._session.op_counts))
        return self._session.explicit_step(step, run_id=None, rank=rank, module=model)

    def _let_hooks_go(self) -> None:
        if self._session is not None:
            self._session = None
            installation.release(self._holder)

    def _fault(self, where: str, exc: BaseException) -> None:
        self.faults += 1
        if self.faults == 1:
            logger.warning(
                "hp_otel: %s: %s failed; the step is not recorded (logged once)", self.owner, where, exc_info=exc
            )
