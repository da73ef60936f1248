"""`python -m benchmarks --pieces`: what each part of tracing costs a step, measured one by one.

Each variant adds one piece to the one before it, so the difference between
neighbours is that piece's cost; all run interleaved on the same step:

    untraced                       the step alone (hp_otel's kernels registered: they
                                     pass straight through)
    hooks kept, no window          module hooks and wrappers kept (`hp_otel.install()`),
                                     no window open: the idle cost between windows
    empty counting window          + a counts-only window per step, no module
                                     (window enter/exit, collective counting)
    + module forward hooks         + module attribution (counts-only, `module=`)
    + spans, no ops                + span events: modules, grad hooks for backward
                                     spans, redistributes, collectives (`ops=False`)
    + op mode                      + the function mode and op events (everything)
    + install per window           the same, hooks installed and removed each window
                                     (no `hp_otel.install()`)
    bare no-op function mode       torch's cost of any TorchFunctionMode, for scale
"""

from __future__ import annotations

import contextlib
import gc
import random
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from hp_otel.cli.progress import Progress, quiet

Variant = Callable[[], contextlib.AbstractContextManager[Any]]


@dataclass(frozen=True)
class Piece:
    make_ctx: Variant  # the context each timed step runs in
    keep: bool = True  # hooks kept between windows (`hp_otel.install()`) while it runs
    warm: Variant | None = None  # the context of the untimed first step (default: make_ctx)


def piece_variants(model: Any) -> dict[str, Piece]:
    """The variants, in the order their costs add up."""
    from torch.overrides import TorchFunctionMode

    from hp_otel import CommDebugMode

    class _NoOpFunctionMode(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            return func(*args, **(kwargs or {}))

    return {
        "untraced": Piece(contextlib.nullcontext, keep=False),
        "hooks kept, no window": Piece(contextlib.nullcontext, warm=lambda: CommDebugMode(module=model)),
        "empty counting window": Piece(lambda: CommDebugMode(record_spans=False)),
        "+ module forward hooks": Piece(lambda: CommDebugMode(module=model, record_spans=False)),
        "+ spans, no ops": Piece(lambda: CommDebugMode(module=model, ops=False)),
        "+ op mode": Piece(lambda: CommDebugMode(module=model)),
        "+ install per window": Piece(lambda: CommDebugMode(module=model), keep=False),
        "bare no-op function mode": Piece(_NoOpFunctionMode, keep=False),
    }


@contextlib.contextmanager
def _kept(keep: bool) -> Iterator[None]:
    import hp_otel

    if keep:
        hp_otel.install()
    try:
        yield
    finally:
        hp_otel.uninstall()


def _time(step: Callable[[], Any], piece: Piece, steps: int) -> float:
    with _kept(piece.keep):
        with (piece.warm or piece.make_ctx)():  # the first window of a block installs what later ones reuse
            step()
        gc.collect()
        samples = []
        for _ in range(steps):
            t0 = time.perf_counter()
            with piece.make_ctx():
                step()
            samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1e6


def run_pieces(model: Any, step: Callable[[], Any], rounds: int = 11, steps: int = 20) -> dict[str, list[float]]:
    """Per-round median µs per step of every variant, rounds interleaved in shuffled order."""
    from hp_otel import CommDebugMode

    with CommDebugMode(module=model):  # registers the kernels: every variant after runs with them
        step()
    variants = piece_variants(model)
    per_round: dict[str, list[float]] = {name: [] for name in variants}
    order = list(variants)
    shuffle = random.Random(0).shuffle
    for _ in range(rounds):
        shuffle(order)
        for name in order:
            per_round[name].append(_time(step, variants[name], steps))
    return per_round


def format_pieces(per_round: dict[str, list[float]]) -> Iterator[str]:
    """One line per variant: median µs, median per-round ratio with its interquartile range,
    and the piece: the median over rounds of (this variant − the line above) in the same
    round, so a slow spell of the machine moves both sides of each difference."""
    from benchmarks.timing import _quartiles

    base = per_round["untraced"]
    yield f"{'variant':<32}{'µs/step':>9}{'ratio':>8}  {'IQR of ratios':<14}{'piece µs':>9}"
    previous: list[float] | None = None
    for name, values in per_round.items():
        ratios = [v / b for v, b in zip(values, base, strict=True)]
        low, high = _quartiles(ratios)
        piece = ""
        if previous is not None and not name.startswith("bare"):
            piece = f"{statistics.median(v - p for v, p in zip(values, previous, strict=True)):+9.0f}"
        spread = f"{low:.2f}–{high:.2f}"
        yield f"{name:<32}{statistics.median(values):>9.0f}{statistics.median(ratios):>7.2f}x  {spread:<14}{piece}"
        if not name.startswith("bare"):
            previous = values


def main(model_name: str, rounds: int | None, steps: int | None, progress: Progress = quiet) -> str:
    """`python -m benchmarks --pieces --model NAME` (every workload for "all", a group's): the tables, with the load."""
    import os

    from benchmarks.timing import load_warning
    from benchmarks.workloads import build_workload, workload_names

    tables = []
    for name in workload_names(model_name):
        workload = build_workload(name)
        rounds_, steps_ = rounds or workload.rounds, steps or workload.steps
        progress(f"{name}: {len(piece_variants(workload.model))} variants x {rounds_} rounds x {steps_} steps")
        start = os.getloadavg()[0]
        per_round = run_pieces(workload.model, workload.step, rounds_, steps_)
        lines = [f"== {name}: {workload.summary}", *format_pieces(per_round)]
        lines.append(f"1-minute load average: {start:.2f} at start, {os.getloadavg()[0]:.2f} at end")
        warning = load_warning()
        if warning:
            lines.append(warning)
        tables.append("\n".join(lines))
    return "\n\n".join(tables)
