"""`python -m benchmarks` on the llama: the per-event solver (exact on constructed runs, least squares on
more, and refusing runs that cannot tell a module call from a collective), the llama workloads'
wiring (collectives counted by the referee, module calls by the test's own hook), the per-event
table; and (slow) a real callgrind count of the smallest llama."""

from __future__ import annotations

import json

import pytest
from referee import Referee
from servers import missing
from torch import nn

from benchmarks.events import Run, Unsolvable, solve_events
from benchmarks.instructions import InstructionCount, ToolMissing, count_variants, find_tools
from benchmarks.timing import (
    RatioSummary,
    VariantResult,
    WorkloadResult,
    per_event_costs,
    per_event_tables,
    results_json,
    run_workload,
)
from benchmarks.variants import COUNTS_ONLY, HP_OTEL, UNTRACED
from benchmarks.workloads import GROUPS, WORKLOADS, build_workload, workload_names

# a = per module call, b = per collective, c = per window (instructions)
A, B, C = 135_000.0, 200_000.0, 400_000.0


def _added(module_calls: int, collectives: int) -> float:
    return A * module_calls + B * collectives + C


def test_three_independent_runs_are_solved_exactly() -> None:
    runs = [
        Run("L2", 28, 22, _added(28, 22)),
        Run("L8", 100, 70, _added(100, 70)),
        Run("L2 no TP", 28, 0, _added(28, 0)),
    ]
    costs = solve_events(runs)
    assert costs.method == "exact" and costs.runs == 3 and costs.max_residual == 0
    assert (costs.per_module_call, costs.per_collective, costs.per_window) == (
        pytest.approx(A),
        pytest.approx(B),
        pytest.approx(C),
    )


def test_more_runs_are_solved_by_least_squares_with_the_largest_residual() -> None:
    shape = [(28, 22), (100, 70), (28, 0), (100, 0)]
    exact = solve_events([Run(str(i), m, c, _added(m, c)) for i, (m, c) in enumerate(shape)])
    assert exact.method == "least squares" and exact.runs == 4
    assert exact.per_module_call == pytest.approx(A) and exact.max_residual == pytest.approx(0, abs=1e-3)
    # one run off by 1,000: the fit moves, and says by how much it misses
    noisy = [Run(str(i), m, c, _added(m, c) + (1000 if i == 3 else 0)) for i, (m, c) in enumerate(shape)]
    costs = solve_events(noisy)
    assert 0 < costs.max_residual < 1000
    assert costs.per_module_call != pytest.approx(A, abs=1e-6)


def test_runs_that_only_differ_in_layers_are_refused() -> None:
    # with TP, module calls and collectives both grow with the layers: 4 + 12 L and 6 + 8 L
    runs = [Run(f"L{n}", 4 + 12 * n, 6 + 8 * n, _added(4 + 12 * n, 6 + 8 * n)) for n in (2, 4, 8)]
    with pytest.raises(Unsolvable, match="add a run without TP"):
        solve_events(runs)
    with pytest.raises(Unsolvable, match="at least 3 runs"):
        solve_events(runs[:2])


def _result(name: str, module_calls: int, collectives: int, per_variant: dict[str, float]) -> WorkloadResult:
    ratio = RatioSummary(1.0, 1.0, 1.0, None)
    return WorkloadResult(
        name, "", 1, 1, 0, collectives,
        [
            VariantResult(v, ir / 1000, ratio, False, [ir / 1000], InstructionCount(ir, None, 5))
            for v, ir in per_variant.items()
        ],
        {}, 2, None, None, None, module_calls_per_step=module_calls, family="llama",
    )  # fmt: skip


