"""Real SDK providers that send hp_otel's spans and metrics out, without holding training back.

- Spans: a `BatchSpanProcessor` (bounded queue; the step only appends to it) in front
  of the OTLP exporter the protocol asks for. When the queue is full the oldest span
  is dropped; drops are counted here and logged once.
- Metrics: a `PeriodicExportingMetricReader` with the OTLP exporter, and/or a
  `PrometheusMetricReader` behind a `/metrics` HTTP endpoint on base port + local rank.
- Shutdown flushes within `shutdown_timeout_s`, also when the endpoint is down or
  blackholed: it runs on a helper thread that is abandoned past the deadline.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import errno
import logging
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricExportResult,
    MetricReader,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace import sampling as otel_sampling
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from hp_otel.common import _otel_compat
from hp_otel.common.env_read import SDK_DISABLED_VARIABLE, sdk_disabled
from hp_otel.common.launcher_env import local_rank
from hp_otel.export import providers
from hp_otel.export.config import OTLP, SAMPLERS, ExportConfig, known_secrets
from hp_otel.export.log_limits import NOISY_LOGGERS, limit_sdk_logs, unlimit_sdk_logs
from hp_otel.export.prometheus_sd import forget, remove_at_termination, write_target
from hp_otel.export.providers import build_resource
from hp_otel.export.resource_detector import SERVICE_NAME
from hp_otel.export.secrets import mask_sdk_logs, redact_url
from hp_otel.spans import schema

logger = logging.getLogger("hp_otel")


class CountingSpanExporter(SpanExporter):
    """Wraps the real exporter: counts what it was handed, sent and failed to send, and
    stops calling it for a while after a failure.

    Encoding a batch of spans to OTLP costs CPU in this process whether or not anyone
    listens; with the endpoint down that work is wasted and competes with training for
    the interpreter. So after a failed export, batches fail at once (counted as failed)
    until a cool-down passes, doubling per consecutive failure up to `max_cooldown_s`;
    one success resets it.
    """

    def __init__(self, exporter: SpanExporter, first_cooldown_s: float = 1.0, max_cooldown_s: float = 30.0) -> None:
        self.exporter = exporter
        self.handed = 0
        self.exported = 0
        self.failed = 0
        self.skipped = 0  # failed without trying: the endpoint was cooling down
        self.first_cooldown_s = first_cooldown_s
        self.max_cooldown_s = max_cooldown_s
        self._cooldown_s = 0.0
        self._retry_at = 0.0
        self._failure_logged = False
        self._pid = os.getpid()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if os.getpid() != self._pid:  # a forked child (a DataLoader worker): see ForkSilencedMetricExporter
            return SpanExportResult.SUCCESS
        self.handed += len(spans)
        now = time.monotonic()
        if now < self._retry_at:
            self.failed += len(spans)
            self.skipped += len(spans)
            return SpanExportResult.FAILURE
        try:
            result = self.exporter.export(spans)
        except Exception as exc:  # an exporter fault must not kill the batch thread
            result = SpanExportResult.FAILURE
            logger.debug("hp_otel: span exporter raised", exc_info=exc)
        if result is SpanExportResult.SUCCESS:
            self.exported += len(spans)
            self._cooldown_s = 0.0
            return result
        self.failed += len(spans)
        self._cooldown_s = min(max(self._cooldown_s * 2, self.first_cooldown_s), self.max_cooldown_s)
        self._retry_at = time.monotonic() + self._cooldown_s
        if not self._failure_logged:
            self._failure_logged = True
            logger.warning(
                "hp_otel: exporting spans failed (is the OTLP endpoint up?); training goes on, "
                "exports pause up to %.0f s between tries, later failures are counted, not logged",
                self.max_cooldown_s,
            )
        return result

    def shutdown(self) -> None:
        self.exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.exporter.force_flush(timeout_millis)


class DropCountingBatchSpanProcessor(BatchSpanProcessor):
    """The SDK's BatchSpanProcessor, counting the spans its bounded queue drops (logged once).

    The queue holds what was emitted and not yet handed to the exporter, so a span that
    arrives while it is full pushes the oldest one out.
    """

    def __init__(
        self, exporter: SpanExporter, max_queue_size: int | None = None, schedule_delay_millis: float | None = None
    ) -> None:
        self.counting = CountingSpanExporter(exporter)
        # None: the SDK's own value, from OTEL_BSP_MAX_QUEUE_SIZE / OTEL_BSP_SCHEDULE_DELAY / ..._MAX_EXPORT_BATCH_SIZE.
        self.max_queue_size = max_queue_size or _otel_compat.default_max_queue_size()
        batch_size = _otel_compat.default_max_export_batch_size()
        self.emitted = 0
        self.dropped = 0
        self._drop_logged = False
        super().__init__(
            self.counting,
            max_queue_size=max_queue_size,
            schedule_delay_millis=schedule_delay_millis,
            max_export_batch_size=min(batch_size, self.max_queue_size),
        )

    def on_end(self, span: ReadableSpan) -> None:
        if not (span.context and span.context.trace_flags.sampled):
            return
        if self.emitted - self.counting.handed >= self.max_queue_size:
            self.dropped += 1
            if not self._drop_logged:
                self._drop_logged = True
                logger.warning(
                    "hp_otel: span export queue full (%d spans), dropping the oldest; training is not slowed. "
                    "Later drops are counted (Telemetry.dropped_spans), not logged",
                    self.max_queue_size,
                )
        else:
            self.emitted += 1
        super().on_end(span)


def make_sampler(name: str | None, arg: float | None) -> otel_sampling.Sampler | None:
    """An SDK sampler by its OTEL_TRACES_SAMPLER name; None lets the SDK read the environment."""
    if name is None:
        return None
    return SAMPLERS[name](1.0 if arg is None else float(arg))


def _otlp_arguments(config: ExportConfig, endpoint: str | None) -> dict[str, Any]:
    """Only what configure() was given: the exporter reads everything else (per-signal first) itself."""
    arguments: dict[str, Any] = {}
    if endpoint:
        arguments["endpoint"] = endpoint
    if config.headers:
        arguments["headers"] = dict(config.headers)
    if config.export_timeout_s is not None:
        arguments["timeout"] = config.export_timeout_s
    return arguments


def make_span_exporter(config: ExportConfig) -> SpanExporter:
    """The OTLP span exporter of the configured protocol (the classes do not read OTEL_EXPORTER_OTLP_PROTOCOL)."""
    arguments = _otlp_arguments(config, config.traces_endpoint)
    if config.traces_protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter

        return GrpcSpanExporter(**arguments)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter

    return HttpSpanExporter(**arguments)


class ForkSilencedMetricExporter(MetricExporter):
    """The OTLP metric exporter, silent in a process forked from the one that configured it.

    The SDK restarts its export threads in a forked child (a DataLoader worker with the
    `fork` start method), which would then export the parent's cumulative totals, frozen
    at fork time, under the parent's identity: counters seen by a backend would jump
    back and forth. So in a child, exports are dropped (the same holds for spans, see
    CountingSpanExporter). Telemetry in a child is off; call `hp_otel.configure()` there
    to export from it under its own identity.
    """

    def __init__(self, exporter: MetricExporter) -> None:
        super().__init__(
            preferred_temporality=_otel_compat.preferred_temporality(exporter),
            preferred_aggregation=_otel_compat.preferred_aggregation(exporter),
        )
        self.exporter = exporter
        self._pid = os.getpid()

    def export(self, metrics_data: Any, timeout_millis: float = 10_000, **kwargs: Any) -> MetricExportResult:
        if os.getpid() != self._pid:
            return MetricExportResult.SUCCESS
        return self.exporter.export(metrics_data, timeout_millis=timeout_millis, **kwargs)

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return os.getpid() != self._pid or self.exporter.force_flush(timeout_millis=timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        if os.getpid() == self._pid:
            self.exporter.shutdown(timeout_millis=timeout_millis, **kwargs)


def _after_fork_in_child() -> None:
    """hp_otel in a forked child: forget the parent's configured telemetry (its exporters are silent here)."""
    global _configured
    _configured = None
    providers.set_default_providers(None, None)


