"""`hp-otel ranks`'s text lists ranks as ranges (`0-511 except 17`), never one by one, each list
bounded by `--top` runs whatever the world: the report of 512 ranks on one world-sized group.

The expected lines are written by hand; for the scattered case (files of the primes below 512)
the referee is the set of ranks given: every run a list shows must hold only such ranks, and
the count it ends with must be theirs.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from hp_otel.cli import main
from hp_otel.common.rank_set import RankSet
from hp_otel.spans import groups, schema

WORLD = 512
PRIMES = [n for n in range(2, WORLD) if all(n % d for d in range(2, int(n**0.5) + 1))]


def _files(folder: Path, ranks: list[int]) -> list[str]:
    """A collectives file per rank: one all_reduce (seq 0) on the world group, in window 0."""
    world = groups.group("0", RankSet(((0, WORLD - 1, 1),)))
    paths = []
    for rank in ranks:
        kind = {
            schema.CALL_KIND: schema.KIND_COLLECTIVE,
            schema.COLLECTIVE_NAME: "all_reduce",
            schema.COLLECTIVE_OP: "all_reduce",
            schema.COLLECTIVE_GROUP_ID: world.id,
            schema.COLLECTIVE_GROUP_SIZE: WORLD,
            schema.COLLECTIVE_INPUT_SHAPE: [8],
            schema.COLLECTIVE_WINDOW: "window 0",
        }
        payload = {
            "format": "hp_otel.collectives",
            "version": 2,
            "resource": {schema.RESOURCE_RANK: rank, schema.RESOURCE_WORLD_SIZE: WORLD},
            "groups": {world.id: world.to_json()},
            "kinds": [kind],
            "calls": [[0, "all_reduce", 1000 + rank, 2000 + rank, {schema.COLLECTIVE_SEQ: 0}]],
        }
        path = folder / f"collectives_rank{rank}.json"
        path.write_text(json.dumps(payload))
        paths.append(str(path))
    return paths


def _text(argv: list[str], capsys) -> list[str]:  # type: ignore[no-untyped-def]
    main(["ranks", *argv])
    return capsys.readouterr().out.splitlines()


def test_one_missing_rank_reads_as_the_range_except_it(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    lines = _text(_files(tmp_path, [r for r in range(WORLD) if r != 17]), capsys)
    assert lines[0] == f"ranks 0-511 except 17: {WORLD - 1} files, {WORLD - 1} collectives, 1 group windows"
    assert "note: no file for ranks 17 of world size 512: they are not compared" in lines
    assert "group 0 (ranks 0-511), window 0: agree (1 collectives reached by every rank)" in lines
    assert "  no file for ranks 17 (not compared)" in lines
    assert lines[-1] == "verdict: INCOMPLETE: the 511 ranks given agree, but ranks 17 have no file (exit status 4)"


def test_four_ranks_are_a_range_too(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    lines = _text(_files(tmp_path, [0, 1, 2, 3]), capsys)
    assert lines[0] == "ranks 0-3: 4 files, 4 collectives, 1 group windows"
    assert "note: no file for ranks 4-511 of world size 512: they are not compared" in lines


def _shown_runs(text: str) -> tuple[list[str], int | None]:
    """The runs a cut list shows and the count it ends with (`2,3-7:2,... (97 ranks in 70 runs)`)."""
    found = re.fullmatch(r"(.*?)(?:,\.\.\. \((\d+) ranks in \d+ runs\))?", text)
    assert found is not None
    return found.group(1).split(","), int(found.group(2)) if found.group(2) else None


def test_scattered_ranks_are_cut_at_top_runs_and_counted(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    files = _files(tmp_path, PRIMES)
    for top in (1, 3, 5):
        lines = _text(["--top", str(top), *files], capsys)
        head = re.fullmatch(r"ranks (.*): (\d+) files, .*", lines[0])
        assert head is not None and int(head.group(2)) == len(PRIMES)
        runs, count = _shown_runs(head.group(1))
        assert len(runs) == top and count == len(PRIMES)  # at most --top runs, then how many ranks in all
        assert set(RankSet.parse(",".join(runs))) <= set(PRIMES)  # every run shown holds given ranks only
        note = next(line for line in lines if line.startswith("note: no file for ranks "))
        absent = note.removeprefix("note: no file for ranks ").split(" of world size")[0]
        if " except " in absent:  # 0-511 except the primes, themselves cut at --top runs
            absent = absent.split(" except ")[1]
        runs, count = _shown_runs(absent)
        assert len(runs) <= top and count is not None
        assert max(len(line) for line in lines) < 200  # one line whatever the world
