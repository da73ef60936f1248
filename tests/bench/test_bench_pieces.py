"""`python -m benchmarks --pieces`: each variant adds one part, and the table says what each part added."""

from __future__ import annotations

from benchmarks.pieces import format_pieces, piece_variants, run_pieces
from benchmarks.workloads import build_workload
from hp_otel.record import installation


def test_format_pieces_gives_median_ratio_spread_and_the_paired_step_from_the_line_above() -> None:
    per_round = {
        "untraced": [100.0, 200.0, 100.0, 100.0, 100.0],
        "hooks kept, no window": [101.0, 202.0, 103.0, 101.0, 102.0],
        "+ op mode": [150.0, 260.0, 140.0, 150.0, 151.0],
        "bare no-op function mode": [110.0, 210.0, 105.0, 110.0, 110.0],
    }
    lines = list(format_pieces(per_round))
    assert lines[0].split()[:3] == ["variant", "µs/step", "ratio"]
    kept = lines[2].split()
    # median 102 µs; ratios 1.01 1.01 1.03 1.01 1.02: median 1.01, IQR 1.01–1.02; piece median(1, 2, 3, 1, 2)
    assert kept[-4:] == ["102", "1.01x", "1.01–1.02", "+2"]
    op_mode = lines[3].split()
    # ratios 1.5, 1.3, 1.4, 1.5, 1.51; pieces 49, 58, 37, 49, 49 -> +49 (a difference of medians would say +48)
    assert op_mode[-4:] == ["150", "1.50x", "1.40–1.50", "+49"]
    assert lines[4].split()[-1] == "1.05–1.10"  # the bare mode is for scale: no piece of its own


def test_run_pieces_times_every_variant_and_leaves_nothing_installed(fake_world) -> None:
    workload = build_workload("mlp")
    hooks = [(len(m._forward_pre_hooks), len(m._forward_hooks)) for m in workload.model.modules()]
    per_round = run_pieces(workload.model, workload.step, rounds=1, steps=1)
    assert list(per_round) == list(piece_variants(workload.model))
    assert all(len(values) == 1 and values[0] > 0 for values in per_round.values())
    assert installation.lingering_count() == 0 and not installation.keeping()
    assert [(len(m._forward_pre_hooks), len(m._forward_hooks)) for m in workload.model.modules()] == hooks