def make_metric_exporter(config: ExportConfig) -> Any:
    arguments = _otlp_arguments(config, config.metrics_endpoint)
    if config.metrics_protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as GrpcMetricExporter

        return GrpcMetricExporter(**arguments)
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as HttpMetricExporter

    return HttpMetricExporter(**arguments)


def _sdk_exporter(signal: str, name: str) -> Any:
    """An exporter the SDK's auto-configuration would make for this OTEL_<SIGNAL>_EXPORTER name (`console`, ...)."""
    from importlib.metadata import entry_points

    group = f"opentelemetry_{signal}_exporter"
    (entry,) = entry_points(group=group, name=name)
    return entry.load()()


def make_span_exporters(config: ExportConfig) -> list[SpanExporter]:
    """One exporter per name in `config.traces_exporters` (`otlp`: hp_otel's protocol choice)."""
    return [
        make_span_exporter(config) if name == OTLP else _sdk_exporter("traces", name)
        for name in config.traces_exporters
    ]


def make_metric_readers(config: ExportConfig) -> list[MetricReader]:
    """A periodic reader per metric exporter; interval and timeout from OTEL_METRIC_EXPORT_* unless given."""
    readers: list[MetricReader] = []
    for name in config.metrics_exporters:
        exporter = make_metric_exporter(config) if name == OTLP else _sdk_exporter("metrics", name)
        if isinstance(exporter, MetricReader):  # some entry points are readers already
            readers.append(exporter)
            continue
        readers.append(
            PeriodicExportingMetricReader(
                ForkSilencedMetricExporter(exporter),  # a forked child exports nothing of the parent's
                export_interval_millis=config.metric_export_interval_ms,
                export_timeout_millis=None if config.export_timeout_s is None else config.export_timeout_s * 1000,
            )
        )
    return readers


