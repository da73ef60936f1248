"""`python -m benchmarks`, run from the repository as the docs say: its help and every variant."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _benchmarks(*args: str, timeout: int = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "benchmarks", *args],
        capture_output=True, text=True, timeout=timeout, check=False, cwd=ROOT,
    )  # fmt: skip


@pytest.mark.multiprocess  # a child process
def test_help_states_ranges_and_defaults() -> None:
    result = _benchmarks("--help")
    assert result.returncode == 0, result.stderr[-3000:]
    text = " ".join(result.stdout.split())  # argparse wraps lines
    assert text.startswith("usage: python -m benchmarks")
    for phrase in ("--rounds N", "mlp 15x20", "realistic 5x3", "(see --rounds)", "--spans N", "(default: 100000)"):
        assert phrase in text, text
    assert "(default: None)" not in text


def test_the_benchmarks_are_no_command_of_the_shipped_cli(capsys) -> None:
    from hp_otel.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["bench"])
    assert exc.value.code == 2 and "invalid choice: 'bench'" in capsys.readouterr().err


@pytest.mark.bench  # runs the benchmark
def test_bench_runs_every_variant() -> None:
    result = _benchmarks("--rounds", "1", "--steps", "2")
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    for variant in (
        "untraced",
        "hp_otel",
        "hp_otel, counts only",
        "hp_otel, stack=True",
        "hp_otel instrumentor, unsampled",
        "torch CommDebugMode",
        "torch DebugMode",
        "torch.profiler, record_shapes",
        "hp_otel imported, inactive",
        "floor",
    ):
        assert any(line.startswith(variant) for line in lines), result.stdout
