"""Files in the names of hp_otel before the rename (`hp.` prefix, `group_size`, `backend`, ...) are read as
today's: `hp-otel ranks` and `hp-otel diff` say the same of a run written in the old names as of the same
run in the new ones (issue 45: old names accepted by every reader for one release)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from test_group_table import _write  # tests/analysis, on the path (pytest prepends it)

from hp_otel.analysis import compare_files, report_to_json
from hp_otel.analysis.run_diff import diff_runs, format_diff, read_run
from hp_otel.spans import schema

pytestmark = pytest.mark.torch_free

OLD = {new: old for old, new in schema.RENAMED.items() if "_ns" not in old and old != "hp.watchdog.waited_s"}


def _in_old_names(text: str) -> str:
    """A file's text with every key written back under its old name (longest names first)."""
    names = sorted(OLD, key=len, reverse=True)
    pattern = re.compile("|".join(re.escape(f'"{n}"') for n in names))
    return pattern.sub(lambda m: f'"{OLD[m.group(0)[1:-1]]}"', text)


@pytest.fixture
def runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    (tmp_path / "new").mkdir()
    new = _write(tmp_path / "new", monkeypatch)
    old = tmp_path / "old"
    old.mkdir()
    for path in new.glob("*_rank*.json"):
        (old / path.name).write_text(_in_old_names(path.read_text()))
    return new, old


def test_the_old_files_really_are_in_the_old_names(runs: tuple[Path, Path]) -> None:
    new, old = runs
    for name in ("spans_rank0.json", "collectives_rank1.json"):
        text = (old / name).read_text()
        assert schema.PREFIX not in text.replace('"hp_otel.collectives"', "").replace('"hp_otel"', ""), name
        assert '"hp.collective.group_size"' in text or '"hp.collective.group_size":' in text
        assert '"hp.rank"' in text
        assert schema.COLLECTIVE_GROUP_SIZE in (new / name).read_text()


@pytest.mark.parametrize("pattern", ["spans_rank*.json", "collectives_rank*.json"])
def test_ranks_says_the_same_of_both(runs: tuple[Path, Path], pattern: str) -> None:
    new, old = runs

    def report(folder: Path) -> str:
        text = json.dumps(report_to_json(compare_files(sorted(str(p) for p in folder.glob(pattern)))), sort_keys=True)
        return text.replace(str(folder), "<run>")

    assert report(old) == report(new)
    assert '"divergence"' in report(new)  # the run has something to say: rank 1's other shape


@pytest.mark.parametrize("pattern", ["spans_rank*.json", "collectives_rank*.json"])
def test_diff_sees_no_difference_between_the_names(runs: tuple[Path, Path], pattern: str, tmp_path: Path) -> None:
    new, old = runs
    for folder in (new, old):
        (tmp_path / f"{folder.name}-{pattern[:5]}").mkdir()
        for path in folder.glob(pattern):
            (tmp_path / f"{folder.name}-{pattern[:5]}" / path.name).write_text(path.read_text())
    a, b = read_run(tmp_path / f"old-{pattern[:5]}"), read_run(tmp_path / f"new-{pattern[:5]}")
    diff = diff_runs(a, b)
    assert diff.same, format_diff(diff)
    assert a.total().count == b.total().count > 0
