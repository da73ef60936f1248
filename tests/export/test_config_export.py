"""OTel-convention configuration, the resource, and export that never holds training back."""

from __future__ import annotations

import logging
import time

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from benchmarks.export_down import Blackhole, closed_port
from hp_otel.common.launcher_env import run_id as run_id_from_env
from hp_otel.export.config import ConfigError, ExportConfig
from hp_otel.export.providers import build_resource
from hp_otel.export.telemetry import (
    CountingSpanExporter,
    DropCountingBatchSpanProcessor,
    build_telemetry,
    prometheus_port_for_this_rank,
)
from hp_otel.spans import schema

pytestmark = pytest.mark.torch_free  # needs no torch: not rerun on torch 2.14.1 (tests/support/markers.py)


def test_an_endpoint_argument_gets_the_signal_path_for_http_and_is_used_as_is_for_grpc() -> None:
    http = ExportConfig.resolve(endpoint="http://collector:4318", environ={})
    assert (http.traces_protocol, http.traces_endpoint) == ("http/protobuf", "http://collector:4318/v1/traces")
    assert http.metrics_endpoint == "http://collector:4318/v1/metrics"
    grpc = ExportConfig.resolve(endpoint="http://collector:4317", protocol="grpc", environ={})
    assert (grpc.traces_protocol, grpc.traces_endpoint) == ("grpc", "http://collector:4317")


def test_endpoints_from_the_environment_are_left_to_the_exporter_and_arguments_win() -> None:
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:4318",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://b:9999/custom",
        "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "grpc",
    }
    config = ExportConfig.resolve(environ=env)
    assert (config.traces_exporters, config.metrics_exporters) == (("otlp",), ("otlp",))
    assert config.traces_endpoint is None and config.metrics_endpoint is None  # the exporter reads them
    assert config.metrics_protocol == "grpc"
    explicit = ExportConfig.resolve(endpoint="http://c:4317", protocol="grpc", environ=env)
    assert (explicit.metrics_protocol, explicit.metrics_endpoint) == ("grpc", "http://c:4317")


def test_no_endpoint_means_no_otlp_and_exporter_none_turns_it_off() -> None:
    assert ExportConfig.resolve(environ={}).traces_exporters == ()
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:4318", "OTEL_METRICS_EXPORTER": "none"}
    config = ExportConfig.resolve(environ=env)
    assert config.traces_exporters == ("otlp",) and config.metrics_exporters == ()
    assert ExportConfig.resolve(environ={"OTEL_TRACES_EXPORTER": "console"}).traces_exporters == ("console",)


def test_prometheus_port_from_otel_variables_and_the_rank_rule(monkeypatch) -> None:
    assert ExportConfig.resolve(environ={"OTEL_EXPORTER_PROMETHEUS_PORT": "9500"}).prometheus_port == 9500
    assert ExportConfig.resolve(environ={"OTEL_METRICS_EXPORTER": "prometheus"}).prometheus_port == 9464
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert prometheus_port_for_this_rank(9500) == 9503
    assert prometheus_port_for_this_rank(0) == 0