def test_the_bench_solves_each_variant_from_the_family_and_prints_it() -> None:
    base = 60e6
    results = [
        _result(name, m, c, {UNTRACED: base + m, HP_OTEL: base + m + _added(m, c), COUNTS_ONLY: base + m + 2 * m})
        for name, m, c in (("L2", 28, 22), ("L8", 100, 70), ("L2 no TP", 28, 0))
    ]
    costs = per_event_costs(results, "Ir")["llama"]
    traced, counts = costs[HP_OTEL], costs[COUNTS_ONLY]
    assert not isinstance(traced, str) and not isinstance(counts, str)
    assert (traced.per_module_call, traced.per_collective, traced.per_window) == (
        pytest.approx(A),
        pytest.approx(B),
        pytest.approx(C),
    )
    assert (counts.per_module_call, counts.per_collective, counts.per_window) == (
        pytest.approx(2),
        pytest.approx(0, abs=1e-6),
        pytest.approx(0, abs=1e-3),
    )
    lines = list(per_event_tables(results))
    assert "== llama: cost per event (wall clock)" in lines  # the µs table follows
    lines = lines[: lines.index("")]  # the instructions' table
    assert lines[0] == "== llama: cost per event (instructions)"
    assert "L8 (100 module calls, 70 collectives)" in lines[1]
    (traced_line,) = [line for line in lines if line.startswith(HP_OTEL + " ")]
    assert traced_line.split()[-3:] == ["135.0", "200.0", "0.400"]  # kIr, kIr, MIr
    assert any("solved exactly from 3 runs" in line for line in lines)
    data = json.loads(json.dumps(results_json(results)))["per_event"]["Ir"]["llama"][HP_OTEL]
    assert data["per_collective"] == pytest.approx(B) and data["method"] == "exact"
    assert per_event_costs(results[:2], "Ir") == {}  # two runs of a family: no table


def test_the_llama_group_differs_in_layers_and_in_tp() -> None:
    members = GROUPS["llama"]
    assert all(WORKLOADS[name].family == "llama" for name in members)
    assert {"llama-L2-d64", "llama-L8-d64", "llama-L2-d256"} <= set(members)
    assert any(name.endswith("-notp") for name in members)
    assert workload_names("llama") == list(members)  # `--model llama`
    assert workload_names("all") == list(WORKLOADS) and workload_names("mlp") == ["mlp"]


def _module_calls(model: nn.Module, step) -> int:
    """Forward calls in one step, by the test's own hooks on every module."""
    calls = []
    handles = [m.register_forward_pre_hook(lambda *_: calls.append(1)) for m in model.modules()]
    try:
        step()
    finally:
        for handle in handles:
            handle.remove()
    return len(calls)


@pytest.mark.parametrize(("name", "layers"), [("llama-L2-d64", 2), ("llama-L2-d64-notp", 2), ("llama-L8-d64", 8)])
def test_the_llama_workloads_count_their_collectives_and_module_calls(name, layers, fake_world) -> None:
    workload = build_workload(name)
    assert workload.family == "llama"
    with Referee() as referee:
        workload.step()
    calls = _module_calls(workload.model, workload.step)
    assert calls == 4 + 12 * layers  # root, embeddings, norm, output; a block's 12 modules a layer
    result = run_workload(workload, rounds=1, steps=1, only=[HP_OTEL, COUNTS_ONLY])
    assert result.module_calls_per_step == calls and result.family == "llama"
    assert result.collectives_per_step == sum(referee.counts.values())
    if name.endswith("-notp"):
        assert result.collectives_per_step == 0  # no TP: the plain model
    else:
        assert result.collectives_per_step == 6 + 8 * layers  # and one of them the DP all_reduce
        assert referee.counts["c10d.allreduce_"] == 1


@pytest.mark.bench
@pytest.mark.multiprocess  # two processes under callgrind, the smallest llama (a minute or two of CPU each)
def test_the_smallest_llama_is_counted_under_callgrind(fake_world) -> None:
    try:
        tools = find_tools()
    except ToolMissing as exc:
        missing(str(exc))
    counts = count_variants("llama-L2-d64", [UNTRACED, COUNTS_ONLY], steps=2, jobs=2, tools=tools)
    assert counts[UNTRACED].ir_per_step > 10e6 and counts[UNTRACED].ratio == 1.0
    assert counts[COUNTS_ONLY].ratio is not None and counts[COUNTS_ONLY].ratio > 1.0
