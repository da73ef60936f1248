"""`hp-otel ranks`'s progress line: files read of total, rate, time left, on one redrawn line."""

from __future__ import annotations

from hp_otel.cli.progress import ReadProgress


def test_the_progress_line_says_files_read_rate_and_time_left(capsys) -> None:
    progress = ReadProgress("ranks")
    progress(1, 4)  # drawn: the first call
    progress(2, 4)  # not redrawn within half a second
    progress(4, 4)  # the last one always is
    progress.done()
    err = capsys.readouterr().err
    lines = err.split("\r")[1:]
    assert len(lines) == 2, err
    assert lines[0].startswith("hp-otel ranks: read 1 of 4 files, ") and " files/s, " in lines[0]
    assert lines[1].startswith("hp-otel ranks: read 4 of 4 files, ") and lines[1].endswith(" 0 s left\x1b[K\n")


def test_nothing_is_drawn_when_no_file_was_read(capsys) -> None:
    ReadProgress("ranks").done()
    assert capsys.readouterr().err == ""
