"""The local span store: an SDK InMemorySpanExporter with a retention cap.

The recorder hands every finished span to it directly (no span processor on the hot
path); tables and JSON are rendered from what it holds.  Past the cap it keeps the
first spans and counts the rest as dropped, so a long window costs bounded memory
while the collective counters stay exact.
"""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter


class LocalSpanStore(InMemorySpanExporter):
    """Keeps at most `max_spans` finished spans; counts the ones it turns away."""

    def __init__(self, max_spans: int) -> None:
        super().__init__()
        self.max_spans = max_spans
        self.dropped_spans = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._stopped:
            return SpanExportResult.FAILURE
        with self._lock:
            room = self.max_spans - len(self._finished_spans)
            if room >= len(spans):
                self._finished_spans.extend(spans)
            else:
                room = max(room, 0)
                self._finished_spans.extend(spans[:room])
                self.dropped_spans += len(spans) - room
        return SpanExportResult.SUCCESS

    def clear(self) -> None:
        with self._lock:
            self._finished_spans.clear()
            self.dropped_spans = 0
