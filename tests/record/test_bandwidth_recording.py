"""Bandwidth on collective spans, in the JSON dump and in the busbw histogram, from controlled timestamps.

The observer is fed start and end times directly, so every number is known by hand:
256 bytes (a 4 x 16 float32 all_reduce) on 2 ranks is S = 256 B with factor 2(2-1)/2 = 1.
"""

from __future__ import annotations

import json

import pytest
from events import ALL_REDUCE
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from hp_otel import CommDebugMode
from hp_otel.render.json_dump import build_json_dump
from hp_otel.spans import schema
from hp_otel.testing import metric_points

T0 = 1_000_000_000_000
pytestmark = [pytest.mark.torch_free, pytest.mark.filterwarnings("ignore:noise_level=.*needs CommDebugMode")]


def _collective_spans(mode: CommDebugMode) -> list:
    return sorted(
        (sp for sp in mode.get_finished_spans() if sp.attributes.get(schema.CALL_KIND) == schema.KIND_COLLECTIVE),
        key=lambda sp: sp.start_time,
    )


def test_sync_async_and_failed_calls() -> None:
    reader = InMemoryMetricReader()  # a provider of its own: the default one is shared by every test's windows
    with CommDebugMode(meter_provider=MeterProvider(metric_readers=[reader])) as mode:
        obs = mode.observer
        obs.on_collective(ALL_REDUCE, T0, T0 + 2_000)  # sync, 2 µs
        token = obs.on_collective(ALL_REDUCE, T0 + 10_000, T0 + 11_000, awaits_completion=True)
        obs.on_collective_complete(token, T0 + 14_000, schema.COMPLETION_WAIT)  # completed 4 µs after issue
        obs.on_collective(ALL_REDUCE, T0 + 20_000, T0 + 21_000, awaits_completion=True)  # never completed
        obs.on_collective(ALL_REDUCE, T0 + 30_000, T0 + 31_000, RuntimeError("peer gone"))
    sync, waited, launched, failed = _collective_spans(mode)
    assert sync.attributes[schema.COLLECTIVE_BW_BYTES] == 256
    assert sync.attributes[schema.COLLECTIVE_ALGBW] == pytest.approx(128e6)  # 256 B / 2 µs
    assert sync.attributes[schema.COLLECTIVE_BUSBW] == pytest.approx(128e6)  # x 1
    assert waited.attributes[schema.COLLECTIVE_COMPLETION] == schema.COMPLETION_WAIT
    assert waited.attributes[schema.COLLECTIVE_BUSBW] == pytest.approx(64e6)  # 256 B / 4 µs
    for span in (launched, failed):  # a launch's time, or a failure, says nothing about the transfer
        assert schema.COLLECTIVE_BUSBW not in span.attributes and schema.COLLECTIVE_ALGBW not in span.attributes

    points = metric_points(reader, schema.METRIC_BUSBW)
    assert sum(p.count for p in points) == 2
    assert sum(p.sum for p in points) == pytest.approx(128e6 + 64e6)

    table = mode.generate_comm_debug_tracing_table(noise_level=3)
    assert "busbw=128 MB/s algbw=128 MB/s" in table and "busbw=64 MB/s" in table
    assert "busbw" not in mode.generate_comm_debug_tracing_table(noise_level=2)

    records = build_json_dump(mode.get_finished_spans(), 3, {}, {}, 0)["records"]
    with_bw = [r for r in records if "busbw_bytes_per_s" in r]
    assert [(r["bw_bytes"], r["algbw_bytes_per_s"], r["busbw_bytes_per_s"]) for r in with_bw] == [
        (256, pytest.approx(128e6), pytest.approx(128e6)),
        (256, pytest.approx(64e6), pytest.approx(64e6)),
    ]


def test_streamed_json_dump_writes_the_same_fields(tmp_path) -> None:
    with CommDebugMode() as mode:
        for i in range(3):  # the same collective three times: the encoder's head cache must not keep the first's
            mode.observer.on_collective(ALL_REDUCE, T0 + i * 10_000, T0 + i * 10_000 + (i + 1) * 1_000)
    path = tmp_path / "dump.json"
    mode.generate_json_dump(str(path), noise_level=3)
    streamed = json.loads(path.read_text())["records"]
    assert [r["busbw_bytes_per_s"] for r in streamed] == [
        pytest.approx(256e6),
        pytest.approx(128e6),
        pytest.approx(256e6 / 3),
    ]
    assert streamed == build_json_dump(mode.get_finished_spans(), 3, {}, {}, 0)["records"]  # one format, two writers
