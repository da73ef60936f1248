"""Communication snapshots: a test fails when its step communicates differently from the committed snapshot.

`assert_comm_snapshot(mode, "snapshots/step.json")` summarises the mode's collectives per
(module, phase, op) with their count and bytes (what `hp-otel diff` compares) and

- writes the snapshot when the file does not exist yet, or when updating is asked for
  (`pytest --hp-otel-update-snapshots`, or `HP_OTEL_UPDATE_SNAPSHOTS=1`), with a warning
  naming the file (commit it);
- otherwise compares: a difference fails the test with `hp-otel diff`'s report.

A relative path is relative to the folder of the file that calls `assert_comm_snapshot`
(the test module, as pytest-snapshot and syrupy keep snapshots beside the tests), so the
test passes from any working directory. The file is sorted JSON, one cell a line.
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path
from typing import Any

from hp_otel.analysis.run_diff import (
    BytesTolerance,
    DiffInputError,
    diff_runs,
    format_diff,
    parse_bytes_tolerance,
    read_run,
    snapshot_text,
    summarize_spans,
)
from hp_otel.common.files import write_text_atomically
from hp_otel.testing.assertions import _spans

UPDATE_VARIABLE = "HP_OTEL_UPDATE_SNAPSHOTS"
UPDATE_OPTION = "--hp-otel-update-snapshots"
_session = {"update": False}  # set by the pytest plugin for its session
written: list[Path] = []  # snapshots written in this process (the plugin lists them at the end)


class CommSnapshotWritten(UserWarning):
    """A snapshot was written (first run, or an update): review and commit it."""


def set_update_snapshots(update: bool) -> None:
    """Whether `assert_comm_snapshot` rewrites snapshots instead of comparing (the plugin's option)."""
    if not isinstance(update, bool):
        raise TypeError(f"update must be True or False, got {update!r}")
    _session["update"] = update


def _updating(update: bool | None) -> bool:
    if update is not None:
        if not isinstance(update, bool):
            raise TypeError(f"update must be True, False or None, got {update!r}")
        return update
    return _session["update"] or os.environ.get(UPDATE_VARIABLE, "").strip().lower() in ("1", "true", "yes")


def _resolve(path: Any, depth: int) -> Path:
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
        raise TypeError(f"path must be a non-empty path (str or os.PathLike), got {path!r}")
    target = Path(os.fspath(path))
    if target.is_absolute():
        return target
    caller = Path(sys._getframe(depth).f_code.co_filename)
    return (caller.resolve().parent / target) if caller.is_file() else Path.cwd() / target


def _tolerance(bytes_tolerance: int | str) -> BytesTolerance:
    if isinstance(bytes_tolerance, bool) or not isinstance(bytes_tolerance, (int, str)):
        raise TypeError(f"bytes_tolerance must be bytes (int) or a percentage ('5%'), got {bytes_tolerance!r}")
    return parse_bytes_tolerance(str(bytes_tolerance))


def assert_comm_snapshot(
    source: Any, path: str | os.PathLike[str], *, bytes_tolerance: int | str = 0, update: bool | None = None
) -> None:
    """Assert the step's collectives match the snapshot at `path` (written if missing or when updating).

    `path`: a relative path resolves against the folder of the file that calls this (your test
    module), not the working directory, so the test passes wherever pytest runs; an absolute
    path is used as given.
    `source`: a CommDebugMode (or an exporter / sequence of its finished spans).
    `bytes_tolerance`: bytes a (module, phase, op) may differ by, as bytes (int) or a
    percentage of the snapshot's ("5%"); counts must match exactly. `update`: True
    rewrites, False compares even under the option (a missing snapshot is still written),
    None (default) follows `--hp-otel-update-snapshots` / `HP_OTEL_UPDATE_SNAPSHOTS`.
    """
    __tracebackhide__ = True  # pytest shows the caller's line, not this helper's
    target = _resolve(path, 2)
    tolerance = _tolerance(bytes_tolerance)
    rewrite = _updating(update)
    dropped = getattr(source, "get_dropped_record_count", None)
    if callable(dropped) and dropped():
        raise AssertionError(
            f"the mode turned {dropped()} span(s) away (its max_spans cap): a snapshot of the rest would be wrong; "
            "raise CommDebugMode(max_spans=...) for this test"
        )
    actual = summarize_spans(_spans(source), "this run")
    counts = getattr(source, "get_total_counts", None)
    if callable(counts) and counts() != actual.total().count:
        raise AssertionError(
            f"the mode counted {counts()} collectives but kept {actual.total().count} collective spans: "
            "a snapshot needs the spans (a window that records them)"
        )
    if rewrite or not target.exists():
        _write(target, snapshot_text(actual), "updated" if target.exists() else "wrote")
        return
    try:
        expected = read_run(target)
    except DiffInputError as exc:
        raise AssertionError(f"snapshot {target} cannot be read ({exc}); rewrite it with {UPDATE_OPTION}") from None
    expected.source, actual.source = f"snapshot {target}", "this run"
    diff = diff_runs(expected, actual, tolerance)
    if not diff.same:
        raise AssertionError(
            f"communication differs from the snapshot (A: the snapshot, B: this run):\n{format_diff(diff)}\n"
            f"If the change is intended, rerun with `pytest {UPDATE_OPTION}` (or {UPDATE_VARIABLE}=1), "
            "review the snapshot's diff and commit it."
        )


def _write(target: Path, text: str, verb: str) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomically(target, lambda handle: handle.write(text), argument="path")
    written.append(target)
    warnings.warn(f"hp_otel {verb} the communication snapshot {target}: review and commit it", CommSnapshotWritten, 3)
