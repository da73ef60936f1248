"""Bounded memory and scale: the retention cap past the build threshold, the JSON dump
written streaming and atomically, and the `hp-otel bench --scale` command (its figures
are reported, not asserted: timings depend on the machine)."""

from __future__ import annotations

import json
import os

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from hp_otel import CommDebugMode
from hp_otel import mode as mode_module
from hp_otel.cli import main
from hp_otel.cli.bench_scale import format_scale_results, mlp_forward_events, record_window, run_scale_bench
from hp_otel.render import json_dump
from hp_otel.spans import schema
from hp_otel.testing import assert_collective_counts, metric_points


def test_cap_holds_and_counts_stay_exact_past_the_build_threshold(monkeypatch) -> None:
    monkeypatch.setattr(mode_module, "_MAX_PENDING_EVENTS", 50)  # build many times inside the window
    reader = InMemoryMetricReader()
    with CommDebugMode(max_spans=100, meter_provider=MeterProvider(metric_readers=[reader])) as mode:
        for _ in range(500):
            mlp_forward_events(mode.observer)
        assert len(mode._recorder._pending) < 50  # unbuilt events stay bounded too
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
    assert main(["bench", "--scale", "--spans", "700"]) == 0
    assert "noise_level=3: table" in capsys.readouterr().out
