"""Exposed communication from collective intervals: hand-computed windows."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from hp_otel.spans import exposure, schema
from hp_otel.spans.exposure import CommSpan, summarise

pytestmark = pytest.mark.torch_free  # needs no torch: not rerun on torch 2.14.1 (tests/support/markers.py)

MS = 1_000_000


def test_sync_collective_is_fully_exposed() -> None:
    report = summarise([CommSpan.of(0, 10 * MS, is_async=False, completion=schema.COMPLETION_WORK)])
    assert (report.total.comm_ns, report.total.exposed_ns, report.total.overlap_fraction) == (10 * MS, 10 * MS, 0.0)


def test_async_collective_overlaps_except_its_call_and_its_wait() -> None:
    # issued at 0 (call 1 ms), in flight until 100 ms, waited from 70 ms: 1 + 30 ms exposed
    c = CommSpan.of(0, 100 * MS, is_async=True, completion=schema.COMPLETION_WORK, call_ns=1 * MS, waited_ns=30 * MS)
    total = summarise([c]).total
    assert (total.comm_ns, total.exposed_ns, total.overlapped_ns) == (100 * MS, 31 * MS, 69 * MS)
    assert total.overlap_fraction == 0.69


def test_a_wait_on_one_collective_exposes_the_others_in_flight_and_phases_do_not_add_up() -> None:
    a = CommSpan.of(0, 50 * MS, is_async=True, completion=schema.COMPLETION_WAIT, call_ns=0, waited_ns=0,
                    phase=schema.PHASE_FORWARD, module="l0")  # fmt: skip
    b = CommSpan.of(20 * MS, 80 * MS, is_async=True, completion=schema.COMPLETION_WAIT, waited_ns=40 * MS,
                    phase=schema.PHASE_BACKWARD, module="l1")  # fmt: skip
    report = summarise([a, b])
    assert report.total.comm_ns == 80 * MS and report.total.exposed_ns == 40 * MS  # b waited 40..80
    assert report.by_phase[schema.PHASE_FORWARD].exposed_ns == 10 * MS  # a was in flight 40..50 during b's wait
    assert report.by_module[(schema.PHASE_BACKWARD, "l1")].comm_ns == 60 * MS
    assert report.by_phase[schema.PHASE_FORWARD].comm_ns + report.by_phase[schema.PHASE_BACKWARD].comm_ns > 80 * MS


def test_launch_only_collective_counts_its_call_and_no_communication_has_no_fraction() -> None:
    c = CommSpan.of(0, 4 * MS, is_async=True, completion=schema.COMPLETION_LAUNCH, call_ns=1 * MS)
    assert summarise([c]).total.exposed_ns == 1 * MS
    assert summarise([]).total.overlap_fraction is None and exposure.footer_lines(summarise([])) == []


def test_by_window_reads_span_attributes() -> None:
    def span(start: int, end: int, window: str, **attrs: object) -> SimpleNamespace:
        base = {
            schema.CALL_KIND: schema.KIND_COLLECTIVE,
            schema.COLLECTIVE_WINDOW: window,
            schema.PHASE: schema.PHASE_FORWARD,
        }
        return SimpleNamespace(start_time=start, end_time=end, attributes={**base, **attrs})

    spans = [
        span(
            0,
            10 * MS,
            "step 1",
            **{
                schema.COLLECTIVE_ASYNC: True,
                schema.COLLECTIVE_COMPLETION: "work",
                schema.COLLECTIVE_CALL_DURATION: 0.0,
                schema.COLLECTIVE_WAIT_DURATION: 4 * MS / 1e9,
            },
        ),
        span(20 * MS, 30 * MS, "step 2", **{schema.COLLECTIVE_ASYNC: False, schema.COLLECTIVE_COMPLETION: "work"}),
        span(0, 99 * MS, "step 2", **{schema.COLLECTIVE_IN_FLIGHT: True}),  # a watchdog's in-flight copy: left out
        SimpleNamespace(start_time=0, end_time=5, attributes={schema.CALL_KIND: schema.KIND_OP}),
    ]
    reports = exposure.by_window(spans)
    assert reports["step 1"].total.exposed_ns == 4 * MS and reports["step 1"].total.overlap_fraction == 0.6
    assert reports["step 2"].total.comm_ns == 10 * MS and reports["step 2"].total.overlap_fraction == 0.0
    assert exposure.footer_lines(reports["step 1"], "step 1")[0].startswith("communication (step 1): comm 10.000 ms")
