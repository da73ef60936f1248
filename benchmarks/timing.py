"""`python -m benchmarks`: what tracing costs a training step, against torch's own tools.

Variants (variants.py) of a workload's step (workloads.py) run interleaved,
round after round in shuffled order, each timed block after `gc.collect()`. The ratio
to untraced is the median of per-round ratios (each round's variant time over that
round's untraced time), so a slow spell of the machine moves both sides of a ratio
instead of one variant; the interquartile range of those ratios says how steady it was. With `instructions`, each
variant's instructions per step under callgrind are counted too (instructions.py):
the figure that stays put when the machine is loaded. Workloads of one family (the llama's
sizes, with and without TP) also give each variant's cost per module call, per collective and
per window (`per_event_tables`, solved by events.py).
"""

from __future__ import annotations

import gc
import os
import random
import statistics
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from benchmarks.events import EventCosts, Run, Unsolvable, describe, events_header, format_events, solve_events
from benchmarks.instructions import InstructionCount
from benchmarks.variants import UNTRACED, Variant, build_variants
from benchmarks.workloads import Workload
from hp_otel.cli.progress import Progress, quiet


@dataclass(frozen=True)
class RatioSummary:
    """A variant against untraced over rounds: median ratio, its interquartile range, µs added per event."""

    median: float
    q1: float
    q3: float
    us_per_event: float | None


def summarise_rounds(variant_us: Sequence[float], untraced_us: Sequence[float], events: int) -> RatioSummary:
    """Per-round ratios variant/untraced: their median and quartiles; and the median per-round
    µs added, divided by `events` (None when events is 0)."""
    if len(variant_us) != len(untraced_us) or not variant_us:
        raise ValueError("need the same number (at least one) of rounds for the variant and untraced")
    ratios = [v / u for v, u in zip(variant_us, untraced_us, strict=True)]
    q1, q3 = _quartiles(ratios)
    added = statistics.median(v - u for v, u in zip(variant_us, untraced_us, strict=True))
    return RatioSummary(statistics.median(ratios), q1, q3, added / events if events else None)


def _quartiles(values: Sequence[float]) -> tuple[float, float]:
    if len(values) < 2:
        return values[0], values[0]
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q3


