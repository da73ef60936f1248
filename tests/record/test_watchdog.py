"""The hang watchdog: a collective that does not complete leaves a file, written off the training thread."""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from events import ALL_REDUCE, collective

from hp_otel import CommDebugMode, HangWatchdog
from hp_otel.record.attribution import of
from hp_otel.record.events import CollectiveIssue
from hp_otel.spans import schema
from hp_otel.spans.infos import ModuleInfo
from hp_otel.spans.otlp_json import read_spans


def _watchdog_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "hp_otel-watchdog"]


def _wait_for(condition, timeout_s: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_collective_that_does_not_return_is_written_from_the_watchdog_thread(tmp_path, caplog) -> None:
    path = tmp_path / "hang_rank{rank}.json"
    watchdog = HangWatchdog(0.2, str(path), poll_s=0.02)
    caplog.set_level(logging.WARNING, logger="hp_otel")
    with CommDebugMode(watchdog=watchdog) as mode:
        observer = mode.observer
        collective(observer)  # completes: not in flight
        observer.on_module_enter(ModuleInfo("layers.1", "layers.1", "Block"), "forward")
        issued_at = time.time_ns()
        ticket = observer.on_collective_issue(ALL_REDUCE, issued_at)
        _wait_for(lambda: watchdog.written)  # the training thread is "blocked" here; the watchdog writes
        observer.on_collective(ALL_REDUCE, issued_at, time.time_ns(), None, None, ticket)  # it returns at last
        observer.on_module_exit("layers.1", "forward")
    written = tmp_path / "hang_rank0.json"
    assert watchdog.written == [str(written)]
    (record,) = [r for r in caplog.records if "has not completed" in r.getMessage()]
    assert record.threadName == "hp_otel-watchdog" != threading.current_thread().name
    assert "all_reduce #1 on group tp (ranks 0,1) in Module(layers.1)" in record.getMessage()
    assert str(written) in record.getMessage()
    spans = {s.attributes[schema.COLLECTIVE_SEQ]: s for s in read_spans(written)}
    assert spans[1].attributes[schema.COLLECTIVE_IN_FLIGHT] is True
    assert spans[1].start_time == issued_at and spans[1].attributes[schema.COLLECTIVE_MODULE] == "layers.1"
    assert schema.COLLECTIVE_IN_FLIGHT not in spans[0].attributes
    raw = json.loads(written.read_text())
    assert "hp_otel.watchdog.dump" in json.dumps(raw)
    # the real span, once it returned, says the watchdog wrote a file while it waited
    (done,) = [s for s in mode.get_finished_spans() if s.attributes.get(schema.COLLECTIVE_SEQ) == 1]
    (event,) = done.events
    assert (event.name, event.attributes[schema.WATCHDOG_PATH]) == (schema.WATCHDOG_EVENT, str(written))
    assert event.attributes[schema.WATCHDOG_WAITED_S] >= 0.2
    assert _watchdog_threads() == []  # stopped with the window
    assert mode.get_callback_error_counts() == {}


def test_the_watchdog_writes_once_per_stuck_collective(tmp_path) -> None:
    watchdog = HangWatchdog(0.05, str(tmp_path / "r{rank}.json"), poll_s=0.01)
    with CommDebugMode(watchdog=watchdog) as mode:
        mode.observer.on_collective_issue(ALL_REDUCE, time.time_ns())
        _wait_for(lambda: watchdog.written)
        time.sleep(0.1)
        assert len(watchdog.written) == 1
        mode.observer.on_collective_issue(ALL_REDUCE, time.time_ns())
        _wait_for(lambda: len(watchdog.written) == 2)
    spans = read_spans(tmp_path / "r0.json")
    assert sorted(s.attributes[schema.COLLECTIVE_SEQ] for s in spans) == [0, 1]


def test_a_functional_collective_is_in_flight_until_it_is_waited_for(tmp_path, fake_world) -> None:
    import torch
    import torch.distributed as dist

    ops = torch.ops._c10d_functional
    group = dist.group.WORLD.group_name
    watchdog = HangWatchdog(60, str(tmp_path / "r{rank}.json"))
    t = torch.ones(4)
    with CommDebugMode(watchdog=watchdog) as mode:
        recorder = mode._recorder
        dist.all_reduce(t)  # eager: the fake group's work is done at once
        out = ops.all_reduce(t, "sum", group)
        recorder.forget_completed()
        assert [(i.info.op, i.seq, i.returned) for i in recorder.in_flight()] == [("all_reduce", 1, True)]
        mode.write_spans(tmp_path / "now.json")
        ops.wait_tensor(out)
        recorder.forget_completed()
        assert recorder.in_flight() == []
    spans = read_spans(tmp_path / "now.json")
    flags = sorted(
        (s.attributes[schema.COLLECTIVE_SEQ], s.attributes.get(schema.COLLECTIVE_IN_FLIGHT, False)) for s in spans
    )
    assert flags == [(0, False), (1, True)]  # written once, as in flight, not also as returned


class _StandInWindow:
    """A window as the watchdog sees it: in-flight collectives and a writer of its spans so far."""

    def __init__(self, issues: list[CollectiveIssue]) -> None:
        self.issues = issues
        self.forgotten = 0
        self.paths: list[str] = []

    def forget_completed(self) -> None:
        self.forgotten += 1

    def in_flight(self) -> list[CollectiveIssue]:
        return list(self.issues)

    def write_spans(self, path: str) -> None:
        self.paths.append(path)


def test_the_watchdog_needs_only_the_in_flight_collectives_and_a_writer(tmp_path) -> None:
    """No CommDebugMode: what the mode hands the watchdog when a window opens is all it uses."""
    issued_at = time.time_ns()
    stuck = CollectiveIssue(issued_at, ALL_REDUCE, 3, of("forward", "layers.0"))
    fresh = CollectiveIssue(issued_at + 10**9, ALL_REDUCE, 4, of("forward", ""))
    window = _StandInWindow([stuck, fresh])
    watchdog = HangWatchdog(0.5, str(tmp_path / "r{rank}.json"), poll_s=60)
    watchdog.start(window, window.write_spans)
    try:
        assert watchdog.check(issued_at + 10**9) == [stuck]  # the other has waited 0 s
        # the quiet time after a write (QUIET_FACTOR x its length) has its own tests; a preemption
        # inside the write would stretch it past the next line, so this test looks again at once
        watchdog._quiet_until = 0.0
        assert watchdog.check(issued_at + 10**9) == []  # written once per stuck collective
    finally:
        watchdog.stop()
    assert window.paths == [str(tmp_path / "r0.json")] == watchdog.written
    assert window.forgotten == 2
    assert (stuck.dumped_to, stuck.waited_s, fresh.dumped_to) == (str(tmp_path / "r0.json"), 1.0, "")
    assert watchdog.check(issued_at + 10**10) == []  # stopped: it holds nothing of the window


def test_the_mode_asks_for_completion_only_while_its_watchdog_watches(tmp_path) -> None:
    mode = CommDebugMode(watchdog=HangWatchdog(60, str(tmp_path / "r{rank}.json")))
    assert mode.observer.wants_completion is False
    with mode:
        assert mode.observer.wants_completion is True
    assert mode.observer.wants_completion is False
    with CommDebugMode() as plain:
        assert plain.observer.wants_completion is False


def test_without_a_watchdog_nothing_is_kept_in_flight(fake_world) -> None:
    import torch
    import torch.distributed as dist

    t = torch.ones(4)
    with CommDebugMode() as mode:
        dist.all_reduce(t)
        ops = torch.ops._c10d_functional
        ops.wait_tensor(ops.all_reduce(t, "sum", dist.group.WORLD.group_name))
        assert mode._recorder.in_flight() == [] and mode._recorder.wants_completion is False


def test_opted_in_signals_write_the_file_then_run_the_previous_handler(tmp_path) -> None:
    seen: list[int] = []

    def previous(signum, frame) -> None:  # type: ignore[no-untyped-def]
        seen.append(signum)

    original = signal.signal(signal.SIGUSR1, previous)
    try:
        watchdog = HangWatchdog(60, str(tmp_path / "sig_rank{rank}.json"), on_signals=(signal.SIGUSR1,))
        with CommDebugMode(watchdog=watchdog) as mode:
            collective(mode.observer)
            mode.observer.on_collective_issue(ALL_REDUCE, time.time_ns())
            os.kill(os.getpid(), signal.SIGUSR1)
            _wait_for(lambda: seen)
            assert signal.getsignal(signal.SIGUSR1) != previous  # ours while the window is open
        assert seen == [signal.SIGUSR1]
        assert signal.getsignal(signal.SIGUSR1) is previous  # restored exactly
        spans = read_spans(tmp_path / "sig_rank0.json")
        assert [s.attributes.get(schema.COLLECTIVE_IN_FLIGHT, False) for s in spans] == [False, True]
    finally:
        signal.signal(signal.SIGUSR1, original)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"timeout_s": 0}, ValueError, "timeout_s must be a positive number"),
        ({"timeout_s": True}, ValueError, "timeout_s must be a positive number"),
        ({"timeout_s": 1, "path": ""}, TypeError, "path must be a non-empty path"),
        ({"timeout_s": 1, "poll_s": -1}, ValueError, "poll_s must be a positive number"),
        ({"timeout_s": 1, "on_signals": (signal.SIGKILL,)}, ValueError, "is not a signal that can be caught"),
        # beyond threading's longest wait: OverflowError in float() here, or later in the watchdog's thread
        ({"timeout_s": 10**400}, ValueError, r"timeout_s must be a positive number of seconds, at most 9223372036"),
        ({"timeout_s": float("inf")}, ValueError, r"timeout_s must be a positive number of seconds, at most"),
        ({"timeout_s": float("nan")}, ValueError, r"timeout_s must be a positive number of seconds"),
        ({"timeout_s": 1, "poll_s": 1e300}, ValueError, r"poll_s must be a positive number of seconds, at most"),
    ],
)
def test_bad_watchdog_arguments_are_named(kwargs, error, message) -> None:
    with pytest.raises(error, match=message):
        HangWatchdog(**kwargs)


