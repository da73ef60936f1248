"""The recorder's parts on their own: the path chosen once per recorder, the collectives in flight,
and a window's exposure rows."""

from __future__ import annotations

import dataclasses

import pytest
from events import ALL_REDUCE, design_mlp_forward

from hp_otel import CommDebugMode
from hp_otel.record import attribution, in_flight, span_feed, window_exposure
from hp_otel.record import events as ev
from hp_otel.record.counts_path import CountsPath
from hp_otel.record.recorder import WindowRecorder
from hp_otel.record.traced_path import TracedPath
from hp_otel.spans import schema
from hp_otel.spans.infos import ModuleInfo

pytestmark = pytest.mark.torch_free  # needs no torch: not rerun on torch 2.14.1 (tests/support/markers.py)

_OBSERVER_CALLS = (
    "on_module_enter", "on_module_exit", "on_backward_end", "on_backward_modules", "on_op_enter", "on_op_exit",
    "on_redistribute_enter", "on_redistribute_exit", "on_collective_issue", "on_collective",
    "on_collective_complete", "on_collective_wait", "set_node_attribution", "set_param_attribution",
)  # fmt: skip


@pytest.mark.parametrize(("record_spans", "path"), [(False, CountsPath), (True, TracedPath)])
def test_the_observer_calls_are_the_chosen_paths_own(record_spans: bool, path: type) -> None:
    mode = CommDebugMode(record_spans=record_spans)
    recorder = mode._recorder
    for name in _OBSERVER_CALLS:
        call = getattr(recorder, name)
        assert type(call.__self__) is path, name  # bound once: no wrapper, no per-event test
    assert not any(hasattr(WindowRecorder, name) for name in _OBSERVER_CALLS)


def test_a_counts_window_makes_no_span_event(monkeypatch) -> None:
    emitted: list[object] = []
    monkeypatch.setattr(span_feed.SpanFeed, "emit", lambda self, event: emitted.append(event))
    backward = ModuleInfo("fc1", "fc1", "Linear")
    with CommDebugMode(record_spans=False) as mode:
        observer = mode.observer
        design_mlp_forward(observer)
        observer.on_redistribute_enter("Shard(dim=0)", "Replicate()", (4, 16))
        observer.on_redistribute_exit()
        observer.on_module_enter(backward, "backward")
        issue = observer.on_collective_issue(ALL_REDUCE, 1, "backward")
        observer.on_collective(ALL_REDUCE, 1, 2, None, "backward", issue)
        token = observer.on_collective(ALL_REDUCE, 3, 4, None, "backward", None, awaits_completion=True)
        observer.on_collective_complete(token, 9, schema.COMPLETION_WAIT)
        observer.on_module_exit("fc1", "backward")
        observer.on_backward_end()
    assert emitted == [] and mode._recorder.unbuilt_events() == 0 and mode._recorder.span_feed.builder is None
    assert mode.get_finished_spans() == ()
    assert mode.get_total_counts() == 3  # counted all the same, and where they ran
    assert mode.get_comm_module_counts()["fc1"] == {"backward": {ALL_REDUCE.name: 2}}
    assert token.completion == schema.COMPLETION_WAIT and token.end_ns == 9


def test_a_traced_window_feeds_every_event_to_its_spans(monkeypatch) -> None:
    emitted: list[object] = []
    original = span_feed.SpanFeed.emit

    def emit(self, event):  # type: ignore[no-untyped-def]
        emitted.append(type(event))
        original(self, event)

    monkeypatch.setattr(span_feed.SpanFeed, "emit", emit)
    with CommDebugMode() as mode:
        design_mlp_forward(mode.observer)
    assert emitted.count(ev.ModuleEnter) == 3 and emitted.count(ev.Collective) == 1
    assert emitted[-1] is ev.WindowEnd
    assert sorted(s.name for s in mode.get_finished_spans()) == sorted(
        ["MLP", "fc1", "fc2", "linear", "linear", "gelu", "all_reduce"]
    )


def test_a_counts_window_issues_records_only_while_a_watchdog_watches() -> None:
    with CommDebugMode(record_spans=False) as mode:
        observer = mode.observer
        assert type(observer.on_collective_issue(ALL_REDUCE, 1)) is not ev.CollectiveIssue
        mode._recorder.wants_completion = True
        issue = observer.on_collective_issue(ALL_REDUCE, 2)
        assert type(issue) is ev.CollectiveIssue and mode._recorder.in_flight() == [issue]
        observer.on_collective(ALL_REDUCE, 2, 3, ticket=issue, done=lambda: False)
        assert mode._recorder.in_flight() == [issue] and issue.returned  # its work is not done yet
        mode._recorder.wants_completion = False


