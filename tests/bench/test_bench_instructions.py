"""`python -m benchmarks --instructions`: a missing tool is named with its package before any timing; the
client library builds once into its cache; callgrind's dump is read; the table and JSON carry the
counts; and (slow) real callgrind runs: traced counts more than untraced, and a variant repeats."""

from __future__ import annotations

import ctypes
import json
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
from servers import missing

from benchmarks.command import main
from benchmarks.instructions import (
    DUMP_LABEL,
    InstructionCount,
    ToolMissing,
    client_library,
    count_variants,
    find_tools,
    read_counted_total,
)
from benchmarks.timing import RatioSummary, VariantResult, WorkloadResult, format_results, results_json
from benchmarks.variants import HP_OTEL, UNTRACED


def _fake_compiler(tmp_path: Path, stderr: str) -> str:
    script = tmp_path / "fake-cc"
    script.write_text(f"#!/bin/sh\necho '{stderr}' >&2\nexit 1\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


def test_missing_valgrind_stops_the_bench_before_any_timing(monkeypatch, capsys) -> None:
    real_which = shutil.which
    monkeypatch.setattr("shutil.which", lambda name, *a, **k: None if name == "valgrind" else real_which(name))
    monkeypatch.setattr("benchmarks.timing.run_workload", lambda *a, **k: pytest.fail("timed without valgrind"))
    assert main(["--instructions"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["python -m benchmarks: valgrind is not on PATH (Debian/Ubuntu: apt-get install valgrind)"]


@pytest.mark.parametrize("other", ["--export-down", "--scale", "--pieces"])
def test_instructions_is_refused_with_the_other_measurements(other, capsys) -> None:
    assert main(["--instructions", other]) == 2
    assert "not with --export-down, --scale or --pieces" in capsys.readouterr().err


def test_a_missing_c_compiler_is_named(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    with pytest.raises(ToolMissing, match=r"no C compiler \(.*no-such-cc\) on PATH .*apt-get install gcc"):
        client_library(folder=tmp_path)


def test_a_missing_callgrind_header_is_named_with_its_package(monkeypatch, tmp_path) -> None:
    cc = _fake_compiler(tmp_path, "x.c:1:10: fatal error: valgrind/callgrind.h: No such file or directory")
    with pytest.raises(
        ToolMissing, match=r"cannot find valgrind/callgrind.h \(Debian/Ubuntu: apt-get install valgrind"
    ):
        client_library(cc, folder=tmp_path / "cache")
    other = _fake_compiler(tmp_path, "cc1: out of memory")
    with pytest.raises(ToolMissing, match="failed to build the callgrind client library: cc1: out of memory"):
        client_library(other, folder=tmp_path / "cache")
    assert not list((tmp_path / "cache").glob("*.so"))  # nothing half-built left to be reused


def test_the_client_library_is_built_once_and_its_requests_are_no_ops_natively(monkeypatch, tmp_path) -> None:
    if shutil.which("cc") is None or not Path("/usr/include/valgrind/callgrind.h").is_file():
        missing("a C compiler (cc) and valgrind/callgrind.h (Debian: gcc, valgrind)")
    library = client_library(shutil.which("cc"), folder=tmp_path)
    assert library.parent == tmp_path and library.is_file()
    loaded = ctypes.CDLL(str(library))
    loaded.hp_otel_cg_start()  # outside valgrind a client request does nothing
    loaded.hp_otel_cg_stop()
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("built again"))
    assert client_library(shutil.which("cc"), folder=tmp_path) == library


def test_the_labelled_dump_is_read_and_the_final_one_ignored(tmp_path) -> None:
    header = "# callgrind format\nversion: 1\npart: {part}\n\ndesc: Trigger: {trigger}\n\nevents: Ir\nsummary: 0\n"
    (tmp_path / "callgrind.out.7").write_text(header.format(part=2, trigger="Program termination") + "totals: 0\n")
    (tmp_path / "callgrind.out.7.1").write_text(
        header.format(part=1, trigger=f"Client Request: {DUMP_LABEL}") + "fn=(1) f\n0 9\n\ntotals: 55792740\n"
    )
    assert read_counted_total(tmp_path) == 55792740
    (tmp_path / "callgrind.out.7.1").unlink()
    with pytest.raises(RuntimeError, match="no callgrind dump labelled"):
        read_counted_total(tmp_path)


def _result(counts: dict[str, InstructionCount | None]) -> WorkloadResult:
    ratio = RatioSummary(1.5, 1.4, 1.6, None)
    return WorkloadResult(
        "mlp", "TP MLP", 1, 1, 15, 2,
        [VariantResult(name, 100.0, ratio, False, [100.0], count) for name, count in counts.items()],
        {}, 2, None, None, None,
    )  # fmt: skip


def test_the_table_and_json_carry_instructions_beside_wall_clock() -> None:
    result = _result({UNTRACED: InstructionCount(5_577_000, 1.0, 10), HP_OTEL: InstructionCount(8_311_000, 1.4902, 10)})
    lines = list(format_results(result))
    assert lines[1].endswith("; instructions over 10 steps under callgrind")
    assert lines[2].split()[-3:] == ["MIr/step", "Ir", "ratio"]
    assert lines[3].split()[-2:] == ["5.577", "1.000x"] and lines[4].split()[-2:] == ["8.311", "1.490x"]
    assert any("trust them over wall clock" in line for line in lines)
    data = json.loads(json.dumps(results_json([result])))["workloads"][0]["variants"]
    assert data[1]["instructions"] == {"ir_per_step": 8_311_000, "ratio": 1.4902, "steps": 10}
    plain = list(format_results(_result({UNTRACED: None})))  # without --instructions: the table as before
    assert "MIr/step" not in plain[2] and "callgrind" not in "\n".join(plain)


@pytest.mark.bench
@pytest.mark.multiprocess  # three processes under callgrind (≈30 s of CPU each, most of it importing torch)
def test_traced_counts_more_than_untraced_and_a_variant_repeats_within_one_percent(capsys, fake_world) -> None:
    try:
        tools = find_tools()
    except ToolMissing as exc:
        missing(str(exc))
    argv = ["--model", "mlp", "--variant", HP_OTEL, "--rounds", "1", "--steps", "1"]
    assert main([*argv, "--instructions", "--counted-steps", "3", "--jobs", "2", "--json"]) == 0
    (mlp,) = json.loads(capsys.readouterr().out)["workloads"]
    counted = {v["name"]: v["instructions"] for v in mlp["variants"]}
    assert list(counted) == [UNTRACED, HP_OTEL]
    assert all(count["steps"] == 3 and count["ir_per_step"] > 1e6 for count in counted.values())
    assert counted[UNTRACED]["ratio"] == 1.0
    traced_over_untraced = counted[HP_OTEL]["ir_per_step"] / counted[UNTRACED]["ir_per_step"]
    assert counted[HP_OTEL]["ratio"] == pytest.approx(traced_over_untraced) and traced_over_untraced > 1.05
    again = count_variants("mlp", [HP_OTEL], steps=3, tools=tools)[HP_OTEL]
    assert again.ratio is None  # untraced was not counted this time
    assert again.ir_per_step == pytest.approx(counted[HP_OTEL]["ir_per_step"], rel=0.01)
