"""`hp-otel bench --pieces`: each variant adds one part, and the table says what each part added."""

from __future__ import annotations

from hp_otel import installation
from hp_otel.cli.bench_pieces import format_pieces, piece_variants, run_pieces
from hp_otel.cli.bench_workloads import build_workload


def test_format_pieces_gives_median_ratio_spread_and_the_step_from_the_line_above() -> None:
    per_round = {
        "untraced": [100.0, 200.0, 100.0],
        "hooks kept, no window": [101.0, 202.0, 103.0],
        "+ op mode": [150.0, 260.0, 140.0],
        "bare no-op function mode": [110.0, 210.0, 105.0],
    }
    lines = list(format_pieces(per_round))
    assert lines[0].split()[:3] == ["variant", "µs/step", "ratio"]
    kept = lines[2]
    assert "103" in kept and "1.01x" in kept and "[1.01, 1.03]" in kept and "+3" in kept  # median 103 - median 100
    op_mode = lines[3]
    assert "1.40x" in op_mode and "[1.30, 1.50]" in op_mode and "+47" in op_mode  # 150 - 103
    assert lines[4].rstrip().endswith("]")  # the bare mode is for scale: no piece of its own


def test_run_pieces_times_every_variant_and_leaves_nothing_installed(fake_world) -> None:
    workload = build_workload("mlp")
    hooks = [(len(m._forward_pre_hooks), len(m._forward_hooks)) for m in workload.model.modules()]
    per_round = run_pieces(workload.model, workload.step, rounds=1, steps=1)
    assert list(per_round) == list(piece_variants(workload.model))
    assert all(len(values) == 1 and values[0] > 0 for values in per_round.values())
    assert installation.lingering_count() == 0 and not installation.keeping()
    assert [(len(m._forward_pre_hooks), len(m._forward_hooks)) for m in workload.model.modules()] == hooks