def exporter_endpoint(exporter: Any) -> str | None:
    """Where an OTLP exporter sends (as it resolved it from arguments and variables), for messages."""
    return _otel_compat.exporter_endpoint(exporter)


def prometheus_port_for_this_rank(base_port: int) -> int:
    """The port rule: base port + local rank, so the ranks of one host never collide (base 0: any free port)."""
    return 0 if base_port == 0 else base_port + (local_rank() or 0)


class PrometheusPortError(OSError):
    """The Prometheus endpoint's port cannot be bound (busy, or not allowed)."""


def start_prometheus(host: str, base_port: int, source: str = "prometheus_port") -> tuple[MetricReader, Any, int]:
    """A PrometheusMetricReader and the HTTP server exposing it (`metrics_server`); returns (reader, server, port).

    A port that cannot be bound raises PrometheusPortError naming the port, the rule
    (base + local rank) and the setting `source` the base came from.
    """
    from opentelemetry.exporter.prometheus import PrometheusMetricReader

    from hp_otel.export.metrics_server import start_metrics_server

    port = prometheus_port_for_this_rank(base_port)
    if port > 65535:  # the socket would raise a bare OverflowError deep in the server's setup
        rank = local_rank() or 0
        raise PrometheusPortError(
            errno.EINVAL,
            f"Prometheus port {port} is above 65535 (the port is {source}={base_port} + local rank {rank}); "
            f"set {source} to at most {65535 - rank}, or 0 for any free port",
        )
    try:
        server, _thread = start_metrics_server(port, host)  # threads bounded, unlike start_http_server's
    except OSError as exc:
        rank = local_rank()
        rule = f"{source}={base_port} + local rank {rank}" if rank else f"{source}={base_port}"
        why = "is already in use" if exc.errno == errno.EADDRINUSE else f"cannot be bound ({exc.strerror})"
        raise PrometheusPortError(
            exc.errno,
            f"Prometheus port {port} on {host!r} {why} (the port is {rule}); set {source} to a free base port "
            "(each rank of a host adds its local rank), or 0 for any free port",
        ) from exc
    reader = PrometheusMetricReader()
    return reader, server, int(server.server_port)