@pytest.mark.parametrize(
    ("kwargs", "env", "message"),
    [
        ({}, {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "OTEL_EXPORTER_OTLP_PROTOCOL must be one of grpc"),
        ({"protocol": "udp"}, {}, "protocol must be one of grpc, http/protobuf, got 'udp'"),
        ({}, {"OTEL_EXPORTER_PROMETHEUS_PORT": "http"}, "OTEL_EXPORTER_PROMETHEUS_PORT must be a port"),
        ({"sampler": "sometimes"}, {}, "sampler must be one of always_on"),
        ({"sampler_arg": 2.0}, {}, "sampler_arg must be a ratio between 0 and 1"),
        ({"max_queue_size": 0}, {}, "max_queue_size must be a positive number"),
        ({}, {"OTEL_EXPORTER_OTLP_HEADERS": "novalue"}, "OTEL_EXPORTER_OTLP_HEADERS must be comma-separated"),
        ({}, {"OTEL_EXPORTER_OTLP_TRACES_HEADERS": "a=1,b"}, "OTEL_EXPORTER_OTLP_TRACES_HEADERS must be comma"),
        ({}, {"OTEL_TRACES_EXPORTER": "jaeger"}, "OTEL_TRACES_EXPORTER names jaeger, which is not an installed"),
    ],
)
def test_bad_settings_name_the_setting_and_what_is_allowed(kwargs, env, message) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        ExportConfig.resolve(environ=env, **kwargs)


def test_run_id_is_the_same_for_every_rank_of_a_job() -> None:
    rank0 = {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "RANK": "0"}
    rank1 = {**rank0, "RANK": "1"}
    assert run_id_from_env(rank0) == run_id_from_env(rank1) is not None
    assert run_id_from_env({**rank0, "TORCHELASTIC_RUN_ID": "job7"}) == "job7"
    assert run_id_from_env({**rank0, "TORCHELASTIC_RUN_ID": "none"}) == run_id_from_env(rank0)
    assert run_id_from_env({"HP_OTEL_RUN_ID": "mine", "TORCHELASTIC_RUN_ID": "job7"}) == "mine"
    ms = {"MS_SCHED_HOST": "127.0.0.1", "MS_SCHED_PORT": "8118"}
    assert run_id_from_env(ms) and run_id_from_env(ms) != run_id_from_env(rank0)


def test_resource_from_torchrun_and_mindspore_environments(monkeypatch) -> None:
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "HP_OTEL_RUN_ID", "TORCHELASTIC_RUN_ID", "OTEL_SERVICE_NAME"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("MS_NODE_ID", "1")
    monkeypatch.setenv("MS_WORKER_NUM", "2")
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=test")
    attrs = build_resource({"hp_otel.run.id": "r9"}).attributes
    assert attrs[schema.RESOURCE_RANK] == 1 and attrs[schema.RESOURCE_WORLD_SIZE] == 2
    assert attrs["hp_otel.run.id"] == "r9" and attrs["deployment.environment"] == "test"
    assert attrs["service.name"] == "hp_otel" and "host.name" in attrs and "process.pid" in attrs
    monkeypatch.setenv("OTEL_SERVICE_NAME", "trainer")
    assert build_resource().attributes["service.name"] == "trainer"


class _SlowExporter(SpanExporter):
    """An exporter that blocks like a blackholed endpoint."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.spans = 0

    def export(self, spans) -> SpanExportResult:
        time.sleep(self.seconds)
        self.spans += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def _span(i: int) -> ReadableSpan:
    from opentelemetry.trace import SpanContext, TraceFlags

    return ReadableSpan(name=f"s{i}", context=SpanContext(1, i + 1, False, TraceFlags(TraceFlags.SAMPLED)))


def test_a_full_queue_drops_counts_and_logs_once_without_blocking(caplog) -> None:
    exporter = _SlowExporter(0.5)
    processor = DropCountingBatchSpanProcessor(exporter, max_queue_size=8, schedule_delay_millis=10_000)
    try:
        with caplog.at_level(logging.WARNING, logger="hp_otel"):
            started = time.perf_counter()
            for i in range(50):
                processor.on_end(_span(i))
            elapsed = time.perf_counter() - started
        assert elapsed < 0.4  # the caller never waits for the exporter (one wait would be its 0.5 s)
        assert processor.dropped >= 50 - 8 - 8  # at most one batch (8) can be in the exporter's hands
        assert processor.emitted + processor.dropped == 50
        drops_logged = [r for r in caplog.records if r.name == "hp_otel" and "queue full" in r.getMessage()]
        assert len(drops_logged) == 1
    finally:
        processor.shutdown()


@pytest.mark.parametrize("endpoint_kind", ["refused", "blackholed"])
def test_a_dead_endpoint_neither_blocks_steps_nor_shutdown(endpoint_kind) -> None:
    blackhole = Blackhole() if endpoint_kind == "blackholed" else None
    port = blackhole.port if blackhole else closed_port()
    try:
        config = ExportConfig.resolve(
            endpoint=f"http://127.0.0.1:{port}", export_timeout_s=2.0, shutdown_timeout_s=1.0, environ={}
        )
        telemetry = build_telemetry(config)
        tracer = telemetry.tracer_provider.get_tracer("t")
        started = time.perf_counter()
        for _ in range(2000):
            tracer.start_span("x").end()
        assert time.perf_counter() - started < 2.0  # ≈20 µs a span; a blocking export would take seconds
        started = time.perf_counter()
        telemetry.shutdown()
        assert time.perf_counter() - started < 1.5  # bounded by shutdown_timeout_s, not by the exporter
    finally:
        if blackhole:
            blackhole.close()


class _RefusingExporter(SpanExporter):
    """Counts the batches it was asked to send and fails them all, as a down endpoint does."""

    def __init__(self) -> None:
        self.calls = 0
        self.succeed = False

    def export(self, spans) -> SpanExportResult:
        self.calls += 1
        return SpanExportResult.SUCCESS if self.succeed else SpanExportResult.FAILURE

    def shutdown(self) -> None:
        pass


def test_a_failing_endpoint_is_left_alone_for_a_growing_cool_down(monkeypatch) -> None:
    from hp_otel.export import telemetry as export

    now = [1000.0]
    monkeypatch.setattr(export.time, "monotonic", lambda: now[0])
    inner = _RefusingExporter()
    counting = CountingSpanExporter(inner, first_cooldown_s=1.0, max_cooldown_s=4.0)
    batch = [_span(i) for i in range(3)]

    assert counting.export(batch) is SpanExportResult.FAILURE
    assert counting.export(batch) is SpanExportResult.FAILURE  # within the 1 s cool-down: not tried
    assert (inner.calls, counting.failed, counting.skipped) == (1, 6, 3)
    now[0] += 1.01
    counting.export(batch)  # tried again, fails: the cool-down doubles to 2 s
    assert inner.calls == 2
    now[0] += 1.5
    counting.export(batch)
    assert inner.calls == 2
    now[0] += 0.6
    counting.export(batch)  # fails again: 4 s, the maximum
    now[0] += 4.01
    inner.succeed = True
    assert counting.export(batch) is SpanExportResult.SUCCESS
    assert (inner.calls, counting.exported) == (4, 3)
    assert counting.export(batch) is SpanExportResult.SUCCESS  # a success resets the cool-down
    assert inner.calls == 5
    assert counting.handed == counting.exported + counting.failed == 7 * 3
