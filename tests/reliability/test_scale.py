"""Bounded memory and scale: the retention cap past the build threshold, the JSON dump
written streaming and atomically, and the `python -m benchmarks --scale` command (its figures
are reported, not asserted: timings depend on the machine)."""

from __future__ import annotations

import json
import os

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from benchmarks.command import main
from benchmarks.scale import format_scale_results, mlp_forward_events, record_window, run_scale_bench
from hp_otel import CommDebugMode
from hp_otel.export.providers import default_meter_provider
from hp_otel.record import settings as settings_module
from hp_otel.render import json_dump
from hp_otel.spans import schema
from hp_otel.spans.infos import CollectiveInfo
from hp_otel.testing import assert_collective_counts, metric_points

pytestmark = pytest.mark.torch_free  # needs no torch: not rerun on torch 2.14.1 (tests/support/markers.py)


def test_cap_holds_and_counts_stay_exact_past_the_build_threshold(monkeypatch) -> None:
    monkeypatch.setattr(settings_module, "_MAX_PENDING_EVENTS", 50)  # build many times inside the window
    reader = InMemoryMetricReader()
    with CommDebugMode(max_spans=100, meter_provider=MeterProvider(metric_readers=[reader])) as mode:
        for _ in range(500):
            mlp_forward_events(mode.observer)
        assert len(mode._recorder.span_feed.pending) < 50  # unbuilt events stay bounded too
    assert len(mode.get_finished_spans()) == 100
    assert mode.get_dropped_record_count() == 500 * 7 - 100
    assert_collective_counts(mode, {"_c10d_functional.all_reduce": 500})
    assert mode.get_comm_module_counts()["fc2"] == {"forward": {"_c10d_functional.all_reduce": 500}}
    assert sum(p.value for p in metric_points(reader, schema.METRIC_CALLS)) == 500
    dump_table = mode.generate_comm_debug_tracing_table(0)
    assert dump_table.count("Collective(") == len(mode.get_finished_spans()) // 7  # the kept spans only


def test_json_is_written_in_bounded_chunks(monkeypatch, tmp_path) -> None:
    mode = record_window(7_000)
    writes: list[int] = []
    original = json_dump.write_text_atomically

    def recording(path, write, **kwargs):
        class Handle:
            def __init__(self, handle):
                self._handle = handle

            def write(self, text):
                writes.append(len(text))
                return self._handle.write(text)

        return original(path, lambda handle: write(Handle(handle)), **kwargs)

    monkeypatch.setattr(json_dump, "write_text_atomically", recording)
    path = tmp_path / "dump.json"
    mode.generate_json_dump(path, noise_level=3)
    size = path.stat().st_size
    assert len(writes) > 5 and max(writes) < json_dump._CHUNK_CHARS + 4096 < size
    assert json.loads(path.read_text())["total_counts"] == 1000


def test_failed_dump_leaves_no_partial_file(monkeypatch, tmp_path) -> None:
    mode = record_window(7_000)
    path = tmp_path / "dump.json"
    path.write_text("previous dump")
    produced = 0
    original = json_dump._Encoder.record

    def failing(self, record, depth):
        nonlocal produced
        produced += 1
        if produced == 900:  # well after the first chunks were written
            raise OSError("disk full")
        yield from original(self, record, depth)

    monkeypatch.setattr(json_dump._Encoder, "record", failing)
    with pytest.raises(OSError, match="disk full"):
        mode.generate_json_dump(path, noise_level=3)
    assert path.read_text() == "previous dump"
    assert os.listdir(tmp_path) == ["dump.json"]  # no temporary file left behind
    monkeypatch.undo()
    mode.generate_json_dump(path, noise_level=3)  # nothing recorded was lost
    assert json.loads(path.read_text())["total_counts"] == 1000


def test_scale_bench_reports_memory_and_times(capsys) -> None:
    results = run_scale_bench(spans=700, repeats=1, memory_spans=700)
    assert results["memory"]["spans"] == 700 and results["memory"]["bytes_per_span"] > 0
    assert set(results["outputs"]) >= {"table_level_0_s", "json_level_3_s"}
    lines = list(format_scale_results(results))
    assert lines[0].startswith("memory: 700 spans retained")
    assert main(["--scale", "--spans", "700"]) == 0
    assert "noise_level=3: table" in capsys.readouterr().out


