"""`hp-otel ranks` at scale: the single-parse reader and columnar comparison give today's report.

The reference is the code as it was before (tests/support/ranks_before: protobuf reader,
RankCall lists), frozen; the files are the scale harness's (llama step on torch's fake
process group, re-keyed per rank of a DP x TP mesh, a hang, a desync and a straggler
planted), made in a child process (the fake group is process-wide).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from ranks_before.comparing import compare_files as compare_before
from ranks_before.reporting import format_report as format_before
from ranks_before.reporting import report_to_json as json_before

from hp_otel.analysis import compare_files, format_report, report_to_json
from hp_otel.cli import main as cli_main
from hp_otel.common.rank_set import RankSet

_MAKE = """
import json, sys
from benchmarks.rank_files import plant_faults, record_template, split_template, write_rank_files
folder, ranks, tp = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
template = split_template(record_template(tp), tp)
faults = plant_faults(ranks, tp, template.tp_seqs)
write_rank_files(template, folder, ranks, faults, 2)
print(json.dumps(faults.to_json()))
"""


def _make_files(folder: Path, ranks: int, tp: int) -> tuple[list[str], dict[str, int]]:
    done = subprocess.run(
        [sys.executable, "-c", _MAKE, str(folder), str(ranks), str(tp)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
        cwd=Path(__file__).resolve().parents[2],  # the repository: `benchmarks` is not installed
    )
    return [str(folder / f"spans_rank{r}.json") for r in range(ranks)], json.loads(done.stdout)


def _first_difference(before: Any, after: Any, path: str = "report") -> str | None:
    """Where two JSON values first differ (None: equal), walked field by field."""
    if type(before) is not type(after):
        return f"{path}: {type(before).__name__} {before!r:.200} != {type(after).__name__} {after!r:.200}"
    if isinstance(before, dict):
        if before.keys() != after.keys():
            return f"{path}: keys {sorted(before.keys() ^ after.keys())} on one side only"
        for key in before:
            found = _first_difference(before[key], after[key], f"{path}.{key}")
            if found:
                return found
        return None
    if isinstance(before, list):
        if len(before) != len(after):
            return f"{path}: {len(before)} items != {len(after)}"
        for i, (b, a) in enumerate(zip(before, after, strict=True)):
            found = _first_difference(b, a, f"{path}[{i}]")
            if found:
                return found
        return None
    return None if before == after else f"{path}: {before!r:.200} != {after!r:.200}"


def _runs_in_lists(report: dict[str, Any]) -> dict[str, Any]:
    """The reference's report with its rank lists as today's report gives them: strided runs (RankSet text)."""
    report["missing_ranks"] = str(RankSet.of(report["missing_ranks"]))
    for g in report["groups"]:
        for key in ("group_ranks", "ranks", "absent_ranks"):
            g[key] = str(RankSet.of(g[key]))
        for m in g["missing"]:
            m["issued_by"], m["in_flight_on"] = str(RankSet.of(m["issued_by"])), str(RankSet.of(m["in_flight_on"]))
    return report


def _as_ranges(text: str, top: int = 5) -> str:
    """The reference's text with each rank list (`ranks 0,2,4,6`) as today's ranges."""
    from hp_otel.analysis.listing import ranks_listed

    return re.sub(r"(?<=\brank )(\d+(?:,\d+)+)|(?<=\branks )(\d+(?:,\d+)+)",
                  lambda m: ranks_listed([int(r) for r in m.group(0).split(",")], top), text)  # fmt: skip


def _assert_same_as_before(files: list[str], faults: dict[str, int], jobs: int) -> tuple[Any, Any]:
    before = compare_before(files)
    after = compare_files(files, jobs=jobs)
    old, new = _runs_in_lists(json_before(before)), report_to_json(after, per_collective=True)
    assert new.pop("per_collective") is True
    assert _first_difference(old, new) is None, _first_difference(old, new)
    # the planted faults are what both name (a check of the harness, not only of the sameness)
    assert any(m["rank"] == faults["hang_rank"] for g in new["groups"] for m in g["missing"])
    assert [g["divergence"]["seq"] for g in new["groups"] if g["divergence"]] == [faults["desync_seq"]]
    assert new["stragglers"][0]["rank"] == faults["straggler_rank"]
    return before, after


@pytest.mark.multiprocess  # the llama step recorded in a child, and the old reader: about 20 s here
def test_the_report_of_8_ranks_is_today_s_field_by_field_and_in_text(tmp_path: Path) -> None:
    files, faults = _make_files(tmp_path, 8, 2)
    before, after = _assert_same_as_before(files, faults, jobs=2)
    # 8 ranks: nothing is cut from the text; only its rank lists are ranges now (`0-7`, not `0,1,...,7`:
    # their form is tests/analysis/test_ranks_rank_lists.py's, against lines written by hand)
    assert format_report(after) == _as_ranges(format_before(before))
    assert report_to_json(compare_files(files, jobs=1), per_collective=True) == report_to_json(
        after, per_collective=True
    )


@pytest.mark.multiprocess  # the old reader takes about 0.45 s a file: about 40 s here
def test_the_report_of_64_ranks_is_today_s_field_by_field(tmp_path: Path, capsys) -> None:
    files, faults = _make_files(tmp_path, 64, 8)
    _assert_same_as_before(files, faults, jobs=2)
    # The default JSON does not list each collective: it grows with the ranks, not ranks x collectives.
    assert cli_main(["ranks", "--json", *files]) == 3
    default = json.loads(capsys.readouterr().out)
    assert "skews" not in default["groups"][0] and "collectives" not in default["bandwidth"]
    assert len(default["largest_skews"]) == 5
    # recorded on torch's fake process group, whose collectives are left untimed: no bandwidth to list
    assert default["bandwidth"]["slowest_collectives"] == []
    assert all("by_module" not in e for f in default["files"] for e in f["exposure"].values())
    assert default["largest_skews"][0]["last_rank"] == faults["straggler_rank"]
    assert cli_main(["ranks", "--json", "--per-collective", *files]) == 3
    full = json.loads(capsys.readouterr().out)
    assert len(json.dumps(default)) * 5 < len(json.dumps(full))
    text_lines = format_report(compare_files(files, jobs=2)).splitlines()
    # 64 ranks, 16 groups: each table cut at 16 rows (the exposure rows with their phases), the rest --json
    assert len(text_lines) < 250, len(text_lines)
    assert "  ... and 48 more ranks (--json lists every one)" in text_lines
    assert f"hang suspect: rank {faults['hang_rank']} never reached" in "\n".join(text_lines)
