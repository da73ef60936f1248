"""The local span store: an in-memory span exporter with a retention cap.

The recorder hands every finished span to it directly (no span processor on the hot
path); tables and JSON are rendered from what it holds.  Past the cap it keeps the
first spans and counts the rest as dropped, so a long window costs bounded memory
while the collective counters stay exact.  Its own list and lock (the SDK's
InMemorySpanExporter keeps them private), with the same interface.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult


class LocalSpanStore(SpanExporter):
    """Keeps at most `max_spans` finished spans; counts the ones it turns away."""

    def __init__(self, max_spans: int) -> None:
        self.max_spans = max_spans
        self.dropped_spans = 0
        self._spans: list[ReadableSpan] = []
        self._lock = threading.Lock()
        self._stopped = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._stopped:
            return SpanExportResult.FAILURE
        with self._lock:
            room = self.max_spans - len(self._spans)
            if room >= len(spans):
                self._spans.extend(spans)
            else:
                room = max(room, 0)
                self._spans.extend(spans[:room])
                self.dropped_spans += len(spans) - room
        return SpanExportResult.SUCCESS

    @property
    def full(self) -> bool:
        """True once `max_spans` are kept: every later span is dropped."""
        return len(self._spans) >= self.max_spans

    def count_dropped(self, spans: int) -> None:
        """Spans not even built because they would have been dropped (see `SpanBuilder`)."""
        with self._lock:
            self.dropped_spans += spans

    def get_finished_spans(self) -> tuple[ReadableSpan, ...]:
        with self._lock:
            return tuple(self._spans)

    def clear(self) -> None:
        with self._lock:
            self._spans.clear()
            self.dropped_spans = 0

    def shutdown(self) -> None:
        """Later exports fail, as the SDK's in-memory exporter's do."""
        self._stopped = True

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True
