"""Deferred spans made as `ReadableSpan`s (record/readable_spans.py): the same spans the SDK's path
makes, handed to the provider's processors at window end, the sampler asked once per window, the
provider's span limits applied, and a hook's span writable as the SDK span is."""

from __future__ import annotations

import os
import random as random_module
from typing import Any
from unittest import mock

import pytest
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, Decision, Sampler, SamplingResult
from opentelemetry.trace import StatusCode

import hp_otel
from benchmarks.scale import mlp_forward_events
from hp_otel import CommDebugMode
from hp_otel.spans.infos import CollectiveInfo, ModuleInfo

pytestmark = pytest.mark.torch_free  # needs no torch: not rerun on torch 2.14.1 (tests/support/markers.py)

_INFO = CollectiveInfo("x", "all_reduce", 2, "tp", (0, 1), (1,), (1,), "f32", 4, "sum")


class _Seen(SpanProcessor):
    """Counts the processor calls, and the spans ended while the window is still open."""

    def __init__(self) -> None:
        self.started = 0
        self.ended: list[ReadableSpan] = []

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        self.started += 1

    def on_end(self, span: ReadableSpan) -> None:
        self.ended.append(span)


class _CountingSampler(Sampler):
    def __init__(self, decision: Decision) -> None:
        self.calls = 0
        self.decision = decision

    def should_sample(self, parent_context, trace_id, name, kind=None, attributes=None, links=None, trace_state=None):
        self.calls += 1
        return SamplingResult(self.decision, {"sampled.by": "test"} if self.decision.is_sampled() else None)

    def get_description(self) -> str:
        return "counting"


def _window(provider: TracerProvider, live: bool | None = None, **options: Any) -> tuple[CommDebugMode, int]:
    """A step's window of three MLP forwards, a failing module and collective (an error event, links
    as rank 1); also how many spans had ended by the time its last event was recorded."""
    mode = CommDebugMode(tracer_provider=provider, live_spans=live, **options)
    processors = provider._active_span_processor._span_processors
    seen = next((p for p in processors if isinstance(p, _Seen)), None)
    with mock.patch.dict(os.environ, {"RANK": "1"}), hp_otel.step(3, run_id="readable-run", rank=1), mode:
        for _ in range(3):
            mlp_forward_events(mode.observer)
        observer = mode.observer
        observer.on_module_enter(ModuleInfo("boom", "Boom", "Boom"), "forward")
        observer.on_collective(_INFO, 10, 20, error=RuntimeError("lost rank"))
        observer.on_module_exit("boom", "forward", ValueError("bad shape"))
        ended_inside = len(seen.ended) if seen is not None else 0
    return mode, ended_inside


def _provider(*processors: SpanProcessor, **kwargs: Any) -> TracerProvider:
    provider = TracerProvider(**kwargs)
    for processor in processors:
        provider.add_span_processor(processor)
    return provider


def _shape(spans: tuple[ReadableSpan, ...]) -> list[tuple[Any, ...]]:
    """Each span as what does not depend on the clock: name, parent's name, attributes but times,
    status, events' names and attribute names, links' targets, resource, scope."""
    by_id = {span.context.span_id: span for span in spans}
    out = []
    for span in spans:
        parent = by_id.get(span.parent.span_id).name if span.parent and span.parent.span_id in by_id else None
        attrs = {k: v for k, v in span.attributes.items() if not isinstance(v, float)}
        out.append(
            (
                span.name,
                parent,
                span.parent is not None,
                span.kind,
                span.status.status_code,
                span.status.description,
                attrs,
                [(e.name, sorted(e.attributes)) for e in span.events],
                [(link.context.trace_id, link.context.span_id, dict(link.attributes)) for link in span.links],
                span.resource,
                span.instrumentation_scope,
                span.context.trace_flags,
            )
        )
    return sorted(out, key=repr)


def test_deferred_spans_are_the_spans_the_sdk_path_makes() -> None:
    provider = _provider()
    sdk, _ = _window(provider, live=True)
    direct, _ = _window(provider)
    sdk_spans, direct_spans = sdk.get_finished_spans(), direct.get_finished_spans()
    assert len(direct_spans) == len(sdk_spans) == 3 * 7 + 2
    assert _shape(direct_spans) == _shape(sdk_spans)
    assert any(s.links for s in direct_spans) and any(s.status.status_code is StatusCode.ERROR for s in direct_spans)
    assert len({s.context.span_id for s in direct_spans}) == len(direct_spans)  # fresh ids
    assert {s.context.trace_id for s in direct_spans} == {s.context.trace_id for s in sdk_spans}  # the step's trace


def test_your_processors_get_them_at_window_end_without_on_start() -> None:
    seen = _Seen()
    exporter = InMemorySpanExporter()
    provider = _provider(seen, SimpleSpanProcessor(exporter))
    mode, ended_inside = _window(provider)  # the default with your provider: deferred
    assert ended_inside == 0 and seen.started == 0
    assert len(seen.ended) == len(exporter.get_finished_spans()) == len(mode.get_finished_spans()) == 23
    assert {s.context.span_id for s in seen.ended} == {s.context.span_id for s in mode.get_finished_spans()}

    live_seen = _Seen()
    _, live_ended_inside = _window(_provider(live_seen), live=True)  # the opt-in: today's SDK path
    assert live_seen.started == len(live_seen.ended) == 23 and live_ended_inside == 23


