"""The local span store at scale: kept spans as compact records the garbage collector does not
track, rebuilt equal to what the SDK ended; no span built past the cap; the step's synchronous
build bounded; no reference cycle left by a window; memory per span bounded."""

from __future__ import annotations

import gc
import os
import tracemalloc
import weakref
from collections.abc import Callable
from typing import TypeVar
from unittest import mock

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import hp_otel
from benchmarks.scale import mlp_forward_events, record_window
from hp_otel import CommDebugMode
from hp_otel.record import settings as settings_module
from hp_otel.record import span_builder
from hp_otel.record import span_feed as span_feed_module
from hp_otel.record.span_store import StoredSpan
from hp_otel.render.json_dump import build_json_dump
from hp_otel.render.table import render_table
from hp_otel.spans.infos import CollectiveInfo, ModuleInfo

T = TypeVar("T")

pytestmark = pytest.mark.torch_free  # needs no torch: not rerun on torch 2.14.1 (tests/support/markers.py)


def _tracked_objects_made(make: Callable[[], T]) -> tuple[T, int]:
    """`make()`, and how many tracked objects it left.  The objects tracked before are held meanwhile:
    what earlier tests left and `make()` happens to free (a provider a window lets go of) cannot
    lower the count."""
    for _ in range(3):  # each pass untracks the tuples whose items the one before untracked
        gc.collect()
    before = gc.get_objects()
    made = make()
    for _ in range(3):
        gc.collect()
    return made, len(gc.get_objects()) - len(before)


def _window(spans: int) -> CommDebugMode:
    mode = record_window(spans)
    assert mode.get_dropped_record_count() == 0 and len(mode.get_finished_spans()) == spans  # built now
    mode.get_metric_reader().get_metrics_data()  # the durations waiting for a collection (bounded) go
    return mode


def test_kept_spans_add_no_object_the_garbage_collector_tracks() -> None:
    """10x more kept spans, about as many tracked objects: a full collection's work does not grow
    with the spans kept (the SDK's span is ≈11 tracked objects: +21,000 here before)."""
    _window(210).clear()  # imports and one-time caches, the metric reader's included
    small, small_growth = _tracked_objects_made(lambda: _window(210))
    large, large_growth = _tracked_objects_made(lambda: _window(2_100))
    growth = large_growth - small_growth
    assert growth < 190, growth  # under 0.1 tracked object per kept span
    assert not any(gc.is_tracked(record) for record in large._store._spans)
    del small