def test_watchdog_argument_must_be_a_hang_watchdog() -> None:
    with pytest.raises(TypeError, match=r"watchdog must be a hp_otel\.HangWatchdog or None, got int"):
        CommDebugMode(watchdog=5)  # type: ignore[arg-type]


def test_a_path_in_a_missing_folder_is_refused_up_front(tmp_path: Path, monkeypatch) -> None:
    """Found out when the watchdog is made, not when a collective hangs and the evidence is lost."""
    monkeypatch.setenv("RANK", "3")
    with pytest.raises(FileNotFoundError, match=r"^path: folder '.*missing' does not exist$"):
        HangWatchdog(timeout_s=1, path=tmp_path / "missing" / "hang_rank{rank}.json")
    with pytest.raises(FileNotFoundError, match=r"path: folder '.*rank3' does not exist"):  # {rank} filled in
        HangWatchdog(timeout_s=1, path=str(tmp_path / "rank{rank}" / "hang.json"))
    with pytest.raises(IsADirectoryError, match="path: "):
        HangWatchdog(timeout_s=1, path=tmp_path)
    (tmp_path / "rank3").mkdir()
    assert HangWatchdog(timeout_s=1, path=str(tmp_path / "rank{rank}" / "hang.json")).path.endswith("rank3/hang.json")


