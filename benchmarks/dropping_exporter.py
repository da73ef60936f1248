"""A span exporter that sends nothing: a user's export path (provider, batch processor) without a network."""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult


class DroppingExporter(SpanExporter):
    """Counts the spans handed to it (all instances together: tests read it) and drops them."""

    exported = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        DroppingExporter.exported += len(spans)
        return SpanExportResult.SUCCESS
