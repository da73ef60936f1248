"""The step loop's collectives file (`collectives_dir=`, `HP_OTEL_COLLECTIVES_DIR`): its settings, its
bound, a write that fails, and how `hp-otel ranks` lines up ranks whose files hold different last steps."""

from __future__ import annotations

import json
import logging
import os

import pytest
from events import design_mlp_forward
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider

import hp_otel
from hp_otel.always_on.instrumentation import active_session
from hp_otel.always_on.instrumentor import HpOtelInstrumentor
from hp_otel.analysis import compare_files
from hp_otel.cli import main as cli_main
from hp_otel.mode import registry


def _instrument(**kwargs):  # type: ignore[no-untyped-def]
    """Both providers given: the instrumentor configures no export in the test process."""
    HpOtelInstrumentor().instrument(
        tracer_provider=TracerProvider(shutdown_on_exit=False),
        meter_provider=MeterProvider(metric_readers=[InMemoryMetricReader()]),
        **kwargs,
    )
    return active_session()


@pytest.fixture
def instrument():  # type: ignore[no-untyped-def]
    start = _instrument

    yield start
    HpOtelInstrumentor().uninstrument()


def _steps(steps, rank: int, calls: int = 1) -> None:  # type: ignore[no-untyped-def]
    for n in steps:
        with hp_otel.step(n, run_id="r", rank=rank):
            observer = registry.current_mode.get().observer
            for _ in range(calls):
                design_mlp_forward(observer)


def _windows(path) -> list[str]:  # type: ignore[no-untyped-def]
    """The steps the file keeps: its last `keep` windows (appended since its last rewrite: up to twice that)."""
    payload = json.loads(path.read_text())
    keep, windows = payload["keep"], payload["windows"]
    assert len(windows) <= 2 * keep
    return [w["kinds"][0]["hp_otel.collective.window"] for w in windows[-keep:]]


def test_the_file_keeps_the_last_steps_and_ranks_reads_them(tmp_path, instrument) -> None:
    session = instrument(collectives_dir=str(tmp_path / "c"), collectives_steps=2)
    _steps(range(5), rank=0)
    path = tmp_path / "c" / "collectives-rank0.json"
    assert _windows(path) == ["step 3", "step 4"] and session.collectives.written == 5
    (f,) = compare_files([str(path)]).files
    assert f.ring and [(c.window, c.seq, c.op) for c in f.calls] == [
        ("step 3", 0, "all_reduce"),
        ("step 4", 0, "all_reduce"),
    ]


def test_the_folder_and_steps_come_from_the_environment(tmp_path, instrument, monkeypatch) -> None:
    monkeypatch.setenv("HP_OTEL_COLLECTIVES_DIR", str(tmp_path / "env"))
    monkeypatch.setenv("HP_OTEL_COLLECTIVES_STEPS", "3")
    instrument()
    _steps(range(4), rank=2)
    assert _windows(tmp_path / "env" / "collectives-rank2.json") == ["step 1", "step 2", "step 3"]


def test_without_a_folder_no_file_is_written(tmp_path, instrument, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert instrument().collectives is None
    _steps(range(2), rank=0)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"collectives_dir": "x", "collectives_steps": 0}, ValueError, "collectives_steps must be a number of steps"),
        ({"collectives_dir": "x", "collectives_steps": True}, ValueError, "collectives_steps must be a number"),
        ({"collectives_dir": 5}, TypeError, "collectives_dir must be a folder path"),
        ({"collectives_steps": "many"}, ValueError, "collectives_steps must be a number of steps 1..1000"),
    ],
)
def test_bad_arguments_are_refused_by_name(tmp_path, monkeypatch, kwargs, error, message) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(error, match=message):
        _instrument(**kwargs)
    assert active_session() is None


def test_a_bad_setting_is_logged_and_training_goes_on(tmp_path, instrument, monkeypatch, caplog) -> None:
    monkeypatch.setenv("HP_OTEL_COLLECTIVES_DIR", str(tmp_path / "env"))
    monkeypatch.setenv("HP_OTEL_COLLECTIVES_STEPS", "-2")
    with caplog.at_level(logging.WARNING, logger="hp_otel"):
        assert instrument().collectives is None
    assert (
        "HP_OTEL_COLLECTIVES_STEPS must be a number of steps 1..1000, got '-2'; writing no collectives" in caplog.text
    )
    _steps(range(1), rank=0)


def test_a_write_that_fails_is_counted_logged_once_and_training_goes_on(tmp_path, instrument, caplog) -> None:
    folder = tmp_path / "c"
    session = instrument(collectives_dir=str(folder))
    folder.rmdir()  # the folder went away under the run
    with caplog.at_level(logging.WARNING, logger="hp_otel"):
        _steps(range(3), rank=0)
    assert session.collectives.faults == 3 and session.collectives.written == 0
    assert caplog.text.count("writing the step's collectives file") == 1


def _ring(tmp_path, rank: int, steps, collectives_steps: int = 3):  # type: ignore[no-untyped-def]
    _instrument(collectives_dir=str(tmp_path), collectives_steps=collectives_steps)
    try:
        _steps(steps, rank)
    finally:
        HpOtelInstrumentor().uninstrument()
    return str(tmp_path / f"collectives-rank{rank}.json")


def test_files_whose_rings_moved_on_are_compared_on_the_steps_all_hold(tmp_path) -> None:
    # rank 0 ended step 5, rank 1 only step 4: rank 0's ring no longer holds step 2, rank 1's still does
    paths = [_ring(tmp_path, 0, range(6)), _ring(tmp_path, 1, range(5))]
    report = compare_files(paths)
    assert [g.window for g in report.groups] == ["step 3", "step 4", "step 5"]  # step 2: not in every file
    assert report.notes == [
        "the step loops' files keep each rank's last steps: compared from step 3 on, which every file holds "
        "(step 2 left out)"
    ]
    (late,) = [g for g in report.groups if not g.agree]
    assert late.window == "step 5" and [(m.rank, m.seq) for m in late.missing] == [(1, 0)]  # never reached


def test_the_same_last_steps_agree(tmp_path, capsys) -> None:
    paths = [_ring(tmp_path, r, range(4)) for r in (0, 1)]
    assert cli_main(["ranks", *paths]) == 0
    out = capsys.readouterr().out
    assert "left out" not in out


def test_a_step_loop_file_of_another_collective_layout_still_lines_up_by_step(tmp_path) -> None:
    # the rank's steps have two all_reduces in step 1: a desync at seq 1 of step 1, nothing shifted by order
    paths = [_ring(tmp_path, 0, range(3))]
    _instrument(collectives_dir=str(tmp_path), collectives_steps=3)
    try:
        _steps([0], rank=1)
        _steps([1], rank=1, calls=2)
        _steps([2], rank=1)
    finally:
        HpOtelInstrumentor().uninstrument()
    paths.append(str(tmp_path / "collectives-rank1.json"))
    report = compare_files(paths)
    bad = [(g.window, [(m.rank, m.seq) for m in g.missing]) for g in report.groups if not g.agree]
    assert bad == [("step 1", [(0, 1)])] and report.notes == []
