"""`python -m benchmarks --ranks N`: the scale harness names every fault it plants."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.command import main
from hp_otel.common.rank_set import RankSet


@pytest.mark.bench  # records the llama step, writes 1,024 files (~1 MB or 71 kB), reads them twice: 1-4 min here
@pytest.mark.parametrize("evidence", ["spans", "collectives"])
def test_at_1024_ranks_the_harness_names_the_hang_the_desync_and_the_straggler(tmp_path, evidence) -> None:
    command = ["--ranks", "1024", "--json", "--keep-files", str(tmp_path), "--evidence", evidence]
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", *command],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=Path(__file__).resolve().parents[2],  # the repository: benchmarks/ is not installed
    )
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout)
    assert result["found"] == {"hang": True, "desync": True, "straggler": True}
    assert result["exit_status"] == 3  # the ranks diverge
    assert len(list(tmp_path.glob(f"{evidence}_rank*.json"))) == 1024 and result["evidence"] == evidence
    # the harness's own check of the report, redone here from the report itself
    report = subprocess.run(
        [sys.executable, "-m", "hp_otel.cli", "ranks", "--json", *map(str, sorted(tmp_path.glob("*.json")))],
        capture_output=True,
        text=True,
        timeout=600,
    )
    groups = json.loads(report.stdout)["groups"]
    faults = result["faults"]
    (hang_group,) = [g for g in groups if any(m["rank"] == faults["hang_rank"] for m in g["missing"])][:1]
    members = RankSet.parse(hang_group["group_ranks"])
    assert faults["hang_rank"] in members and len(members) == 8
    (diverged,) = [g for g in groups if g["divergence"]]
    assert diverged["divergence"]["seq"] == faults["desync_seq"]
    assert json.loads(report.stdout)["stragglers"][0]["rank"] == faults["straggler_rank"]


@pytest.mark.parametrize("argv", [["--ranks", "20"], ["--ranks", "16"], ["--ranks", "24", "--tp", "5"]])
def test_a_mesh_it_cannot_plant_three_faults_in_is_exit_status_2(argv, capsys) -> None:
    assert main([*argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m benchmarks: --ranks must be a multiple of --tp") and err.count("\n") == 1