def test_write_spans_checks_its_path(tmp_path: Path) -> None:
    with CommDebugMode() as mode:
        collective(mode.observer)
    with pytest.raises(FileNotFoundError, match="path: folder"):
        mode.write_spans(tmp_path / "missing" / "x.json")


_KILLED_WHILE_WRITING = """
import sys, threading, time
from events import ALL_REDUCE
from hp_otel import CommDebugMode, HangWatchdog
from hp_otel.spans import otlp_json

original = otlp_json.write_text_atomically
writes = 0

def slow_second_write(path, write, **kwargs):  # the watchdog's second file: stop half way
    global writes
    on_watchdog = threading.current_thread().name == "hp_otel-watchdog"
    writes += on_watchdog

    def half_then_wait(handle):
        handle.write('{"resourceSpans": [' + "x" * 100_000)
        handle.flush()
        print("writing", flush=True)
        time.sleep(60)

    return original(path, half_then_wait if on_watchdog and writes == 2 else write, **kwargs)

otlp_json.write_text_atomically = slow_second_write
signals = tuple(int(s) for s in sys.argv[2:])
watchdog = HangWatchdog(0.05, sys.argv[1], poll_s=0.01, on_signals=signals)
with CommDebugMode(watchdog=watchdog) as mode:
    mode.observer.on_collective_issue(ALL_REDUCE, time.time_ns())
    while not watchdog.written:
        time.sleep(0.01)
    print("first", flush=True)
    mode.observer.on_collective_issue(ALL_REDUCE, time.time_ns())
    for _ in range(6000):  # the main thread runs Python: a signal's handler runs here
        time.sleep(0.01)
"""


