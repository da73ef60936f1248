"""Where a step session's data went, said in one line for a person (a callback's end-of-training summary).

A user who added a callback and set nothing sees nothing exported; this says so, and how to send it.
"""

from __future__ import annotations

from typing import Any

from hp_otel.export import telemetry as export

HOW_TO_SEND = (
    "nothing was exported; to see the traced steps set OTEL_TRACES_EXPORTER=console (spans printed), "
    "OTEL_EXPORTER_OTLP_ENDPOINT=http://HOST:4318 (Jaeger, Tempo, Phoenix, MLflow), "
    "OTEL_EXPORTER_PROMETHEUS_PORT=9464 (/metrics), or collectives_dir=DIR (a file per rank for `hp-otel ranks`); "
    "see docs/guide/export.md"
)


def _exporters(names: tuple[str, ...], otlp: str | None) -> list[str]:
    return [f"OTLP {otlp}" if name == "otlp" and otlp else name for name in names]


def where_it_went(session: Any) -> str:
    """`spans: ...; metrics: ...; collectives files: ...`, or how to send it when nothing was exported."""
    parts: list[str] = []
    configured = export.configured()
    if configured is not None and session.tracer_provider is configured.tracer_provider:
        spans = _exporters(configured.config.traces_exporters, configured.traces_endpoint)
        if spans:
            parts.append(f"spans to {', '.join(spans)}")
        metrics = _exporters(configured.config.metrics_exporters, None)
        if configured.prometheus_port is not None:
            metrics.append(
                f"Prometheus http://{configured.config.prometheus_host}:{configured.prometheus_port}/metrics"
            )
        if metrics:
            parts.append(f"metrics to {', '.join(metrics)}")
    elif type(session.tracer_provider).__module__.startswith("opentelemetry.sdk"):
        parts.append("spans and metrics to the OpenTelemetry providers set by the program")
    collectives = getattr(session, "collectives", None)
    if collectives is not None:
        paths = collectives.paths or [collectives.folder]
        parts.append(f"the collectives of the last {collectives.keep} sampled steps in {', '.join(paths)}")
    return "; ".join(parts) if parts else HOW_TO_SEND
