"""Bad input at every public entry point: a clear error naming the argument and what is
allowed, and nothing already recorded is lost."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from events import design_mlp_forward
from torch import nn

from hp_otel import CommDebugMode, testing
from hp_otel.cli import main
from hp_otel.render.table import render_table
from hp_otel.spans.otlp_json import SpanFileError, read_spans, write_spans

UNWRITABLE_FOLDER = "/proc/hp_otel_cannot_write_here"  # exists-check passes for /proc, creating a file fails


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 16)


@pytest.fixture
def recorded() -> CommDebugMode:
    with CommDebugMode(module=Model()) as mode:
        design_mlp_forward(mode.observer)
    return mode


def _calls(tmp: Path) -> list[tuple[str, Callable[[CommDebugMode], object], type[BaseException], str]]:
    spans_file = tmp / "spans.json"
    return [
        # constructor
        ("module not a module", lambda m: CommDebugMode(module=3), TypeError, r"module must be a torch.nn.Module"),
        ("max_spans negative", lambda m: CommDebugMode(max_spans=-5), ValueError, r"max_spans must be a non-negative"),
        ("max_spans bool", lambda m: CommDebugMode(max_spans=True), ValueError, r"max_spans must be a non-negative"),
        ("max_spans float", lambda m: CommDebugMode(max_spans=1.5), ValueError, r"max_spans must be a non-negative"),
        ("tracer_provider", lambda m: CommDebugMode(tracer_provider="otlp"), TypeError, r"tracer_provider must be"),
        ("meter_provider", lambda m: CommDebugMode(meter_provider=object()), TypeError, r"meter_provider must be"),
        ("live_spans", lambda m: CommDebugMode(live_spans=1), TypeError, r"live_spans must be True, False or None"),
        # queries and outputs
        ("normalized", lambda m: m.get_comm_counts(normalized="yes"), TypeError, r"normalized must be True or False"),
        ("noise_level 7", lambda m: m.generate_comm_debug_tracing_table(7), ValueError, r"noise_level must be one of"),
        ("noise_level str", lambda m: m.generate_tracing_table("2"), ValueError, r"noise_level must be one of 0, 1"),
        (
            "noise_level of the file",
            lambda m: m.log_comm_debug_tracing_table_to_file(tmp / "t.txt", noise_level=-1),
            ValueError,
            r"noise_level must be one of",
        ),
        ("json noise_level", lambda m: m.generate_json_dump(tmp / "d.json", 1.0), ValueError, r"noise_level must be"),
        ("file_name int", lambda m: m.generate_json_dump(42), TypeError, r"file_name must be a non-empty path"),
        ("file_name empty", lambda m: m.log_comm_debug_tracing_table_to_file(""), TypeError, r"file_name must be"),
        (
            "file_name missing folder",
            lambda m: m.generate_json_dump(tmp / "nope" / "d.json"),
            FileNotFoundError,
            r"file_name: folder .* does not exist",
        ),
        ("file_name folder", lambda m: m.generate_json_dump(tmp), IsADirectoryError, r"file_name: .* is a directory"),
        (
            "file_name unwritable",
            lambda m: m.log_comm_debug_tracing_table_to_file(UNWRITABLE_FOLDER),
            OSError,
            r"file_name: cannot write '/proc/hp_otel_cannot_write_here'",
        ),
        (
            "json file_name unwritable",
            lambda m: m.generate_json_dump(UNWRITABLE_FOLDER),
            OSError,
            r"file_name: cannot write",
        ),
        # spans files and rendering
        ("read_spans int", lambda m: read_spans(3), TypeError, r"path must be a non-empty path"),
        ("read_spans folder", lambda m: read_spans(tmp), SpanFileError, r"cannot be read"),
        ("read_spans bad ids", lambda m: read_spans(_write(spans_file, _BAD_IDS)), SpanFileError, r"not hex"),
        ("read_spans binary", lambda m: read_spans(_write_bytes(spans_file)), SpanFileError, r"cannot be read"),
        ("write_spans spans", lambda m: write_spans(tmp / "s.json", [1, 2]), TypeError, r"spans must be a sequence"),
        ("write_spans path", lambda m: write_spans(None, ()), TypeError, r"path must be a non-empty path"),
        ("write_spans unwritable", lambda m: write_spans(UNWRITABLE_FOLDER, ()), OSError, r"path: cannot write"),
        ("render_table level", lambda m: render_table(m.get_finished_spans(), 9), ValueError, r"noise_level must be"),
        # the test toolkit
        (
            "assert_collective_counts expected",
            lambda m: testing.assert_collective_counts(m, {"all_reduce": "2"}),
            TypeError,
            r"expected must map collective names",
        ),
        ("span source", lambda m: testing.span_outline(42), TypeError, r"source must be a CommDebugMode"),
        ("span kinds", lambda m: testing.span_outline(m, kinds=["module", "ops"]), ValueError, r"kinds: unknown"),
        ("span phase", lambda m: testing.span_outline(m, phase="fwd"), ValueError, r"phase must be 'forward'"),
        ("span tree expected", lambda m: testing.assert_span_tree(m, ["MLP"]), TypeError, r"expected must be"),
    ]


_BAD_IDS = '{"resourceSpans": [{"scopeSpans": [{"spans": [{"name": "x", "spanId": "not-hex"}]}]}]}'


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _write_bytes(path: Path) -> Path:
    path.write_bytes(b"\xff\xfe\x00garbage")
    return path


_IDS = [c[0] for c in _calls(Path("/tmp"))]


@pytest.mark.parametrize("index", range(len(_IDS)), ids=_IDS)
def test_bad_input_gets_a_clear_error_and_keeps_records(recorded: CommDebugMode, tmp_path, index: int) -> None:
    _, call, error, message = _calls(tmp_path)[index]
    spans_before = recorded.get_finished_spans()
    with pytest.raises(error, match=message):
        call(recorded)
    assert recorded.get_comm_counts() == {"differentiable_all_reduce": 1}
    assert recorded.get_finished_spans() == spans_before
    leftovers = [f for f in os.listdir(tmp_path) if ".hp_otel" in f]
    assert leftovers == []  # no temporary file left by a failed write


def test_wrong_types_into_the_observer_never_raise(recorded: CommDebugMode) -> None:
    with CommDebugMode() as mode:
        obs = mode.observer
        design_mlp_forward(obs)
        obs.on_collective("not a CollectiveInfo", 0, 1)  # type: ignore[arg-type]
        obs.on_op_enter("linear", 5)  # type: ignore[arg-type]
        obs.on_op_exit("linear", None)  # type: ignore[arg-type]
        obs.on_module_enter(None, "sideways")  # type: ignore[arg-type]
        obs.on_redistribute_enter(1, 2, "shape")  # type: ignore[arg-type]
        obs.on_redistribute_exit()
    assert mode.get_total_counts() == 1  # the valid collective; the broken one is a counted fault
    faults = mode.get_callback_error_counts()
    assert faults.get("collective") == 1
    assert faults.get("span_build", 0) >= 1
    assert mode.generate_comm_debug_tracing_table(1).count("Collective(") == 1


def test_cli_rejects_bad_arguments(capsys, tmp_path) -> None:
    from benchmarks.command import main as benchmarks_main

    for run, argv, message in (
        (benchmarks_main, ["--rounds", "0"], "must be a positive integer"),
        (benchmarks_main, ["--scale", "--spans", "x"], "must be a positive integer"),
        (main, ["render", str(tmp_path), "--noise-level", "1"], None),
    ):
        if message is None:
            assert run(argv) == 2
            assert "cannot be read" in capsys.readouterr().err
            continue
        with pytest.raises(SystemExit) as exc:
            run(argv)
        assert exc.value.code == 2
        assert message in capsys.readouterr().err
