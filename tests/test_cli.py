"""The hp-otel command: demo (a real 2-process gloo run), render, bench."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from hp_otel.cli import main


def _hp_otel(*args: str, timeout: int = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hp_otel.cli", *args], capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo")
    result = _hp_otel("demo", "--out", str(out))
    return out, result


@pytest.mark.slow  # a real 2-process gloo demo
def test_demo_prints_counts_and_table_and_writes_files(demo_run) -> None:
    out, result = demo_run
    assert result.returncode == 0, result.stderr[-3000:]
    assert "collective counts (rank 0): {'_c10d_functional.all_reduce': 2}" in result.stdout
    assert "Module((root)) [enter]" in result.stdout
    assert "Collective(_c10d_functional.all_reduce) group_size=2" in result.stdout
    for rank in (0, 1):
        dump = json.loads((out / f"comm_rank{rank}.json").read_text())
        assert dump["total_counts"] == 2
        spans = json.loads((out / f"spans_rank{rank}.json").read_text())
        assert spans["resourceSpans"][0]["scopeSpans"][0]["scope"]["name"] == "hp_otel"


@pytest.mark.slow  # reads the demo's files
def test_render_rebuilds_the_table_from_a_spans_file(demo_run, capsys) -> None:
    out, _ = demo_run
    assert main(["render", str(out / "spans_rank0.json"), "--noise-level", "2"]) == 0
    printed = capsys.readouterr().out
    assert "collective counts: {'_c10d_functional.all_reduce': 2}" in printed
    assert "  Module             Module(fc2) [enter]" in printed


def test_render_reports_missing_and_malformed_files(tmp_path, capsys) -> None:
    assert main(["render", str(tmp_path / "nope.json")]) == 2
    assert "does not exist" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2")
    assert main(["render", str(bad)]) == 2
    assert "not JSON" in capsys.readouterr().err


def test_bad_noise_level_is_rejected_by_the_parser(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["render", "x.json", "--noise-level", "7"])
    assert exc.value.code == 2
    assert "must be one of 0, 1, 2, 3" in capsys.readouterr().err


@pytest.mark.slow  # runs the benchmark
def test_bench_runs_every_variant() -> None:
    result = _hp_otel("bench", "--rounds", "1", "--steps", "2")
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    for variant in (
        "untraced",
        "hp_otel",
        "torch CommDebugMode",
        "torch DebugMode",
        "hp_otel imported, inactive",
        "floor",
    ):
        assert any(line.startswith(variant) for line in lines), result.stdout


@pytest.mark.slow  # a real 2-process gloo demo
def test_demo_transformer(tmp_path) -> None:
    result = _hp_otel("demo", "--model", "transformer", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Module(layers.0.attention.wq) [enter]" in result.stdout
    for rank in (0, 1):
        dump = json.loads((tmp_path / f"comm_rank{rank}.json").read_text())
        assert dump["total_counts"] == 21  # 11 all_gather + 10 reduce_scatter
        modules = dump["comm_module_counts"]
        # attention's own input gather/scatter belongs to attention, not to its wq/wk/wv
        assert modules["layers.0.attention"]["backward"] == {
            "_c10d_functional.all_gather_into_tensor": 1,
            "_c10d_functional.reduce_scatter_tensor": 1,
        }
        assert "layers.0.attention.wq" not in modules