def test_past_the_cap_spans_are_counted_not_built_and_pending_events_stay_bounded(monkeypatch) -> None:
    """max_spans bounds memory and time: spans past it are not even built, and unbuilt events wait
    in proportion to it; the dropped count is still exact (7 spans a step, the referee)."""
    from hp_otel.record import span_builder

    started = 0
    original = span_builder.SpanBuilder._start_span

    def counting(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        nonlocal started
        started += 1
        return original(self, *args, **kwargs)

    monkeypatch.setattr(span_builder.SpanBuilder, "_start_span", counting)
    steps, cap = 3_000, 100
    peak = 0
    with CommDebugMode(max_spans=cap) as mode:
        for _ in range(steps):
            mlp_forward_events(mode.observer)
            peak = max(peak, len(mode._recorder.span_feed.pending))
    assert len(mode.get_finished_spans()) == cap
    assert mode.get_dropped_record_count() == steps * 7 - cap
    assert started <= cap + 7  # at most the step that filled the store, not 21,000 spans
    assert peak < max(settings_module._MIN_PENDING_EVENTS, 2 * cap)  # not the 20,000 of any window
    assert_collective_counts(mode, {"_c10d_functional.all_reduce": steps})
    kept = [s for s in mode.get_finished_spans() if s.name == "MLP"]
    assert kept and all(s.end_time >= s.start_time for s in kept)  # spans kept before the cap end as recorded


def test_calls_skipped_past_the_cap_close_their_own_frames_only() -> None:
    """A module called inside itself (same fqn) after the store filled: its skipped exit does not
    end the outer call, which was built; every frame is closed by its own exit."""
    from hp_otel.spans.infos import ModuleInfo

    with CommDebugMode(max_spans=1) as mode:
        observer = mode.observer
        outer, inner = ModuleInfo("(root)", "M", "M"), ModuleInfo("a", "a", "A")
        observer.on_module_enter(outer, "forward")
        observer.on_module_enter(inner, "forward")  # built: the store is not full yet
        observer.on_module_enter(ModuleInfo("b", "b", "B"), "forward")
        observer.on_module_exit("b", "forward")  # kept: the store is full now
        for _ in range(3):  # skipped: 'a' inside 'a'
            observer.on_module_enter(inner, "forward")
            observer.on_module_exit("a", "forward")
        mode._recorder.materialise()
        builder = mode._recorder.span_feed.builder
        assert [frame.key for frame in builder._stack] == [("(root)", "forward"), ("a", "forward")]
        observer.on_module_exit("a", "forward")
        observer.on_module_exit("(root)", "forward")
        mode._recorder.materialise()
        assert builder._stack == [] and builder._skipped == {}
    assert [s.name for s in mode.get_finished_spans()] == ["b"]
    assert mode.get_dropped_record_count() == 3 + 2  # the skipped calls, and the two built then dropped


def test_clear_forgets_the_builder_and_in_flight_records_between_windows() -> None:
    with CommDebugMode() as mode:
        mlp_forward_events(mode.observer)
        mode.observer.on_collective_issue(
            CollectiveInfo("x", "all_reduce", 2, "tp", (0, 1), (1,), (1,), "f32", 4, "sum"), 1
        )
    assert mode._recorder.span_feed.builder is not None and mode._recorder.in_flight()
    mode.clear()
    assert mode._recorder.span_feed.builder is None and mode._recorder.in_flight() == []
    assert mode.get_finished_spans() == () and mode.get_total_counts() == 0


def test_a_json_dump_of_a_tree_deeper_than_the_recursion_limit(tmp_path) -> None:
    import sys

    from hp_otel.spans.infos import ModuleInfo

    depth = sys.getrecursionlimit() + 500
    with CommDebugMode(max_spans=depth + 7) as mode:
        observer = mode.observer
        for i in range(depth):
            observer.on_module_enter(ModuleInfo(f"m{i}", f"m{i}", "Block"), "forward")
        mlp_forward_events(observer)  # one collective at the bottom
        for i in reversed(range(depth)):
            observer.on_module_exit(f"m{i}", "forward")
    path = tmp_path / "deep.json"
    for level in (0, 3):  # 0: every module hidden, the collective alone; 3: every level nested
        mode.generate_json_dump(path, noise_level=level)
        text = path.read_text()
        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(4 * depth + 100)  # only json.loads needs it, to check the text
        try:
            dump = json.loads(text)
        finally:
            sys.setrecursionlimit(limit)
        node, levels = dump["records"][-1], 1
        while node["children"]:
            node, levels = node["children"][-1], levels + 1
        assert node["type"] == "collective"
        assert levels == (1 if level == 0 else depth + 3 + 1)  # the blocks, MLP, fc2, linear, all_reduce
        assert text.count('"type": "module"') == (0 if level == 0 else depth + 3)


def test_clear_after_a_long_window_leaves_no_object_per_collective() -> None:
    """What outlives `clear()` (the window's exposure rows, the durations waiting for a metric reader)
    is a few arrays, not objects per collective allocated among the freed spans, which kept the
    allocator's arenas from going back to the system.  Measured with tracemalloc (blocks allocated
    during the window and alive after clear()) at 3,000 collectives: before, 24,101 blocks and
    415 B a collective (a tuple and 3 ints of exposure, a tuple and a float per duration); after,
    136 blocks (the metric SDK's state, caches; not growing with the window) and 57 B a collective
    (40 B of exposure rows, 16 B of durations and bandwidths)."""
    import gc
    import tracemalloc

    collectives = 3_000
    record_window(300 * 7, max_spans=100).clear()  # first-use caches: the builder's, the SDK's
    # The earlier windows' durations and exposure rows, of every test before this one in the process,
    # wait in the default provider until a reader collects; past a threshold the window that adds to
    # them hands them all to the SDK, which then makes its state for every series first seen (thousands
    # of blocks, per series, not per collective). Collected here, only this window's wait.
    reader = default_meter_provider()[1]
    assert reader is not None  # no configure() in force: the in-memory default
    reader.get_metrics_data()
    gc.collect()
    tracemalloc.start()
    try:
        mode = record_window(collectives * 7, max_spans=700)
        assert len(mode.get_finished_spans()) == 700
        mode.clear()
        gc.collect()
        stats = tracemalloc.take_snapshot().statistics("filename")
    finally:
        tracemalloc.stop()
    blocks, held = sum(s.count for s in stats), sum(s.size for s in stats)
    assert blocks < 1_000, blocks
    assert held < 100 * collectives, held