def load_average() -> float | None:
    """The 1-minute load average, or None where the platform has none."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def load_warning(load: float | None = None, cores: int | None = None) -> str | None:
    """A line to print when more runs than there are cores: timings under load are not comparable."""
    load = load_average() if load is None else load
    cores = cores if cores is not None else os.cpu_count() or 1
    if load is None or load <= cores:
        return None
    return f"warning: 1-minute load average {load:.2f} exceeds the {cores} cores: other processes skew these timings"


@dataclass
class VariantResult:
    name: str
    median_us: float  # median over rounds of each round's median µs per step
    ratio: RatioSummary
    records_events: bool
    per_round_us: list[float]  # each round's median µs per step, for --json
    instructions: InstructionCount | None = None  # --instructions: counted under callgrind


@dataclass
class WorkloadResult:
    workload: str
    summary: str
    rounds: int
    steps: int
    events_per_step: int  # spans one CommDebugMode(module=model) window records for one step
    collectives_per_step: int
    variants: list[VariantResult]
    skipped: dict[str, str]
    cores: int
    load_start: float | None
    load_end: float | None
    load_max: float | None  # the highest 1-minute load seen at the start, each round and the end
    warnings: list[str] = field(default_factory=list)
    module_calls_per_step: int = 0  # forward calls of the model's modules in one step
    family: str = ""  # workloads of one family are solved together for per-event costs


def _time_block(step: Callable[[], Any], variant: Variant, steps: int) -> float:
    """Median µs per step, each step in its own `with` block as a user would write it."""
    gc.collect()
    samples = []
    with variant.around_block():
        for _ in range(steps):
            t0 = time.perf_counter()
            with variant.step_context():
                step()
            samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1e6


def count_events(workload: Workload) -> tuple[int, int]:
    """(spans recorded, collectives) in one step under `CommDebugMode(module=model)`."""
    from hp_otel import CommDebugMode

    mode = CommDebugMode(module=workload.model)
    with mode:
        workload.step()
    return len(mode.get_finished_spans()), mode.get_total_counts()


def count_module_calls(workload: Workload) -> int:
    """Forward calls of the model's modules in one untraced step, seen by a global pre-hook of torch's
    (not by hp_otel: the figure the per-event costs divide by must not depend on what hp_otel hooks)."""
    from torch.nn.modules.module import register_module_forward_pre_hook

    ours = {id(module) for module in workload.model.modules()}
    calls = 0

    def seen(module: Any, args: Any) -> None:
        nonlocal calls
        calls += id(module) in ours

    handle = register_module_forward_pre_hook(seen)
    try:
        workload.step()
    finally:
        handle.remove()
    return calls


def _select(
    variants: list[Variant], skipped: dict[str, str], only: Sequence[str] | None
) -> tuple[list[Variant], dict[str, str]]:
    """The variants named in `only` (untraced always), or all; an unknown name is an error."""
    if only is None:
        return variants, skipped
    known = [v.name for v in variants] + list(skipped)
    unknown = sorted(set(only) - set(known))
    if unknown:
        raise ValueError(f"unknown variants {unknown}; known: {known}")
    chosen = [v for v in variants if v.name == UNTRACED or v.name in only]
    return chosen, {name: reason for name, reason in skipped.items() if name in only}


def _interleave(
    workload: Workload, variants: list[Variant], rounds: int, steps: int, progress: Progress, warned: bool
) -> tuple[dict[str, list[float]], list[float | None]]:
    """Each variant's median µs per round, and the load average after each round (a busy
    machine is reported once as a progress line, unless `warned` already)."""
    for variant in variants:  # warm-up
        _time_block(workload.step, variant, min(3, steps))
    per_round: dict[str, list[float]] = {v.name: [] for v in variants}
    loads: list[float | None] = []
    order = list(variants)
    shuffle = random.Random(0).shuffle
    for done in range(rounds):
        shuffle(order)  # no variant always runs right after another
        if done and done % max(1, rounds // 5) == 0:
            progress(f"{workload.name}: round {done + 1}/{rounds}")
        for variant in order:
            per_round[variant.name].append(_time_block(workload.step, variant, steps))
        loads.append(load_average())
        warning = load_warning(loads[-1]) if loads[-1] is not None else None
        if warning and not warned:
            progress(f"{workload.name}: {warning}")
            warned = True
    return per_round, loads


def run_workload(
    workload: Workload,
    rounds: int | None = None,
    steps: int | None = None,
    only: Sequence[str] | None = None,
    progress: Progress = quiet,
) -> WorkloadResult:
    """Time every variant (or those named in `only`; untraced always) on `workload`.

    `rounds`/`steps` default to the workload's own (the realistic one runs fewer)."""
    rounds = rounds or workload.rounds
    steps = steps or workload.steps
    cores = os.cpu_count() or 1
    load_start = load_average()
    warning = load_warning(load_start, cores)
    if warning:
        progress(f"{workload.name}: {warning}")
    variants, skipped = _select(*build_variants(workload.model), only)
    for name, reason in skipped.items():
        progress(f"{workload.name}: left out {name!r}: {reason}")
    with warnings.catch_warnings():
        # torch's module tracker (its CommDebugMode, DebugMode) says this on every model fed integer tokens
        warnings.filterwarnings("ignore", message="Full backward hook is firing", category=UserWarning)
        # Counting the events also enters and exits one window: the "inactive" variant's premise.
        events, collectives = count_events(workload)
        module_calls = count_module_calls(workload)
        progress(
            f"{workload.name}: {len(variants)} variants x {rounds} rounds x {steps} steps "
            f"({events} events, {collectives} collectives a step); warming up"
        )
        per_round, loads = _interleave(workload, variants, rounds, steps, progress, warned=warning is not None)
    load_end = load_average()
    seen = [load for load in (load_start, *loads, load_end) if load is not None]
    load_max = max(seen) if seen else None
    warning = load_warning(load_max, cores) if load_max is not None else None
    untraced = per_round[UNTRACED]
    return WorkloadResult(
        workload=workload.name,
        summary=workload.summary,
        rounds=rounds,
        steps=steps,
        events_per_step=events,
        collectives_per_step=collectives,
        variants=[
            VariantResult(
                v.name,
                statistics.median(per_round[v.name]),
                summarise_rounds(per_round[v.name], untraced, events if v.records_events else 0),
                v.records_events,
                per_round[v.name],
            )
            for v in variants
        ],
        skipped=skipped,
        cores=cores,
        load_start=load_start,
        load_end=load_end,
        load_max=load_max,
        warnings=[warning.replace("average", "average peaked at", 1)] if warning else [],
        module_calls_per_step=module_calls,
        family=workload.family,
    )


