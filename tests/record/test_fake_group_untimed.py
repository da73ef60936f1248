"""torch's fake process group, left untimed: its collectives return at once, so a duration, a
bandwidth or an overlap from it is the host's dispatch time, not communication.

A module of its own: it needs torch (the fake group), unlike `test_bandwidth_recording.py`,
which feeds the observer by hand and is marked torch_free."""

from __future__ import annotations

import json

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from hp_otel import CommDebugMode
from hp_otel.render.json_dump import build_json_dump
from hp_otel.spans import schema
from hp_otel.testing import metric_points


def _collective_spans(mode: CommDebugMode) -> list:
    return sorted(
        (sp for sp in mode.get_finished_spans() if sp.attributes.get(schema.CALL_KIND) == schema.KIND_COLLECTIVE),
        key=lambda sp: sp.start_time,
    )


def test_the_fake_process_group_is_left_untimed_and_the_table_says_why(tp_mlp) -> None:
    """torch's fake process group returns at once: a busbw or an overlap from it is the host's
    dispatch time, not communication (issue 35 item 2).  Its collectives carry no bandwidth, stay out
    of the exposure figures and the busbw histogram, and the level-3 table says why in its footer."""
    model, x = tp_mlp
    reader = InMemoryMetricReader()
    with CommDebugMode(module=model, meter_provider=MeterProvider(metric_readers=[reader])) as mode:
        model(x).sum().backward()
    spans = _collective_spans(mode)
    assert len(spans) == 2 and all(sp.attributes[schema.COLLECTIVE_BACKEND] == schema.BACKEND_FAKE for sp in spans)
    assert [k for sp in spans for k in sp.attributes if k in (schema.COLLECTIVE_BUSBW, schema.COLLECTIVE_ALGBW)] == []
    assert mode.get_comm_exposure().total.collectives == 0
    assert metric_points(reader, schema.METRIC_BUSBW) == []
    assert len(metric_points(reader, schema.METRIC_DURATION)) > 0  # the calls are still counted and timed as calls
    table = mode.generate_comm_debug_tracing_table(noise_level=3)
    assert "busbw=" not in table and "overlapped" not in table
    assert table.splitlines()[-1] == (
        "communication: not timed: 2 collective(s) on torch's fake process group, which returns at once "
        "(no time, bandwidth or overlap to show)"
    )
    assert "busbw" not in json.dumps(build_json_dump(mode.get_finished_spans(), 3, {}, {}, 0))
