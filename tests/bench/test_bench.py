"""`python -m benchmarks`: every workload builds and runs, the per-round ratio arithmetic, the load
warning, skipped variants. Timings themselves are never asserted (they depend on the machine)."""

from __future__ import annotations

import json
import sys

import pytest
from referee import Referee

from benchmarks.command import main
from benchmarks.timing import format_results, load_warning, results_json, run_workload, summarise_rounds
from benchmarks.variants import COUNTS_ONLY, HP_OTEL, INSTRUMENTOR, PROFILER, TORCH_COMM, UNTRACED
from benchmarks.workloads import WORKLOADS, build_workload

SMALL = [
    name for name, spec in WORKLOADS.items() if name != "realistic" and spec.family != "llama"
]  # llama: test_bench_llama


def _referee_collectives(workload) -> int:
    """Functional collectives in one step, counted by the test's own dispatch mode."""
    with Referee() as referee:
        workload.step()
    return sum(n for name, n in referee.counts.items() if name.startswith("_c10d_functional."))


def _check_runs(name: str) -> None:
    workload = build_workload(name)
    result = run_workload(workload, rounds=1, steps=1, only=[HP_OTEL, INSTRUMENTOR])
    assert [v.name for v in result.variants] == [UNTRACED, HP_OTEL, INSTRUMENTOR]
    assert all(v.median_us > 0 and len(v.per_round_us) == 1 for v in result.variants)
    assert result.collectives_per_step == _referee_collectives(workload) > 0
    assert result.events_per_step > result.collectives_per_step  # ops, modules, redistributes too
    by_name = {v.name: v for v in result.variants}
    assert by_name[HP_OTEL].ratio.us_per_event is not None
    assert by_name[UNTRACED].ratio.us_per_event is None  # records nothing: no per-event figure
    table = "\n".join(format_results(result))
    assert f"{result.events_per_step} events and {result.collectives_per_step} collectives a step" in table


@pytest.mark.parametrize("name", SMALL)
def test_every_small_workload_builds_and_runs_one_round(name, fake_world) -> None:
    _check_runs(name)


@pytest.mark.bench  # about 0.3 s a step, a dozen steps
def test_the_realistic_workload_builds_and_runs_one_round(fake_world) -> None:
    _check_runs("realistic")


def test_ratio_is_the_median_of_per_round_ratios() -> None:
    # rounds: untraced 100/200/100/100 µs, the variant 150/200/300/120 µs
    summary = summarise_rounds([150, 200, 300, 120], [100, 200, 100, 100], events=10)
    # per-round ratios 1.5, 1.0, 3.0, 1.2: median 1.35 (a ratio of medians would be 175/100 = 1.75)
    assert summary.median == pytest.approx(1.35)
    assert (summary.q1, summary.q3) == (pytest.approx(1.15), pytest.approx(1.875))  # inclusive quartiles
    # µs added per round 50, 0, 200, 20: median 35, over 10 events
    assert summary.us_per_event == pytest.approx(3.5)
    single = summarise_rounds([120], [100], events=0)
    assert (single.median, single.q1, single.q3, single.us_per_event) == (1.2, 1.2, 1.2, None)
    with pytest.raises(ValueError, match="same number"):
        summarise_rounds([1, 2], [1], events=1)


def test_load_warning_compares_with_the_core_count(monkeypatch) -> None:
    assert load_warning(1.5, cores=2) is None  # the old fixed threshold (1.0) warned here
    assert load_warning(2.0, cores=2) is None
    assert "exceeds the 2 cores" in (load_warning(2.5, cores=2) or "")
    assert load_warning(6.0, cores=8) is None
    monkeypatch.setattr("os.cpu_count", lambda: 4)
    monkeypatch.setattr("os.getloadavg", lambda: (4.5, 0.0, 0.0))
    assert "1-minute load average 4.50 exceeds the 4 cores" in (load_warning() or "")
    monkeypatch.setattr("os.getloadavg", lambda: (3.9, 0.0, 0.0))
    assert load_warning() is None