def run_bench(
    model_names: Sequence[str] = ("mlp",),
    rounds: int | None = None,
    steps: int | None = None,
    only: Sequence[str] | None = None,
    progress: Progress = quiet,
    instruction_steps: int | None = None,
    jobs: int = 1,
) -> list[WorkloadResult]:
    """Build and time each workload in turn (one at a time: the models are not kept); with
    `instruction_steps`, then count each timed variant's instructions over that many steps,
    `jobs` callgrind children at a time (valgrind and the client library are checked first,
    so a missing tool stops the bench before any timing: `instructions.ToolMissing`)."""
    from benchmarks.instructions import count_variants, find_tools
    from benchmarks.workloads import build_workload

    tools = find_tools() if instruction_steps else None
    results = []
    for name in model_names:
        progress(f"{name}: building")
        result = run_workload(build_workload(name), rounds, steps, only, progress)
        if instruction_steps:
            names = [variant.name for variant in result.variants]
            counts = count_variants(result.workload, names, instruction_steps, jobs, progress, tools)
            for variant in result.variants:
                variant.instructions = counts[variant.name]
        results.append(result)
    return results


def _load_text(load: float | None) -> str:
    return "n/a" if load is None else f"{load:.2f}"


def format_results(result: WorkloadResult) -> Iterator[str]:
    """One workload's table: µs per step, ratio to untraced (median, IQR), µs per recorded event;
    with instructions counted, instructions per step and their ratio to untraced."""
    counted = [v.instructions for v in result.variants if v.instructions is not None]
    yield f"== {result.workload}: {result.summary}"
    yield (
        f"   {result.events_per_step} events and {result.collectives_per_step} collectives a step; "
        f"{result.rounds} rounds x {result.steps} steps"
        + (f"; instructions over {counted[0].steps} steps under callgrind" if counted else "")
    )
    header = f"{'variant':<34}{'median µs/step':>15}{'ratio':>9}{'IQR of ratios':>16}{'µs/event':>10}"
    yield header + (f"{'MIr/step':>11}{'Ir ratio':>10}" if counted else "")
    for variant in result.variants:
        ratio = variant.ratio
        per_event = f"{ratio.us_per_event:>10.1f}" if ratio.us_per_event is not None else f"{'':>10}"
        spread = f"{ratio.q1:.2f}–{ratio.q3:.2f}"
        line = f"{variant.name:<34}{variant.median_us:>15.0f}{ratio.median:>8.2f}x{spread:>16}{per_event}"
        yield line + (_instruction_columns(variant.instructions) if counted else "")
    for name, reason in result.skipped.items():
        yield f"{name:<34}{'skipped':>15}   {reason}"
    yield (
        "ratio: median over rounds of (variant / untraced) in the same round; IQR: their 25th–75th percentile; "
        "µs/event: median µs added per round / events a step"
    )
    if counted:
        yield (
            "MIr/step: millions of instructions per counted step (callgrind, each variant in its own process, "
            "after a warm-up); Ir ratio: over untraced's. They repeat within ±0.2 % whatever the load: "
            "trust them over wall clock on a busy machine"
        )
    yield (
        f"1-minute load average: {_load_text(result.load_start)} at start, {_load_text(result.load_end)} at end, "
        f"peak {_load_text(result.load_max)} ({result.cores} cores)"
    )
    yield from result.warnings