@pytest.mark.parametrize(
    ("sig", "on_signals", "in_flight_spans"),
    [
        (signal.SIGTERM, False, 1),  # the previous complete file
        (signal.SIGKILL, False, 1),
        (signal.SIGTERM, True, 2),  # the handler's new complete file
    ],
)
def test_a_signal_while_the_watchdog_writes_leaves_a_complete_file_and_no_temporary(
    tmp_path, sig, on_signals, in_flight_spans
) -> None:
    import subprocess
    import sys

    support = str(Path(__file__).parents[1] / "support")
    path = tmp_path / "hang_rank0.json"
    args = [sys.executable, "-c", _KILLED_WHILE_WRITING, str(path)] + ([str(int(sig))] if on_signals else [])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([support, os.environ.get("PYTHONPATH", "")])}
    child = subprocess.Popen(args, stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == "first\n"
        assert child.stdout.readline() == "writing\n"  # the second file is half written
        child.send_signal(sig)
        code = child.wait(30)
    finally:
        child.kill()
    assert code == -sig  # the signal still ends the process
    assert os.listdir(tmp_path) == ["hang_rank0.json"]  # no temporary file
    spans = read_spans(path)  # complete, valid JSON
    assert sum(bool(s.attributes.get(schema.COLLECTIVE_IN_FLIGHT)) for s in spans) == in_flight_spans


def test_after_a_slow_file_the_watchdog_waits_nine_times_as_long_before_the_next(tmp_path) -> None:
    """The training thread's share of the interpreter stays bounded however large the file."""
    from hp_otel.record import watchdog as watchdog_module

    issued_at = time.time_ns()
    first = CollectiveIssue(issued_at, ALL_REDUCE, 0, of("forward", ""))
    window = _StandInWindow([first])

    def slow_writer(path: str) -> None:
        time.sleep(0.05)
        window.paths.append(path)

    watchdog = HangWatchdog(0.01, str(tmp_path / "r{rank}.json"), poll_s=60)
    watchdog.start(window, slow_writer)
    try:
        assert watchdog.check(issued_at + 10**9) == [first]
        assert watchdog.last_write_s >= 0.05
        second = CollectiveIssue(issued_at, ALL_REDUCE, 1, of("forward", ""))
        window.issues.append(second)
        assert watchdog.check(issued_at + 10**9) == []  # quiet: written with the next file
        time.sleep(watchdog_module.QUIET_FACTOR * watchdog.last_write_s + 0.05)
        assert watchdog.check(issued_at + 10**9) == [second]
    finally:
        watchdog.stop()
    assert len(window.paths) == 2


def test_spans_written_in_pieces_read_back_the_same(tmp_path) -> None:
    from hp_otel.spans import otlp_json

    with CommDebugMode() as mode:
        for _ in range(300):
            collective(mode.observer)
    spans = mode.get_finished_spans()
    pauses: list[int] = []
    otlp_json.write_spans(tmp_path / "whole.json", spans, resource_defaults={schema.RESOURCE_RANK: 3})
    otlp_json.write_spans(
        tmp_path / "pieces.json", spans, resource_defaults={schema.RESOURCE_RANK: 3}, pause=lambda: pauses.append(1)
    )
    assert len(pauses) == 5  # 300 spans, 64 a piece
    whole, pieces = read_spans(tmp_path / "whole.json"), read_spans(tmp_path / "pieces.json")
    key = lambda s: (s.context.span_id, s.name, dict(s.attributes), s.resource.attributes[schema.RESOURCE_RANK])  # noqa: E731
    assert sorted(map(key, whole)) == sorted(map(key, pieces)) and len(pieces) == 300