@pytest.mark.parametrize("live", [False, True], ids=["deferred", "live"])
def test_the_sampler_is_asked_once_per_window_when_deferred(live: bool) -> None:
    sampler = _CountingSampler(Decision.RECORD_AND_SAMPLE)
    mode, _ = _window(_provider(sampler=sampler), live=live)
    spans = mode.get_finished_spans()
    assert len(spans) == 23 and all(s.attributes["sampled.by"] == "test" for s in spans)
    assert sampler.calls == (23 if live else 1)  # live spans ask once each


def test_a_sampled_out_window_builds_nothing_and_still_counts() -> None:
    seen = _Seen()
    mode, _ = _window(_provider(seen, sampler=ALWAYS_OFF))
    assert mode.get_finished_spans() == () and seen.ended == [] and mode.get_dropped_record_count() == 0
    assert sum(mode.get_comm_counts().values()) > 0  # counted all the same


def test_the_providers_span_limits_bound_them_as_the_sdk_does() -> None:
    limits = SpanLimits(max_span_attributes=3, max_attribute_length=4)
    sdk, _ = _window(_provider(span_limits=limits), live=True)
    direct, _ = _window(_provider(span_limits=limits))
    for spans in (sdk.get_finished_spans(), direct.get_finished_spans()):
        assert all(len(s.attributes) <= 3 for s in spans) and any(s.dropped_attributes for s in spans)
        assert all(len(v) <= 4 for s in spans for v in s.attributes.values() if isinstance(v, str))
    assert _shape(direct.get_finished_spans()) == _shape(sdk.get_finished_spans())


def test_a_hook_writes_on_a_deferred_span_as_on_the_sdk_span() -> None:
    hooked: list[Any] = []

    def hook(span, info) -> None:
        assert span.is_recording() and span.name == "all_reduce" and span.attributes["hp_otel.call.kind"]
        span.set_attribute("user.list", [1, 2])  # a list: kept as a tuple, as the SDK keeps it
        span.set_attributes({"user.odd": object(), "user.ok": "yes"})  # not a valid value: as the SDK has it
        span.add_event("user.event", {"n": 1})
        span.update_name("all_reduce!")
        span.set_status(StatusCode.OK)
        span.set_status(StatusCode.ERROR, "ignored: OK is final")
        hooked.append(span)

    sdk, _ = _window(_provider(), live=True, collective_hook=hook)
    direct, _ = _window(_provider(), collective_hook=hook)
    renamed = [s for s in direct.get_finished_spans() if s.name == "all_reduce!"]
    assert len(renamed) == len(hooked) // 2 > 0
    for span in renamed:
        assert span.attributes["user.list"] == (1, 2) and span.attributes["user.ok"] == "yes"
        assert [e.name for e in span.events][-1] == "user.event" and span.status.status_code is StatusCode.OK
    assert _shape(direct.get_finished_spans()) == _shape(sdk.get_finished_spans())
    last = hooked[-1]
    assert not last.is_recording() and last.end_time == renamed[-1].end_time  # ended: later writes ignored
    last.set_attribute("user.late", 1)
    assert "user.late" not in last.attributes


def test_a_raising_processor_is_counted_and_the_span_kept() -> None:
    class Broken(_Seen):
        def on_end(self, span: ReadableSpan) -> None:
            raise RuntimeError("exporter down")

    mode, _ = _window(_provider(Broken()))
    assert len(mode.get_finished_spans()) == 23
    assert mode.get_callback_error_counts().get("span_processor") == 23


class _CountingIds(RandomIdGenerator):
    """The SDK's random generator, subclassed: a span id from 1 up (a deferred span must still ask it)."""

    def __init__(self) -> None:
        self.span_ids = 0

    def generate_span_id(self) -> int:
        self.span_ids += 1
        return self.span_ids


def test_deferred_span_ids_come_from_the_providers_id_generator() -> None:
    ids = _CountingIds()
    mode, _ = _window(_provider(id_generator=ids))
    spans = mode.get_finished_spans()
    # as rank 1 its collectives link to rank 0's (matching.py): no span id is derived, every span asks
    assert all(s.links for s in spans if s.name == "all_reduce")
    assert (
        sorted(s.context.span_id for s in spans) == list(range(1, len(spans) + 1)) == list(range(1, ids.span_ids + 1))
    )


def test_the_sdks_own_random_ids_are_valid_and_distinct(monkeypatch) -> None:
    """The SDK's `RandomIdGenerator` is drawn from `random.getrandbits` directly; a zero draw is drawn again."""
    draws = iter([0, 0, *range(1, 100)])
    monkeypatch.setattr(random_module, "getrandbits", lambda bits: next(draws))
    mode, _ = _window(_provider())
    spans = mode.get_finished_spans()
    span_ids = [s.context.span_id for s in spans]
    assert 0 not in span_ids and len(set(span_ids)) == len(span_ids) == 23