def test_load_is_recorded_and_a_busy_machine_is_flagged(monkeypatch, fake_world) -> None:
    loads = iter([0.5, 9.0] + [1.0] * 10)
    monkeypatch.setattr("os.getloadavg", lambda: (next(loads), 0.0, 0.0))
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    messages: list[str] = []
    result = run_workload(build_workload("mlp"), rounds=1, steps=1, only=[], progress=messages.append)
    assert (result.load_start, result.load_max, result.load_end, result.cores) == (0.5, 9.0, 1.0, 2)
    table = "\n".join(format_results(result))
    assert "1-minute load average: 0.50 at start, 1.00 at end, peak 9.00 (2 cores)" in table
    assert "warning: 1-minute load average peaked at 9.00 exceeds the 2 cores" in table
    # the start was quiet; the round's 9.0 is reported as it comes, once
    assert [m for m in messages if "warning" in m] == [
        "mlp: warning: 1-minute load average 9.00 exceeds the 2 cores: other processes skew these timings"
    ]
    data = json.loads(json.dumps(results_json([result])))["workloads"][0]
    assert (data["load_start"], data["load_max"], data["load_end"], data["cores"]) == (0.5, 9.0, 1.0, 2)
    assert data["variants"][0]["name"] == UNTRACED and len(data["variants"][0]["per_round_us"]) == 1


def test_skipped_variants_are_reported_with_their_reason(monkeypatch, fake_world) -> None:
    # as without numpy: torch's CommDebugMode cannot be imported
    monkeypatch.setitem(sys.modules, "torch.distributed.tensor.debug", None)
    messages: list[str] = []
    result = run_workload(
        build_workload("mlp"), rounds=1, steps=1, only=[COUNTS_ONLY, TORCH_COMM], progress=messages.append
    )
    assert [v.name for v in result.variants] == [UNTRACED, COUNTS_ONLY]
    assert list(result.skipped) == [TORCH_COMM] and "cannot import it" in result.skipped[TORCH_COMM]
    assert any(TORCH_COMM in m and "cannot import it" in m for m in messages)
    lines = list(format_results(result))
    assert any(line.startswith(TORCH_COMM) and "skipped" in line and "cannot import it" in line for line in lines)


def _collective_calls(reader) -> int:
    from hp_otel.spans import schema

    data = reader.get_metrics_data()
    return sum(
        int(point.value)
        for resource in (data.resource_metrics if data else ())
        for scope in resource.scope_metrics
        for metric in scope.metrics
        if metric.name == schema.METRIC_CALLS
        for point in metric.data.data_points
    )


def test_the_instrumentor_variant_counts_every_step_and_samples_none(fake_world) -> None:
    from benchmarks.variants import build_variants
    from hp_otel.always_on.instrumentation import active_session
    from hp_otel.export.providers import default_meter_provider

    workload = build_workload("mlp")
    variants, _ = build_variants(workload.model)
    (variant,) = [v for v in variants if v.name == INSTRUMENTOR]
    reader = default_meter_provider()[1]
    assert reader is not None  # nobody configured export in this test process
    with variant.around_block():
        assert active_session() is not None
        for _ in range(2):
            before = _collective_calls(reader)
            with variant.step_context() as spans:
                workload.step()
            assert not spans.sampled
            assert _collective_calls(reader) - before == _referee_collectives(workload) == 2
    assert active_session() is None  # uninstrumented after the block: other variants run without it


def test_an_unknown_variant_name_is_refused(fake_world) -> None:
    with pytest.raises(ValueError, match="unknown variants \\['nope'\\]"):
        run_workload(build_workload("mlp"), rounds=1, steps=1, only=["nope"])


def test_an_unknown_workload_is_refused() -> None:
    with pytest.raises(ValueError, match="workload must be one of mlp, transformer"):
        build_workload("resnet")


def test_the_profiler_variant_runs_or_says_why(fake_world) -> None:
    result = run_workload(build_workload("mlp"), rounds=1, steps=1, only=[PROFILER])
    ran = [v.name for v in result.variants]
    assert (PROFILER in ran) != (PROFILER in result.skipped)


@pytest.mark.bench  # every variant of the mlp, in this process: about 6 s
def test_bench_command_prints_json(capsys, fake_world) -> None:
    assert main(["--rounds", "1", "--steps", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    (mlp,) = out["workloads"]
    assert mlp["workload"] == "mlp" and mlp["collectives_per_step"] == 2
    names = [v["name"] for v in mlp["variants"]]
    assert names[0] == UNTRACED and HP_OTEL in names and INSTRUMENTOR in names
    assert mlp["load_start"] is None or mlp["load_start"] >= 0