@dataclass
class Telemetry:
    """What `hp_otel.configure()` installed: providers to use, counts to watch, a bounded shutdown."""

    config: ExportConfig
    resource: Resource
    tracer_provider: TracerProvider
    meter_provider: MeterProvider
    span_processors: list[DropCountingBatchSpanProcessor] = field(default_factory=list)
    metric_readers: list[MetricReader] = field(default_factory=list)
    prometheus_port: int | None = None
    prometheus_sd_file: Path | None = None  # this rank's file_sd target (HP_OTEL_PROMETHEUS_SD_DIR)
    _prometheus_server: Any = None
    _shut_down: bool = field(default=False, repr=False)

    @property
    def span_processor(self) -> DropCountingBatchSpanProcessor | None:
        """The first span export processor (OTLP when configured), None without span export."""
        return self.span_processors[0] if self.span_processors else None

    @property
    def traces_endpoint(self) -> str | None:
        """Where OTLP spans go, as the exporter resolved it, its user part and query masked
        (`http://***@host:4318/v1/traces`; None without OTLP span export)."""
        for processor in self.span_processors:
            endpoint = exporter_endpoint(processor.counting.exporter)
            if endpoint:
                return redact_url(endpoint)
        return None

    @property
    def dropped_spans(self) -> int:
        """Spans the bounded export queues dropped (the local tables and counts are unaffected)."""
        return sum(processor.dropped for processor in self.span_processors)

    @property
    def failed_spans(self) -> int:
        """Spans the exporters could not deliver (endpoint down, refused, timed out)."""
        return sum(processor.counting.failed for processor in self.span_processors)

    def force_flush(self, timeout_s: float | None = None) -> bool:
        """Send what is queued now, waiting at most `timeout_s` (default: the shutdown timeout)."""
        return _bounded(
            lambda: self.tracer_provider.force_flush() and self.meter_provider.force_flush(),
            timeout_s or self.config.shutdown_timeout_s,
            "flush",
        )

    def shutdown(self, timeout_s: float | None = None, then: Any = None) -> bool:
        """Flush and stop exporting within `timeout_s`; True if everything finished in time. `then()`
        runs when the flush has ended, on its thread, even past the deadline (it may still be logging)."""
        if self._shut_down:
            return True
        self._shut_down = True
        budget = timeout_s or self.config.shutdown_timeout_s

        def stop() -> bool:
            try:
                self.tracer_provider.shutdown()
                self.meter_provider.shutdown(timeout_millis=budget * 1000)
            finally:
                if then is not None:
                    then()
            return True

        done = _bounded(stop, budget, "shutdown")
        if self._prometheus_server is not None:
            self._prometheus_server.shutdown()
            self._prometheus_server.server_close()
        if self.prometheus_sd_file is not None:
            self.prometheus_sd_file.unlink(missing_ok=True)  # Prometheus stops scraping a rank that is gone
            forget(self.prometheus_sd_file)
        return done


def _bounded(work: Any, timeout_s: float, what: str) -> bool:
    """Run `work` on a daemon thread and wait at most `timeout_s`; past that, give up on it (logged).

    Exactly one warning per call: the worker's failure and the waiter's timeout can land in the same instant
    (the SDK's own deadline is the same budget), so whichever claims the report first says it.
    """
    result: list[bool] = []
    report_lock = threading.Lock()
    reported: list[bool] = []

    def claim_report() -> bool:
        with report_lock:
            if reported:
                return False
            reported.append(True)
            return True

    def run() -> None:
        try:
            result.append(bool(work()))
        except Exception as exc:
            # One line (the SDK's MeterProvider raises one exception naming every failed reader); the
            # traceback at debug.
            if claim_report():
                logger.warning("hp_otel: telemetry %s failed: %s", what, _one_line(exc))
            logger.debug("hp_otel: telemetry %s failed", what, exc_info=exc)
            result.append(False)

    thread = threading.Thread(target=run, name=f"hp_otel-{what}", daemon=True)
    started = time.monotonic()
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        if claim_report():
            logger.warning(
                "hp_otel: telemetry %s did not finish within %.1f s (endpoint down?); not waiting longer",
                what,
                timeout_s,
            )
        return False
    logger.debug("hp_otel: telemetry %s took %.3f s", what, time.monotonic() - started)
    return bool(result and result[0])


def _one_line(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split()) if str(exc) else type(exc).__name__


