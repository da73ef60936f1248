"""A traced window's events on their way to spans: the unbuilt events, the span builder, the build lock.

- deferred (default with hp_otel's own provider): events wait here and are built when the spans
  are first read, or, once `max_pending` events have piled up, the oldest in slices of
  `_BUILD_SLICE`: the training step pays for an append, not for an SDK span
  (docs/how-it-works/costs.md), and a long window's step never waits for more than one slice;
- live (default with your `tracer_provider`): each event is built as it happens, so spans reach
  your processors at once and are the current span while their work runs.
"""

from __future__ import annotations

import threading
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import Tracer

from hp_otel.record import events as ev
from hp_otel.record import matching
from hp_otel.record.faults import FaultSink, weak_sink
from hp_otel.record.in_flight import InFlight
from hp_otel.record.settings import RecorderSettings
from hp_otel.record.span_builder import SpanBuilder
from hp_otel.record.span_store import LocalSpanStore

_BUILD_SLICE = 256  # unbuilt events built at a time once `max_pending` wait (a bounded part of one step)


class SpanFeed:
    """Feeds a window's events to its `SpanBuilder`, now (live) or later (deferred)."""

    def __init__(self, tracer: Tracer, store: LocalSpanStore, settings: RecorderSettings, on_fault: FaultSink) -> None:
        self._tracer = tracer
        self._store = store
        self.live = settings.live
        self._hooks = settings.hooks
        self._store_only = settings.store_only and not settings.live  # past max_spans: counted, not built
        self._max_pending = max(settings.max_pending, 1)
        self._on_fault = weak_sink(on_fault)
        self._parent_ctx: Any = None  # the window's parent context (a builder made later nests there)
        self._window: matching.Window | None = None
        self.pending: list[ev.Event] = []
        self.builder: SpanBuilder | None = None
        # Re-entrant: a span hook runs inside a build and may read the mode (`get_finished_spans`,
        # `write_spans`) on the same thread; `building` names that thread, whose reads then see the
        # spans built so far instead of building again inside the build.
        self.lock = threading.RLock()
        self.building = 0

    def start(self, parent_ctx: Any, window: matching.Window | None, build: bool) -> None:
        """A window starts under `parent_ctx`; `build`: make its builder now (else only if asked for)."""
        self.materialise()  # spans of an earlier window are built with that window's builder
        self._parent_ctx, self._window = parent_ctx, window
        self.builder = self._new_builder() if build else None

    def _new_builder(self) -> SpanBuilder:
        return SpanBuilder(self._tracer, self._store, self._parent_ctx, self.live, self._on_fault, self._window,
                           self._hooks, store_only=self._store_only)  # fmt: skip

    def emit(self, event: ev.Event) -> None:
        """One event of the window: built now (live), or kept until read (bounded by `max_pending`)."""
        if self.live:
            builder = self.builder
            if builder is not None:
                try:
                    builder.feed(event)
                except Exception as exc:
                    self._on_fault("span_build", exc)
            return
        pending = self.pending
        pending.append(event)
        if len(pending) >= self._max_pending:  # bound memory: build now, the store caps what it keeps
            self.build_oldest()

    def materialise(self) -> None:
        """Build the spans of every event recorded so far (from a span hook during a build: nothing more)."""
        if self.building == threading.get_ident():
            return
        with self.lock:
            pending, self.pending = self.pending, []
            self._build(pending)

    def build_oldest(self, count: int | None = None) -> None:
        """Build the spans of the oldest `count` unbuilt events: what the step pays once `max_pending`
        wait, a slice at a time, so no single step pauses for the whole backlog; each later slice
        comes after as many new events."""
        if self.building == threading.get_ident():  # a hook's own collective or module during a build
            return
        count = _BUILD_SLICE if count is None else count
        with self.lock:
            pending = self.pending
            batch = pending[:count]
            del pending[:count]
            self._build(batch)

    def _build(self, events: list[ev.Event]) -> None:
        """Feed `events` to the builder (under the lock). An exception that is not a fault of ours
        (Ctrl-C, SystemExit from a hook) puts back every event not yet built, the interrupted one
        included, so a later read builds them: nothing recorded is lost."""
        builder = self.builder
        if builder is None:
            return
        self.building = threading.get_ident()
        try:
            builder.feed_all(events, self._on_build_fault)
        except BaseException:
            self.pending[:0] = events[builder.fed :]
            raise
        finally:
            self.building = 0

    def _on_build_fault(self, exc: BaseException) -> None:
        self._on_fault("span_build", exc)

    def reset(self, window_open: bool) -> None:
        """Forget the unbuilt events; between windows (`window_open` False) also the builder and its
        per-window caches. Refused from a span hook while a build runs: it would go on with what it forgot."""
        if self.building == threading.get_ident():
            raise RuntimeError(
                "clear() was called from a span hook (collective_hook, module_hook, op_hook) while the mode "
                "builds its spans; clear the mode after reading it, outside the hook"
            )
        with self.lock:
            self.pending = []  # a new list: the old one's memory goes (clear() keeps its capacity)
            if not window_open:
                self.builder = None

    def in_flight_spans(self, in_flight: InFlight, now_ns: int, window_open: bool) -> list[ReadableSpan]:
        """The in-flight collectives as finished spans marked in flight (for a file; nothing is exported)."""
        self.materialise()
        builder = self.builder
        if builder is None and window_open and len(in_flight):  # a counts-only window's first one
            with self.lock:
                builder = self.builder = self.builder or self._new_builder()
        if builder is None:
            return []
        spans = []
        with self.lock:
            for issue in in_flight.in_flight():
                try:
                    spans.append(builder.in_flight_span(issue, now_ns))
                except Exception as exc:  # live spans change under us on the training thread: skip this one
                    self._on_fault("in_flight_span", exc)
        return spans
