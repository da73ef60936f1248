"""`hp-otel ranks` refuses what cannot be a rank's file (a rank outside its world, a world of 0),
says there is nothing to compare over files without collectives, and stays small on a group of
millions of ranks (its members are runs, and a malformed member list is one short line)."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hp_otel.analysis import compare_files, format_report, report_to_json
from hp_otel.analysis.listing import ranks_text
from hp_otel.cli import main as cli_main
from hp_otel.common.rank_set import RankSet

pytestmark = pytest.mark.torch_free

GROUP = "beb59cb2f846"


def _collectives(rank: int, world_size: int | None = 2, members: Any = "0-1", calls: int = 2) -> dict[str, Any]:
    """A collectives file as `CommDebugMode.write_collectives` writes one: `calls` all_reduces on one group."""
    resource: dict[str, Any] = {"hp_otel.rank": rank}
    if world_size is not None:
        resource["hp_otel.world.size"] = world_size
    kind = {
        "hp_otel.call.kind": "collective",
        "hp_otel.collective.name": "_c10d_functional.all_reduce",
        "hp_otel.collective.op": "all_reduce",
        "hp_otel.collective.group.id": GROUP,
        "hp_otel.collective.group.size": world_size or 2,
        "hp_otel.collective.input.shape": [4, 16],
        "hp_otel.collective.output.shape": [4, 16],
        "hp_otel.collective.dtype": "torch.float32",
        "hp_otel.collective.input.size": 256,
        "hp_otel.collective.reduce.op": "sum",
        "hp_otel.collective.async": False,
        "hp_otel.collective.completion": "call",
        "hp_otel.collective.window": "window 0",
        "hp_otel.collective.module": "layers.0",
        "hp_otel.phase": "forward",
    }
    return {
        "format": "hp_otel.collectives",
        "version": 2,
        "resource": resource,
        "groups": {GROUP: {"name": "0", "members": members}},
        "kinds": [kind],
        "calls": [
            [
                0,
                "all_reduce",
                1_700_000_000_000_000_000 + seq * 1000,
                1_700_000_000_000_000_500 + seq * 1000,
                {"hp_otel.collective.seq": seq},
            ]
            for seq in range(calls)
        ],
    }


def _write(folder: Path, payloads: list[dict[str, Any]]) -> list[str]:
    paths = []
    for i, payload in enumerate(payloads):
        path = folder / f"collectives_{i}.json"
        path.write_text(json.dumps(payload))
        paths.append(str(path))
    return paths


def test_the_fixture_is_a_file_ranks_compares(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["ranks", *_write(tmp_path, [_collectives(0), _collectives(1)])]) == 0
    assert "ranks agree" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("rank", "world_size", "field", "allowed"),
    [
        (7, 2, "hp_otel.rank 7 is not below its hp_otel.world.size 2", "0-1"),
        (-1, 2, "hp_otel.rank is -1", "0 or more"),
        (0, 0, "hp_otel.world.size is 0", "1 or more"),
    ],
)
def test_a_rank_outside_its_world_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], rank: int, world_size: int, field: str, allowed: str
) -> None:
    paths = _write(tmp_path, [_collectives(rank if rank != 0 else 1, world_size), _collectives(0, world_size)])
    assert cli_main(["ranks", *paths]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert paths[0] in err and field in err and allowed in err, err


def test_files_without_collectives_are_nothing_to_compare_not_agree(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    paths = _write(tmp_path, [_collectives(0, calls=0), _collectives(1, calls=0)])
    assert cli_main(["ranks", *paths]) == 2
    out, err = capsys.readouterr()
    assert "agree" not in out
    assert err.count("\n") == 1 and "nothing to compare" in err and "2 files" in err, err


MILLIONS = 3_000_000


def test_a_group_of_3_million_ranks_is_reported_small(tmp_path: Path) -> None:
    paths = _write(
        tmp_path, [_collectives(r, MILLIONS, f"0-{MILLIONS - 1}") for r in (0, 1)]
    )  # members as runs, as hp_otel writes them
    report = compare_files(paths)
    text = format_report(report)
    as_json = json.dumps(report_to_json(report, False, 5))
    assert report.missing_ranks  # 2,999,998 ranks have no file: said, as runs
    assert len(text) < 10_000 and len(as_json) < 20_000, (len(text), len(as_json))


def test_a_group_of_3_million_ranks_costs_its_runs_not_its_members(tmp_path: Path) -> None:
    """The ranks without a file are found by run arithmetic: `hp-otel ranks` stays small and quick
    (listing the members took 652 MB and 6.2 s here)."""
    paths = _write(tmp_path, [_collectives(r, MILLIONS, f"0-{MILLIONS - 1}") for r in (0, 1)])
    probe = (  # VmHWM: this process's own peak (ru_maxrss would carry the forking test process's)
        "import re, sys; from hp_otel.cli import main; status = main(['ranks', '--json', *sys.argv[1:]]); "
        "peak = re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1); "
        "print(int(peak) // 1024, status, file=sys.stderr)"
    )
    done = subprocess.run([sys.executable, "-c", probe, *paths], capture_output=True, text=True, timeout=120)
    peak_mb, status = map(int, done.stderr.split()[-2:])
    assert status == 4 and json.loads(done.stdout)["missing_ranks"] == f"2-{MILLIONS - 1}"
    assert peak_mb < 150, peak_mb


def test_a_member_list_of_3_million_ranks_is_one_short_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Members as a JSON list (not what hp_otel writes): refused in one line, not echoed back (it was 26 MB)."""
    paths = _write(tmp_path, [_collectives(r, MILLIONS, list(range(MILLIONS))) for r in (0, 1)])
    assert cli_main(["ranks", paths[0], paths[1]]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and len(err) < 500 and paths[0] in err, err[:1000]


def test_missing_ranks_read_the_same_from_runs_as_from_the_list() -> None:
    rng = random.Random(3)
    for _ in range(2_000):
        ranks = sorted(rng.sample(range(60), rng.randint(0, 40)))
        listed, runs = ranks_text(ranks), ranks_text(RankSet.of(ranks))
        assert runs == listed or (":" in runs and tuple(RankSet.parse(runs)) == tuple(ranks)), (ranks, runs)
    assert ranks_text(RankSet.parse(f"0-16,18-{MILLIONS - 1}")) == f"0-16,18-{MILLIONS - 1}"