def build_telemetry(config: ExportConfig) -> Telemetry:
    """SDK tracer and meter providers wired as the config says (no global state touched)."""
    extra = dict(config.resource_attributes)
    if config.service_name:
        extra[SERVICE_NAME] = config.service_name
    if config.run_id:
        extra.setdefault(schema.RESOURCE_RUN_ID, config.run_id)
    resource = build_resource(extra)

    # The Prometheus port first: if it is busy nothing else has been started (no batch or
    # reader threads left behind); anything later that fails stops what was started.
    prometheus_reader = prometheus_server = prometheus_port = None
    sd_file = None
    if config.prometheus_port is not None:
        prometheus_reader, prometheus_server, prometheus_port = start_prometheus(
            config.prometheus_host, config.prometheus_port, config.prometheus_port_source
        )
    tracer_provider = meter_provider = None
    processors: list[DropCountingBatchSpanProcessor] = []
    try:
        # shutdown_on_exit=False: the SDK's own atexit hook would wait up to 30 s on a dead endpoint.
        tracer_provider = TracerProvider(
            resource=resource, sampler=make_sampler(config.sampler, config.sampler_arg), shutdown_on_exit=False
        )
        for exporter in make_span_exporters(config):
            processor = DropCountingBatchSpanProcessor(exporter, config.max_queue_size, config.schedule_delay_ms)
            tracer_provider.add_span_processor(processor)
            processors.append(processor)
        readers = make_metric_readers(config)
        if prometheus_reader is not None:
            readers.append(prometheus_reader)
            sd_file = write_target(config.prometheus_host, prometheus_port, config.run_id)
            if sd_file is not None:
                remove_at_termination(sd_file)
        meter_provider = MeterProvider(metric_readers=readers, resource=resource, shutdown_on_exit=False)
    except BaseException:
        for stop in (
            tracer_provider.shutdown if tracer_provider is not None else None,
            meter_provider.shutdown if meter_provider is not None else None,
            prometheus_server.shutdown if prometheus_server is not None else None,
            prometheus_server.server_close if prometheus_server is not None else None,
        ):
            if stop is not None:
                with contextlib.suppress(Exception):
                    stop()
        raise
    return Telemetry(
        config=config,
        resource=resource,
        tracer_provider=tracer_provider,
        meter_provider=meter_provider,
        span_processors=processors,
        metric_readers=readers,
        prometheus_port=prometheus_port,
        _prometheus_server=prometheus_server,
        prometheus_sd_file=sd_file,
    )


_lock = threading.Lock()
_configured: Telemetry | None = None


def configure(
    *,
    set_global: bool = False,
    **settings: Any,
) -> Telemetry:
    """Install real SDK providers (OTLP and/or Prometheus export) as hp_otel's defaults.

    Settings are `ExportConfig.resolve`'s keywords (`service_name`, `endpoint`,
    `protocol`, `prometheus_port`, `sampler`, `run_id`, ...); unset ones come from OTel's
    environment variables. From then on `CommDebugMode()`, `hp_otel.step()` and the
    instrumentor use these providers unless given others. Calling it again shuts the
    previous ones down first. `set_global=True` also makes them OpenTelemetry's global
    providers (for your own spans and metrics). Until `shutdown()`, the SDK's and OTLP
    exporters' own log lines (retries, failed batches, full queues) are limited to one
    per kind per minute (`hp_otel.export.log_limits`).
    """
    global _configured
    config = ExportConfig.resolve(**settings)
    if sdk_disabled():  # the SDK's providers hand out no-ops: open no port, make no exporter
        config = dataclasses.replace(config, traces_exporters=(), metrics_exporters=(), prometheus_port=None)
        logger.info("hp_otel: %s=true: configure() opens and exports nothing", SDK_DISABLED_VARIABLE)
    with _lock:
        previous, _configured = _configured, None
    if previous is not None:
        previous.shutdown()
    result = build_telemetry(config)
    mask_sdk_logs(NOISY_LOGGERS, known_secrets(config))  # their lines name endpoints and headers
    with _lock:
        _configured = result
        limit_sdk_logs()  # a dead endpoint's retry and queue lines: one per kind per minute (see shutdown())
    providers.set_default_providers(result.tracer_provider, result.meter_provider)
    if set_global:
        from opentelemetry import metrics, trace

        trace.set_tracer_provider(result.tracer_provider)
        metrics.set_meter_provider(result.meter_provider)
    return result


def configured() -> Telemetry | None:
    """The telemetry `configure()` installed, if any."""
    return _configured


def shutdown(timeout_s: float | None = None) -> bool:
    """Flush and stop what `configure()` installed (bounded); hp_otel falls back to its in-memory defaults."""
    global _configured
    with _lock:
        current, _configured = _configured, None
    if current is None:
        return True
    providers.set_default_providers(None, None)
    # The SDK's log lines stay limited until the flush has ended: a dead endpoint's retries are logged
    # during it (and after the deadline, by the thread left behind); a newer configure() keeps its own.
    return current.shutdown(timeout_s, then=_unlimit_unless_configured)


def _unlimit_unless_configured() -> None:
    with _lock:
        if _configured is None:
            unlimit_sdk_logs()


atexit.register(shutdown)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
