"""The collectives file (`CommDebugMode.write_collectives`, `HangWatchdog(evidence="collectives")`):
`hp-otel ranks` reads it like a spans file and says the same, from a few percent of the bytes."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from events import ALL_REDUCE

from hp_otel import CommDebugMode, HangWatchdog
from hp_otel.analysis import compare_files, report_to_json
from hp_otel.cli import main as cli_main
from hp_otel.spans.infos import ModuleInfo

BASE_NS = 1_700_000_000_000_000_000
ALL_GATHER = dataclasses.replace(
    ALL_REDUCE, name="c10d._allgather_base_", op="all_gather", input_shape=(4, 8), output_shape=(8, 8), reduce_op=""
)


def _program(late_ns: int, shape: tuple[int, ...], stop_after: int | None = None):  # type: ignore[no-untyped-def]
    def run(observer) -> None:  # type: ignore[no-untyped-def]
        calls = [ALL_REDUCE, dataclasses.replace(ALL_GATHER, input_shape=shape), ALL_REDUCE, ALL_REDUCE]
        for i, info in enumerate(calls[:stop_after]):
            observer.on_module_enter(ModuleInfo(f"layers.{i}", f"layers.{i}", "Block"), "forward")
            start = BASE_NS + i * 10_000_000 + late_ns
            ticket = observer.on_collective_issue(info, start)
            observer.on_collective(info, start, start + 2000, None, None, ticket)
            observer.on_module_exit(f"layers.{i}", "forward")

    return run


def _write_both(tmp_path: Path, monkeypatch, rank: int, program) -> tuple[Path, Path]:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("RANK", str(rank))
    spans, compact = tmp_path / f"spans_rank{rank}.json", tmp_path / f"collectives_rank{rank}.json"
    with CommDebugMode() as mode:
        program(mode.observer)
    mode.write_spans(spans)
    mode.write_collectives(compact)
    # The default provider's resource keeps the rank of the first window in this process: name each file's own.
    spans.write_text(re.sub(r'("hp_otel.rank", "value": \{"intValue": )"\d+"', rf'\1"{rank}"', spans.read_text()))
    payload = json.loads(compact.read_text())
    payload["resource"]["hp_otel.rank"] = rank
    compact.write_text(json.dumps(payload))
    return spans, compact


def _without_paths(report: dict) -> dict:  # type: ignore[type-arg]
    for f in report["files"]:
        f.pop("path")
    return report


def test_ranks_says_the_same_from_collectives_files_as_from_spans_files(tmp_path, monkeypatch) -> None:
    programs = [_program(0, (4, 8)), _program(3_000_000, (2, 8)), _program(0, (4, 8), stop_after=3)]
    written = [_write_both(tmp_path, monkeypatch, rank, p) for rank, p in enumerate(programs)]
    from_spans = compare_files([str(s) for s, _ in written])
    from_compact = compare_files([str(c) for _, c in written])
    assert _without_paths(report_to_json(from_spans)) == _without_paths(report_to_json(from_compact))
    (group,) = from_compact.groups
    assert group.divergence is not None and group.divergence.seq == 1
    assert from_compact.stragglers[0].rank == 1
    for spans, compact in written:
        assert compact.stat().st_size < spans.stat().st_size / 3  # 4 collectives: every one its own kind


def test_a_mix_of_spans_files_and_collectives_files_is_compared(tmp_path, monkeypatch, capsys) -> None:
    spans, _ = _write_both(tmp_path, monkeypatch, 0, _program(0, (4, 8)))
    _, compact = _write_both(tmp_path, monkeypatch, 1, _program(0, (4, 8), stop_after=3))
    assert cli_main(["ranks", str(spans), str(compact)]) == 3
    assert "hang suspect: rank 1 never reached all_reduce #3 in Module(layers.3)" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda p: p.update(version=99), "this hp_otel reads versions 1, 2"),
        (lambda p: p["calls"][0].__setitem__(0, 7), "a call names kind 7"),
        (lambda p: p["calls"][0].__setitem__(2, "soon"), "not a collectives file hp_otel wrote"),
        (lambda p: p.update(kinds=5), "not a collectives file hp_otel wrote"),
    ],
)
def test_a_damaged_collectives_file_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys, change, message) -> None:
    _, compact = _write_both(tmp_path, monkeypatch, 0, _program(0, (4, 8)))
    payload = json.loads(compact.read_text())
    change(payload)
    compact.write_text(json.dumps(payload))
    assert cli_main(["ranks", str(compact)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hp-otel ranks: ") and message in err and err.count("\n") == 1, err


def test_the_watchdog_can_leave_a_collectives_file(tmp_path) -> None:
    watchdog = HangWatchdog(0.05, str(tmp_path / "collectives_rank{rank}.json"), poll_s=0.01, evidence="collectives")
    with CommDebugMode(watchdog=watchdog) as mode:
        mode.observer.on_collective_issue(ALL_REDUCE, time.time_ns())
        deadline = time.monotonic() + 5
        while not watchdog.written:
            assert time.monotonic() < deadline
            time.sleep(0.01)
    (path,) = watchdog.written
    payload = json.loads(Path(path).read_text())
    assert payload["format"] == "hp_otel.collectives"
    (rank_file,) = compare_files([path]).files
    (call,) = rank_file.calls
    assert call.in_flight and call.op == "all_reduce" and call.seq == 0


def test_evidence_must_be_spans_or_collectives() -> None:
    with pytest.raises(ValueError, match="evidence must be one of 'spans', 'collectives', got 'all'"):
        HangWatchdog(1.0, evidence="all")


_LLAMA = """
import os, sys
from benchmarks.rank_files import record_template
import hp_otel
from hp_otel import CommDebugMode
from hp_otel.workloads.process_groups import fake_process_group
from benchmarks.models.llama import build_llama_step
fake_process_group(16)
model, step = build_llama_step(2, 8)
step()
with CommDebugMode(module=model) as mode:
    step()
    step()
mode.write_spans(os.path.join(sys.argv[1], "spans_rank0.json"))
mode.write_collectives(os.path.join(sys.argv[1], "collectives_rank0.json"))
"""


@pytest.mark.multiprocess  # the llama step in a child (the fake group is process-wide): about 10 s here
def test_on_the_llama_step_the_collectives_file_is_under_a_tenth_of_the_spans_file(tmp_path) -> None:
    root = Path(__file__).resolve().parents[2]  # the repository: `benchmarks` is not installed
    subprocess.run([sys.executable, "-c", _LLAMA, str(tmp_path)], check=True, timeout=300, cwd=root)
    spans, compact = tmp_path / "spans_rank0.json", tmp_path / "collectives_rank0.json"
    ratio = compact.stat().st_size / spans.stat().st_size
    assert ratio <= 0.10, ratio
    (a,), (b,) = compare_files([str(spans)]).files, compare_files([str(compact)]).files
    assert list(a.calls) == list(b.calls) and a.exposure == b.exposure and len(a.calls) == 140
