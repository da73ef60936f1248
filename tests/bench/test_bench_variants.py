"""The variants that make hp_otel's spans as a user gets them: "spans read" reads them back each step and
"exporting provider" hands them to a user's batch processor. Spans are counted where they reach the
OpenTelemetry SDK or the user as `ReadableSpan`s, not through hp_otel's or the bench's own figures: a
deferred window makes its `ReadableSpan`s without their `__init__` (record/readable_spans.py), so the
referee counts those made by `__init__`, those the SDK's `BatchSpanProcessor.on_end` receives, and
those `get_finished_spans()` hands back."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from benchmarks import instructions
from benchmarks.dropping_exporter import DroppingExporter
from benchmarks.timing import run_workload
from benchmarks.variants import (
    HP_OTEL,
    HP_OTEL_EXPORTING,
    HP_OTEL_READ,
    SPANS_READ,
    UNTRACED,
    VARIANT_NAMES,
    build_variants,
)
from benchmarks.workloads import build_workload
from hp_otel import CommDebugMode

STEPS = 3


@pytest.fixture
def sdk_spans(monkeypatch) -> list[int]:
    """How many SDK spans were made or handed on: one element per span constructed by `ReadableSpan.__init__`,
    received by a `BatchSpanProcessor`, or returned to the user by `get_finished_spans()`."""
    made: list[int] = []
    real_init = ReadableSpan.__init__
    real_on_end = BatchSpanProcessor.on_end
    real_read = CommDebugMode.get_finished_spans

    def counting_init(self, *args, **kwargs) -> None:
        made.append(1)
        real_init(self, *args, **kwargs)

    def counting_on_end(self, span) -> None:
        if isinstance(span, ReadableSpan):
            made.append(1)
        real_on_end(self, span)

    def counting_read(self, *args, **kwargs):
        spans = real_read(self, *args, **kwargs)
        made.extend(1 for span in spans if isinstance(span, ReadableSpan))
        return spans

    monkeypatch.setattr(ReadableSpan, "__init__", counting_init)
    monkeypatch.setattr(BatchSpanProcessor, "on_end", counting_on_end)
    monkeypatch.setattr(CommDebugMode, "get_finished_spans", counting_read)
    return made


def _spans_per_step(name: str, sdk_spans: list[int]) -> list[int]:
    """SDK spans made in each of STEPS steps of variant `name` on the MLP, after one warm-up step."""
    workload = build_workload("mlp")
    (variant,) = [v for v in build_variants(workload.model)[0] if v.name == name]
    per_step = []
    with variant.around_block():
        with variant.step_context():
            workload.step()
        for _ in range(STEPS):
            before = len(sdk_spans)
            with variant.step_context():
                workload.step()
            per_step.append(len(sdk_spans) - before)
    return per_step


def test_the_new_variants_are_listed_after_hp_otel() -> None:
    at = VARIANT_NAMES.index(HP_OTEL)
    assert VARIANT_NAMES[at + 1 : at + 3] == (HP_OTEL_READ, HP_OTEL_EXPORTING)


def test_hp_otel_alone_builds_no_sdk_span(fake_world, sdk_spans) -> None:
    # why the two variants exist: its own provider defers the spans and nobody reads them
    assert _spans_per_step(HP_OTEL, sdk_spans) == [0] * STEPS


def test_spans_read_builds_and_reads_spans_every_step(fake_world, sdk_spans) -> None:
    SPANS_READ.per_step.clear()
    per_step = _spans_per_step(HP_OTEL_READ, sdk_spans)
    assert all(n > 0 for n in per_step)
    read = SPANS_READ.per_step[1:]  # the warm-up step's read first
    assert len(read) == STEPS and all(0 < n <= made for n, made in zip(read, per_step, strict=True))


def test_exporting_provider_hands_every_step_s_spans_to_the_exporter(fake_world, sdk_spans) -> None:
    _spans_per_step(HP_OTEL_READ, sdk_spans)
    window_spans = SPANS_READ.per_step[-1]  # the spans of one window, as read from hp_otel's own store
    exported_before = DroppingExporter.exported
    per_step = _spans_per_step(HP_OTEL_EXPORTING, sdk_spans)
    assert all(n > 0 for n in per_step)
    # the provider was shut down after the block, flushing its batch: every span of every window exported
    assert DroppingExporter.exported - exported_before == (STEPS + 1) * window_spans > 0


def test_exporting_provider_is_made_once_per_block_and_shut_down(fake_world, monkeypatch) -> None:
    from opentelemetry.sdk.trace import TracerProvider

    made, shut = [], []
    real_init, real_shutdown = TracerProvider.__init__, TracerProvider.shutdown

    def counting_init(self, *args, **kwargs) -> None:
        made.append(self)
        real_init(self, *args, **kwargs)

    def counting_shutdown(self) -> None:
        shut.append(self)
        real_shutdown(self)

    monkeypatch.setattr(TracerProvider, "__init__", counting_init)
    monkeypatch.setattr(TracerProvider, "shutdown", counting_shutdown)
    workload = build_workload("mlp")
    (variant,) = [v for v in build_variants(workload.model)[0] if v.name == HP_OTEL_EXPORTING]
    with variant.around_block():
        for _ in range(STEPS):
            with variant.step_context():
                workload.step()
    assert len(made) == 1 and shut == made


def test_the_timed_bench_runs_them_with_a_per_event_figure(fake_world) -> None:
    result = run_workload(build_workload("mlp"), rounds=1, steps=1, only=[HP_OTEL_READ, HP_OTEL_EXPORTING])
    assert [v.name for v in result.variants] == [UNTRACED, HP_OTEL_READ, HP_OTEL_EXPORTING]
    assert all(v.ratio.us_per_event is not None for v in result.variants[1:])


class _NoCallgrind:
    """Stands for the client-request library outside valgrind: counts the start and stop requests."""

    def __init__(self) -> None:
        self.requests: list[str] = []

    def hp_otel_cg_start(self) -> None:
        self.requests.append("start")

    def hp_otel_cg_stop(self) -> None:
        self.requests.append("stop")


@pytest.mark.parametrize("name", [HP_OTEL_READ, HP_OTEL_EXPORTING])
def test_the_instructions_child_runs_each_new_variant(name, fake_world, monkeypatch, sdk_spans) -> None:
    library = _NoCallgrind()
    monkeypatch.setattr("ctypes.CDLL", lambda path: library)
    assert instructions._counted_child("mlp", name, 2, "unused.so") == 0
    assert library.requests == ["start", "stop"] and sdk_spans


class _ExportsAtRequests(_NoCallgrind):
    """Also notes, at each request, the spans the batch processor had received and those exported by then."""

    def __init__(self, received: list[int]) -> None:
        super().__init__()
        self.received = received
        self.seen: list[tuple[int, int]] = []

    def hp_otel_cg_start(self) -> None:
        super().hp_otel_cg_start()
        self.seen.append((len(self.received), DroppingExporter.exported))

    def hp_otel_cg_stop(self) -> None:
        super().hp_otel_cg_stop()
        self.seen.append((len(self.received), DroppingExporter.exported))


def test_the_instructions_child_exports_each_step_s_spans_inside_the_count(fake_world, monkeypatch, sdk_spans) -> None:
    # the worker thread exports on a 5 s timer or at 512 queued spans, far from these few steps:
    # only the child's drain exports here, before the count starts and inside it
    library = _ExportsAtRequests(sdk_spans)
    monkeypatch.setattr("ctypes.CDLL", lambda path: library)
    exported_before = DroppingExporter.exported
    assert instructions._counted_child("mlp", HP_OTEL_EXPORTING, 2, "unused.so") == 0
    (received_at_start, exported_at_start), (received_at_stop, exported_at_stop) = library.seen
    assert received_at_stop > received_at_start > 0
    # nothing of the warm-up left queued into the count, and every counted span exported within it
    assert exported_at_start - exported_before == received_at_start
    assert exported_at_stop - exported_before == received_at_stop