def _instruction_columns(count: InstructionCount | None) -> str:
    if count is None:
        return f"{'':>11}{'':>10}"
    ratio = f"{count.ratio:>9.3f}x" if count.ratio is not None else f"{'':>10}"
    return f"{count.ir_per_step / 1e6:>11.3f}{ratio}"


def per_event_costs(results: Sequence[WorkloadResult], unit: str) -> dict[str, dict[str, EventCosts | str]]:
    """For each family with 3 or more workloads: each variant's solved cost per event, or why none.

    `unit` "Ir": from the instructions counted (variant minus untraced per step); "µs": from wall
    clock (the median over rounds of variant minus untraced in the same round)."""
    families: dict[str, list[WorkloadResult]] = {}
    for result in results:
        if result.family:
            families.setdefault(result.family, []).append(result)
    solved: dict[str, dict[str, EventCosts | str]] = {}
    for family, members in families.items():
        if len(members) < 3:
            continue
        names = [v.name for v in members[0].variants if v.name != UNTRACED]
        solved[family] = {}
        for name in names:
            runs = [run for result in members if (run := _run(result, name, unit)) is not None]
            try:
                solved[family][name] = solve_events(runs)
            except Unsolvable as exc:
                solved[family][name] = str(exc)
    return solved


def _run(result: WorkloadResult, name: str, unit: str) -> Run | None:
    """One workload's equation for variant `name`: None where it or untraced was not run (or counted)."""
    by_name = {v.name: v for v in result.variants}
    variant, base = by_name.get(name), by_name.get(UNTRACED)
    if variant is None or base is None:
        return None
    if unit == "Ir":
        if variant.instructions is None or base.instructions is None:
            return None
        added = variant.instructions.ir_per_step - base.instructions.ir_per_step
    else:
        added = statistics.median(v - u for v, u in zip(variant.per_round_us, base.per_round_us, strict=True))
    return Run(result.workload, result.module_calls_per_step, result.collectives_per_step, added)


def per_event_tables(results: Sequence[WorkloadResult]) -> Iterator[str]:
    """Each family's per-event table: instructions where counted, and wall clock."""
    counted = any(v.instructions is not None for r in results for v in r.variants)
    for unit in ("Ir", "µs") if counted else ("µs",):
        for family, costs in per_event_costs(results, unit).items():
            members = [r for r in results if r.family == family]
            yield f"== {family}: cost per event ({'instructions' if unit == 'Ir' else 'wall clock'})"
            yield "   from " + ", ".join(
                f"{r.workload} ({r.module_calls_per_step} module calls, {r.collectives_per_step} collectives)"
                for r in members
            )
            yield events_header(unit)
            for name, cost in costs.items():
                yield format_events(name, cost, unit)
            yield describe(c for c in costs.values() if isinstance(c, EventCosts)) + (
                "; module calls: forward calls of the model's modules (each with its backward)"
            )
            worst = max((c.max_residual for c in costs.values() if isinstance(c, EventCosts)), default=0.0)
            if worst:
                yield (
                    f"largest residual: {worst / 1e6:.3f} MIr a step"
                    if unit == "Ir"
                    else f"largest residual: {worst:.0f} µs a step"
                )
            yield ""


def results_json(results: Sequence[WorkloadResult]) -> dict[str, Any]:
    """The results as plain data for `--json`, with the per-event costs of each family."""
    per_event = {
        unit: {
            family: {name: asdict(c) if isinstance(c, EventCosts) else {"unsolved": c} for name, c in costs.items()}
            for family, costs in per_event_costs(results, unit).items()
        }
        for unit in ("Ir", "µs")
    }
    return {"workloads": [asdict(result) for result in results], "per_event": per_event}
