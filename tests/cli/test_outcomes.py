"""Outcomes that do not mislead (issue 22, item 3): what a command or a window says when the
input is partial, a pipe closes, a setting is bad or a window saw nothing."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time

import pytest
from events import ALL_REDUCE
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan

from hp_otel import CommDebugMode
from hp_otel.cli import EXIT_BROKEN_PIPE, main
from hp_otel.common import said_once
from hp_otel.spans import schema
from hp_otel.spans.otlp_json import write_spans


def _one_collective_window() -> tuple[ReadableSpan, ...]:
    with CommDebugMode() as mode:
        start = time.time_ns()
        ticket = mode.observer.on_collective_issue(ALL_REDUCE, start)  # group tp = ranks (0, 1)
        mode.observer.on_collective(ALL_REDUCE, start, start + 1000, None, None, ticket)
    return mode.get_finished_spans()


def _rank_files(tmp_path, ranks, world_size):  # type: ignore[no-untyped-def]
    """The same window as each of `ranks`, in a resource that says `world_size` (as a launcher's would)."""
    spans = _one_collective_window()
    paths = []
    for rank in ranks:
        resource = {schema.RESOURCE_RANK: rank, **({schema.RESOURCE_WORLD_SIZE: world_size} if world_size else {})}
        path = tmp_path / f"spans_rank{rank}.json"
        write_spans(
            path,
            [
                ReadableSpan(
                    name=sp.name,
                    context=sp.context,
                    parent=sp.parent,
                    resource=Resource(resource),
                    attributes=dict(sp.attributes),
                    start_time=sp.start_time,
                    end_time=sp.end_time,
                )
                for sp in spans
            ],
        )
        paths.append(str(path))
    return paths


def test_files_for_some_ranks_only_name_the_missing_ranks_and_exit_4(tmp_path, capsys) -> None:
    files = _rank_files(tmp_path, (0, 1), world_size=4)  # ranks 2 and 3 wrote nothing (or were not given)
    assert main(["ranks", *files]) == 4
    out = capsys.readouterr().out
    assert "verdict: ranks agree" not in out
    assert "note: no file for ranks 2,3 of world size 4: they are not compared" in out
    assert out.rstrip().endswith("ranks 2,3 have no file (exit status 4)")
    assert main(["ranks", "--json", *files]) == 4
    report = json.loads(capsys.readouterr().out)
    assert (report["agree"], report["complete"], report["missing_ranks"], report["exit_status"]) == (
        True,
        False,
        "2,3",  # rank lists in the JSON report are runs (RankSet's text)
        4,
    )


def test_a_group_member_without_a_file_is_missing_even_when_no_world_size_is_known(tmp_path, capsys) -> None:
    files = _rank_files(tmp_path, (0,), world_size=None)  # the group is ranks (0, 1): rank 1 has no file
    assert main(["ranks", *files]) == 4
    assert "ranks 1 have no file (exit status 4)" in capsys.readouterr().out


def test_every_rank_given_still_agrees_with_exit_0(tmp_path, capsys) -> None:
    files = _rank_files(tmp_path, (0, 1), world_size=2)
    assert main(["ranks", *files]) == 0
    assert capsys.readouterr().out.rstrip().endswith("verdict: ranks agree")


def _run_into_a_closed_pipe(*argv: str) -> subprocess.CompletedProcess[str]:
    """`hp-otel ARGV | head -0`: the reader is gone before the first byte is written."""
    process = subprocess.Popen(
        [sys.executable, "-m", "hp_otel.cli", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()
    err = process.stderr.read()
    return subprocess.CompletedProcess(process.args, process.wait(timeout=120), "", err)


@pytest.mark.parametrize("command", ["ranks --json", "render", "--help"])
def test_a_closed_pipe_ends_the_command_quietly(tmp_path, command) -> None:
    files = _rank_files(tmp_path, (0, 1), world_size=2)
    argv = command.split() + (files if command == "ranks --json" else files[:1] if command == "render" else [])
    done = _run_into_a_closed_pipe(*argv)
    assert "Traceback" not in done.stderr and "BrokenPipeError" not in done.stderr, done.stderr
    # argparse itself ignores a failed write of --help (exit 0); our commands end with the SIGPIPE status
    assert done.stderr == "" and done.returncode == (0 if command == "--help" else EXIT_BROKEN_PIPE)


def test_a_bad_sampler_lists_each_allowed_sampler_once() -> None:
    from hp_otel.export.config import ConfigError, _check_sampler_environment

    with pytest.raises(ConfigError) as raised:
        _check_sampler_environment(None, None, {"OTEL_TRACES_SAMPLER": "sometimes"})
    allowed = str(raised.value).split("must be one of ")[1].split(", got")[0].split(", ")
    assert "traceidratio" in allowed and len(allowed) == len(set(allowed)), allowed


def test_a_failed_shutdown_is_one_line_without_a_traceback(caplog) -> None:
    from hp_otel.export.telemetry import _bounded

    def fails() -> bool:
        raise Exception(  # what the SDK's MeterProvider.shutdown raises when readers fail
            "MeterProvider.shutdown failed because the following metric readers failed during shutdown:\n"
            'PrometheusMetricReader: Exception("Didn\'t get to execute, deadline already exceeded")'
        )

    with caplog.at_level(logging.WARNING, logger="hp_otel"):
        assert _bounded(fails, 5.0, "shutdown") is False
    (record,) = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert record.exc_info is None and "\n" not in record.getMessage()
    assert record.getMessage().startswith("hp_otel: telemetry shutdown failed: Exception: MeterProvider.shutdown")


def test_a_failure_and_the_timeout_in_the_same_instant_say_one_line(caplog) -> None:
    """CI saw both lines: the SDK's deadline is the same budget, so the worker's failure was still being
    logged when the waiter's join timed out. A handler that is slow on the failure line reproduces that."""
    from hp_otel.export.telemetry import _bounded

    class SlowOnFailure(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "failed:" in record.getMessage():
                time.sleep(0.4)  # the worker is still alive when the waiter's 0.1 s is up

    def fails() -> bool:
        raise Exception("deadline already exceeded")

    slow = SlowOnFailure(level=logging.WARNING)
    logging.getLogger("hp_otel").addHandler(slow)
    try:
        with caplog.at_level(logging.WARNING, logger="hp_otel"):
            assert _bounded(fails, 0.1, "shutdown") is False
            time.sleep(0.5)  # let the worker finish
    finally:
        logging.getLogger("hp_otel").removeHandler(slow)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "shutdown failed" in warnings[0], warnings


@pytest.mark.multiprocess  # a real dead endpoint: the exporter retries until the shutdown budget is spent
def test_shutdown_with_a_dead_endpoint_and_prometheus_says_one_line() -> None:
    script = (
        "import hp_otel\n"
        "t = hp_otel.configure(endpoint='http://127.0.0.1:1', prometheus_port=0, prometheus_host='127.0.0.1',"
        " shutdown_timeout_s=1.0)\n"
        "t.meter_provider.get_meter('x').create_counter('c').add(1)\n"
        "print(hp_otel.shutdown())\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stderr
    ours = [line for line in done.stderr.splitlines() if line.startswith("hp_otel:")]
    assert len(ours) == 1 and "shutdown" in ours[0], done.stderr
    assert "Traceback" not in done.stderr, done.stderr


@pytest.fixture
def nothing_said_yet(monkeypatch):  # type: ignore[no-untyped-def]
    """Each test starts as a fresh process would: nothing said yet (what was said is back after it)."""
    monkeypatch.setattr(said_once, "_said", set())


def _hp_otel_warnings(caplog) -> list[str]:  # type: ignore[no-untyped-def]
    return [r.getMessage() for r in caplog.records if r.name == "hp_otel" and r.levelno == logging.WARNING]


def test_a_window_without_a_process_group_says_why_once(nothing_said_yet, caplog, monkeypatch) -> None:
    import torch
    import torch.distributed as dist

    monkeypatch.setattr(dist, "is_initialized", lambda: False)  # whatever other tests left initialised
    with caplog.at_level(logging.WARNING, logger="hp_otel"):
        for _ in range(3):
            with CommDebugMode() as mode:
                torch.ones(2) + 1
    assert mode.get_comm_counts() == {}
    (message,) = _hp_otel_warnings(caplog)
    assert "saw no collective: torch.distributed has no process group" in message


def test_a_window_whose_module_was_not_called_or_ran_no_dtensor_op_says_so(nothing_said_yet, caplog, tp_mlp) -> None:
    import torch

    model, _ = tp_mlp
    with caplog.at_level(logging.WARNING, logger="hp_otel"):
        with CommDebugMode(module=model):
            torch.ones(2) + 1  # the model is not called
    assert _hp_otel_warnings(caplog) == [
        "hp_otel: a CommDebugMode window saw no collective: the module= given (MLP) was not called inside "
        "the window (said once per process)"
    ]
    said_once.forget("hp_otel.mode")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="hp_otel"):
        with CommDebugMode():
            torch.nn.Linear(2, 2)(torch.ones(2))  # plain tensors
    assert ["no DTensor op ran inside it" in m for m in _hp_otel_warnings(caplog)] == [True]


def test_a_window_with_collectives_says_nothing(nothing_said_yet, caplog, tp_mlp) -> None:
    model, x = tp_mlp
    with caplog.at_level(logging.WARNING, logger="hp_otel"):
        with CommDebugMode(module=model) as mode:
            model(x).sum().backward()
    assert mode.get_total_counts() > 0 and _hp_otel_warnings(caplog) == []


def test_reading_inside_an_open_window_warns_once_that_it_is_partial(nothing_said_yet, caplog, tp_mlp) -> None:
    model, x = tp_mlp
    with caplog.at_level(logging.WARNING, logger="hp_otel"):
        with CommDebugMode(module=model) as mode:
            model(x)
            inside = mode.get_comm_counts()
            mode.generate_comm_debug_tracing_table(noise_level=0)
            model(x).sum().backward()
        after = mode.get_comm_counts()
        mode.generate_comm_debug_tracing_table(noise_level=0)
    (message,) = _hp_otel_warnings(caplog)
    assert message.startswith("hp_otel: get_comm_counts() read inside an open CommDebugMode window is a partial view")
    assert sum(inside.values()) < sum(after.values())  # it was partial indeed


def test_the_torch_drop_in_reads_inside_its_window_silently(nothing_said_yet, caplog, tp_mlp) -> None:
    from hp_otel.torch import CommDebugMode as TorchCommDebugMode

    model, x = tp_mlp
    with caplog.at_level(logging.WARNING, logger="hp_otel"):
        with TorchCommDebugMode() as mode:
            model(x)
            mode.get_comm_counts(include_extra=True)
            mode.generate_comm_debug_tracing_table(noise_level=0)
    assert _hp_otel_warnings(caplog) == []