def _issue(seq: int) -> ev.CollectiveIssue:
    return ev.CollectiveIssue(seq, ALL_REDUCE, seq, attribution.of("forward"))


def test_in_flight_keeps_issues_until_they_return_or_their_work_is_done(monkeypatch) -> None:
    monkeypatch.setattr(in_flight, "_MAX_IN_FLIGHT", 3)
    tracked = in_flight.InFlight()
    issues = [_issue(i) for i in range(5)]
    for issue in issues:
        tracked.add(issue)
    assert tracked.in_flight() == issues[2:]  # the oldest forgotten beyond the cap
    tracked.returned(issues[2], None, False)  # no probe: done as it returns
    done = [False]
    tracked.returned(issues[3], lambda: done[0], False)
    tracked.returned(issues[4], lambda: 1 / 0, False)  # a probe that cannot say: counted done
    tracked.forget_completed()
    assert tracked.in_flight() == [issues[3]] and issues[3].returned
    done[0] = True
    tracked.forget_completed()
    assert tracked.in_flight() == [] and len(tracked) == 0


def test_a_failed_call_leaves_in_flight_whatever_its_probe() -> None:
    tracked = in_flight.InFlight()
    issue = _issue(0)
    tracked.add(issue)
    tracked.returned(issue, lambda: False, True)
    assert tracked.in_flight() == []


class _Deferred:
    def __init__(self) -> None:
        self.windows: list[object] = []

    def defer(self, rows: object, label: object) -> None:
        self.windows.append(rows)


class _Instruments:
    def __init__(self) -> None:
        self.exposure = _Deferred()


def _collective(i: int, completion: str = schema.COMPLETION_CALL, backend: str = "") -> ev.Collective:
    info = dataclasses.replace(ALL_REDUCE, backend=backend)
    place = attribution.of("forward", "fc2")
    return ev.Collective(start_ns=10 * i, end_ns=10 * i + 5, info=info, error=None, place=place,
                         completion=completion, returned_ns=10 * i + 5)  # fmt: skip


def test_window_exposure_writes_rows_in_batches_and_caps_a_window(monkeypatch) -> None:
    monkeypatch.setattr(window_exposure, "_EXPOSURE_BATCH", 3)
    monkeypatch.setattr(window_exposure, "_MAX_WINDOW_COLLECTIVES", 5)
    faults: list[str] = []
    instruments = _Instruments()
    exposure = window_exposure.WindowExposure(instruments, None, lambda where, exc: faults.append(where))  # type: ignore[arg-type]
    exposure.start()
    exposure.add(_collective(0, backend=schema.BACKEND_FAKE), False)  # overlaps nothing: left out
    for i in range(1, 4):
        exposure.add(_collective(i), False)
    assert exposure.finished == [] and len(exposure.rows) == 3  # a batch became rows
    for i in range(4, 9):
        exposure.add(_collective(i), False)
    exposure.stop()
    assert len(exposure.stopped_rows) == 5 and instruments.exposure.windows == [exposure.stopped_rows]
    report = exposure.report()
    assert report.total.collectives == 5 and report.total.comm_ns == 5 * 5 and exposure.report() is report
    assert faults == []


def test_window_exposure_folds_awaited_collectives_once_nothing_moves_them(monkeypatch) -> None:
    monkeypatch.setattr(window_exposure, "_EXPOSURE_BATCH", 4)
    exposure = window_exposure.WindowExposure(_Instruments(), None, lambda where, exc: None)  # type: ignore[arg-type]
    exposure.start()
    launched = [_collective(i, schema.COMPLETION_LAUNCH) for i in range(4)]
    launched[0].completion = launched[2].completion = schema.COMPLETION_WAIT
    for event in launched:
        exposure.add(event, True)
    assert exposure.awaited == [launched[1], launched[3]] and len(exposure.rows) == 2
    launched[1].end_ns = 1_000  # moved by its completion after the fold: read at the window's end
    exposure.stop()
    assert exposure.report().total.collectives == 4 and exposure.awaited == []