def _deferred_to_an_exporter() -> tuple[CommDebugMode, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    mode = CommDebugMode(tracer_provider=provider, live_spans=False)
    # a step's window as rank 1: its collectives link to rank 0's spans of them (matching.py)
    with mock.patch.dict(os.environ, {"RANK": "1"}), hp_otel.step(3, run_id="store-run", rank=1), mode:
        for _ in range(3):
            mlp_forward_events(mode.observer)
        observer = mode.observer
        observer.on_module_enter(ModuleInfo("boom", "Boom", "Boom"), "forward")  # error status and event
        info = CollectiveInfo("x", "all_reduce", 2, "tp", (0, 1), (1,), (1,), "f32", 4, "sum")
        observer.on_collective(info, 10, 20, error=RuntimeError("lost rank"))
        observer.on_module_exit("boom", "forward", ValueError("bad shape"))
    return mode, exporter


def test_rebuilt_spans_are_the_spans_the_sdk_ended_field_by_field() -> None:
    mode, exporter = _deferred_to_an_exporter()
    exported, stored = exporter.get_finished_spans(), mode.get_finished_spans()
    assert len(stored) == len(exported) == 3 * 7 + 2
    assert any(s.events for s in exported) and any(s.links for s in exported)  # the record keeps both
    for sdk_span, span in zip(exported, stored, strict=True):
        assert isinstance(span, ReadableSpan) and span is not sdk_span
        assert span.to_json() == sdk_span.to_json()  # name, ids, parent, kind, times, status, attributes,
        assert span.instrumentation_scope is sdk_span.instrumentation_scope  # events, links, resource
        assert (span.dropped_attributes, span.dropped_events, span.dropped_links) == (0, 0, 0)
        assert [e.attributes for e in span.events] == [dict(e.attributes) for e in sdk_span.events]
        assert [link.context for link in span.links] == [link.context for link in sdk_span.links]
    assert stored == mode.get_finished_spans()  # two reads: equal spans (new objects)
    assert render_table(stored, 3) == render_table(exported, 3)
    counts = mode.get_comm_counts(), mode.get_comm_module_counts()
    assert build_json_dump(stored, 3, *counts, 0) == build_json_dump(exported, 3, *counts, 0)


def test_no_readable_span_is_made_past_the_cap(monkeypatch) -> None:
    """3,000 steps of 7 spans with max_spans=100: spans made are the 100 kept (and the open calls
    of the step that filled the store), then the 100 read back: never the 21,000."""
    made = 0
    original = ReadableSpan.__init__

    def counting(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        nonlocal made
        made += 1
        original(self, *args, **kwargs)

    monkeypatch.setattr(ReadableSpan, "__init__", counting)
    with CommDebugMode(max_spans=100) as mode:
        for _ in range(3_000):
            mlp_forward_events(mode.observer)
    assert mode.get_dropped_record_count() == 3_000 * 7 - 100
    built = made
    assert built <= 2 * (100 + 7), built  # the SDK makes two a span: the span, and the copy on_end gets
    read = mode.get_finished_spans()  # fields set from the records (_otel_compat.READABLE_SPAN_FIELDS)
    assert len(read) == 100 and made == built and all(type(span) is StoredSpan for span in read)


def test_the_step_never_waits_for_more_than_one_slice_of_the_backlog(monkeypatch) -> None:
    """Once max_pending events wait, each step builds at most one slice of them (before: the whole
    backlog at once, 20,000 events and 1-2 s in one step); every span is still built, in order."""
    monkeypatch.setattr(settings_module, "_MAX_PENDING_EVENTS", 1_000)
    monkeypatch.setattr(span_feed_module, "_BUILD_SLICE", 64)
    fed = 0
    original = span_builder.SpanBuilder.feed_all

    def counting(self, events, on_fault):  # type: ignore[no-untyped-def]
        nonlocal fed
        fed += len(events)
        original(self, events, on_fault)

    monkeypatch.setattr(span_builder.SpanBuilder, "feed_all", counting)
    longest, steps = 0, 400  # 5,200 events
    with CommDebugMode() as mode:
        for _ in range(steps):
            fed = 0
            mlp_forward_events(mode.observer)
            longest = max(longest, fed)
            assert len(mode._recorder.span_feed.pending) <= 1_000
    assert 0 < longest <= 64  # one slice, whatever the step (13 events a step)
    spans = mode.get_finished_spans()
    assert len(spans) == steps * 7 and mode.get_dropped_record_count() == 0
    assert [s.name for s in spans[:7]] == ["linear", "fc1", "gelu", "all_reduce", "linear", "fc2", "MLP"]


def test_a_dropped_window_is_freed_without_the_garbage_collector() -> None:
    """No reference cycle between the recorder, its span builder and the store: the window's
    records go when the mode does (before: only a collection freed them, 34 objects a window)."""
    mode = record_window(70)
    mode.get_dropped_record_count()  # built, with the builder still there
    store, recorder = weakref.ref(mode._store), weakref.ref(mode._recorder)
    gc.disable()
    try:
        del mode
        assert store() is None and recorder() is None
    finally:
        gc.enable()


def test_memory_is_bounded_by_the_cap_and_small_per_span() -> None:
    """tracemalloc: a kept span costs under 1.5 KB (3.6 KB as the SDK's span), and 1,000 steps
    under max_spans=500 hold no more than a cap's worth (its records, at most 1,000 unbuilt events)."""
    record_window(70).clear()  # one-time caches
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        mode = record_window(3_500)
        mode.get_dropped_record_count()
        gc.collect()
        per_span = (tracemalloc.get_traced_memory()[0] - base) / 3_500
        del mode
        gc.collect()
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        capped = record_window(7_000, max_spans=500)
        assert len(capped.get_finished_spans()) == 500
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert per_span < 1_500, per_span
    print(f"{per_span:.0f} B/span, capped peak {peak / 2**20:.2f} MiB")
    assert peak < 2 * 2**20, peak


@pytest.mark.parametrize("parent_ends", [2, 3, 4, 5, 8])  # after the last child naming it: its own, flags 0, ...
def test_span_contexts_are_shared_only_between_equal_ones(parent_ends: int) -> None:
    """A child's parent is the parent span's own context object when every field is the same; a
    parent with the same span id and another trace id, flags, remoteness or trace state is its own."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.trace import SpanContext, TraceFlags
    from opentelemetry.trace.span import TraceState

    from hp_otel.record.span_store import LocalSpanStore

    state = TraceState([("vendor", "x")])

    def context(trace_id: int, span_id: int, remote: bool = False, flags: int = 1, trace_state=None):  # type: ignore[no-untyped-def]
        return SpanContext(trace_id, span_id, remote, TraceFlags(flags), trace_state)

    own = context(1, 10)
    parents = [own, own, context(1, 10, flags=0), context(1, 10, remote=True), context(2, 10), context(1, 10, flags=3),
               context(1, 10, trace_state=state), context(1, 10), None]  # fmt: skip
    resource = Resource.create({})
    spans = [ReadableSpan(f"c{i}", context(1, 20 + i), parent, resource, {"i": i}) for i, parent in enumerate(parents)]
    spans.insert(parent_ends, ReadableSpan("p", own, None, resource, {"i": -1}))
    for i, parent in enumerate((context(1, 40), context(1, 40, remote=True))):  # siblings: only remoteness differs
        spans.append(ReadableSpan(f"e{i}", context(1, 41 + i), parent, resource, {"i": 7}))
    spans.append(ReadableSpan("d", context(1, 31), context(1, 30), resource, {"i": 8}))
    spans.append(
        ReadableSpan("s", context(1, 30, trace_state=state), context(1, 11, trace_state=state), resource, {"i": 9})
    )
    store = LocalSpanStore(100)
    store.export(spans)
    for read in (store.get_finished_spans(), store.get_finished_spans()):  # the second: attribute dicts compiled
        assert all(type(span) is StoredSpan for span in read)
        for span, sdk_span in zip(read, spans, strict=True):
            assert span.to_json() == sdk_span.to_json()
            assert span.context == sdk_span.context and span.parent == sdk_span.parent
            assert type(span.context) is SpanContext and span.context.is_valid
            assert span.parent is None or (type(span.parent) is SpanContext and span.parent.is_valid)
        by_name = {span.name: span for span in read}
        assert by_name["c0"].parent is by_name["c1"].parent  # made once
        if parent_ends == 2:
            assert by_name["c1"].parent is by_name["p"].context
        for name in ("c2", "c3", "c4", "c5", "c6"):  # the same span id, another field
            assert by_name[name].parent is not by_name["p"].context
        assert by_name["d"].parent is not by_name["s"].context  # the same, but for the trace state
        assert (by_name["c7"].parent is by_name["p"].context) == (parent_ends == 8)  # only if it ended first
