"""Each OTEL_* variable the SDK reads itself reaches hp_otel's exporters exactly as it reaches the SDK's own.

For every variable: hp_otel's telemetry (`build_telemetry(ExportConfig.resolve())`) and a
plain SDK component made under the same environment are compared, and where it can be
seen on the wire (headers, endpoints, compression) a real HTTP receiver records what
both sent.
"""

from __future__ import annotations

import gzip
import http.server
import sys
import threading
from collections.abc import Iterator

import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, PeriodicExportingMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SimpleSpanProcessor

from hp_otel.export.config import ExportConfig
from hp_otel.export.telemetry import Telemetry, build_telemetry

pytestmark = pytest.mark.torch_free  # needs no torch: not rerun on torch 2.14.1 (tests/support/markers.py)

OTEL_PREFIXES = ("OTEL_", "HP_OTEL_")


class Receiver:
    """An OTLP/HTTP endpoint that records each request's path, headers and spans."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, str], list[str]]] = []
        received = self.requests

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                names = []
                if self.path.endswith("traces"):
                    request = ExportTraceServiceRequest.FromString(body)
                    names = [s.name for r in request.resource_spans for ss in r.scope_spans for s in ss.spans]
                received.append((self.path, {k.lower(): v for k, v in self.headers.items()}, names))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    yield server
    server.close()


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch) -> None:
    import os

    for key in list(os.environ):
        if key.startswith(OTEL_PREFIXES):
            monkeypatch.delenv(key)


def _ours() -> Telemetry:
    return build_telemetry(ExportConfig.resolve(shutdown_timeout_s=2.0))


def _send_one_span_with_ours(name: str) -> None:
    telemetry = _ours()
    try:
        telemetry.tracer_provider.get_tracer("t").start_span(name).end()
        assert telemetry.force_flush(5.0)
    finally:
        telemetry.shutdown()


def _send_one_span_with_the_sdk(exporter: object, name: str) -> None:
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    provider.get_tracer("t").start_span(name).end()
    provider.shutdown()


def test_headers_are_percent_decoded_and_the_per_signal_ones_win(monkeypatch, receiver) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "Authorization=Basic%20dXNlcjpwYXNz,x-base=b")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "Authorization=Bearer%20t%3D1,x-tenant=team%2Fa")
    _send_one_span_with_ours("ours")
    _send_one_span_with_the_sdk(HttpSpanExporter(), "sdk")
    (ours_path, ours, ours_spans), (sdk_path, sdk, _) = receiver.requests
    assert ours_spans == ["ours"] and ours_path == sdk_path == "/v1/traces"
    assert ours["authorization"] == sdk["authorization"] == "Bearer t=1"  # decoded, per-signal
    assert ours["x-tenant"] == "team/a" and "x-base" not in ours and "x-base" not in sdk


def test_the_per_signal_endpoint_wins_and_is_used_as_is(monkeypatch, receiver) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", f"{receiver.url}/custom/spans")
    _send_one_span_with_ours("ours")
    _send_one_span_with_the_sdk(HttpSpanExporter(), "sdk")
    assert [path for path, _, _ in receiver.requests] == ["/custom/spans", "/custom/spans"]


def test_compression_per_signal(monkeypatch, receiver) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_COMPRESSION", "none")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "gzip")
    _send_one_span_with_ours("ours")
    _send_one_span_with_the_sdk(HttpSpanExporter(), "sdk")
    assert [headers.get("content-encoding") for _, headers, _ in receiver.requests] == ["gzip", "gzip"]
    assert receiver.requests[0][2] == ["ours"]


def test_timeout_per_signal_wins_grpc(monkeypatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "7")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "3")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "k=v%20w")
    telemetry = _ours()
    try:
        ours = telemetry.span_processor.counting.exporter
        sdk = GrpcSpanExporter()
        assert isinstance(ours, GrpcSpanExporter)
        assert (ours._timeout, ours._headers, ours._endpoint) == (sdk._timeout, sdk._headers, sdk._endpoint)
        assert ours._timeout == 3.0 and dict(ours._headers) == {"k": "v w"}
    finally:
        telemetry.shutdown(1.0)


BSP_SETTINGS = ("_max_queue_size", "_schedule_delay_millis", "_max_export_batch_size", "_export_timeout_millis")


def test_batch_span_processor_variables(monkeypatch, receiver) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
    for key, value in (("MAX_QUEUE_SIZE", "64"), ("SCHEDULE_DELAY", "250"), ("MAX_EXPORT_BATCH_SIZE", "16")):
        monkeypatch.setenv(f"OTEL_BSP_{key}", value)
    monkeypatch.setenv("OTEL_BSP_EXPORT_TIMEOUT", "1234")
    telemetry = _ours()
    try:
        ours = telemetry.span_processor
        sdk = BatchSpanProcessor(ConsoleSpanExporter())
        settings = [getattr(p._batch_processor, name) for p in (ours, sdk) for name in BSP_SETTINGS]
        assert settings[:4] == settings[4:] == [64, 250, 16, 1234]
        assert ours.max_queue_size == 64  # the drop counter counts against the SDK's queue
        sdk.shutdown()
    finally:
        telemetry.shutdown(1.0)


def test_metric_export_interval_and_timeout(monkeypatch, receiver) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "1500")
    monkeypatch.setenv("OTEL_METRIC_EXPORT_TIMEOUT", "700")
    telemetry = _ours()
    try:
        (ours,) = telemetry.metric_readers
        sdk = PeriodicExportingMetricReader(ConsoleMetricExporter())
        assert isinstance(ours, PeriodicExportingMetricReader)
        pairs = [(r._export_interval_millis, r._export_timeout_millis) for r in (ours, sdk)]
        assert pairs == [(1500.0, 700.0), (1500.0, 700.0)]
        sdk.shutdown()
    finally:
        telemetry.shutdown(1.0)


@pytest.mark.parametrize(
    ("sampler", "arg"), [("traceidratio", "0.25"), ("parentbased_always_off", None), ("always_on", None)]
)
def test_the_tracer_provider_reads_the_sampler_itself(monkeypatch, sampler, arg) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", sampler)
    if arg:
        monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", arg)
    telemetry = _ours()
    try:
        expected = TracerProvider(shutdown_on_exit=False).sampler.get_description()
        assert telemetry.tracer_provider.sampler.get_description() == expected
        assert sampler.split("_")[-1].lower() in expected.lower().replace("traceidratiobased", "traceidratio")
    finally:
        telemetry.shutdown(1.0)


def test_traces_exporter_console_prints_spans(monkeypatch, capfd) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    telemetry = _ours()
    try:
        assert [type(p.counting.exporter) for p in telemetry.span_processors] == [ConsoleSpanExporter]
        # its default `out` is the sys.stdout of when the SDK module was imported (maybe before capfd began)
        telemetry.span_processors[0].counting.exporter.out = sys.stdout
        telemetry.tracer_provider.get_tracer("t").start_span("printed-span").end()
        assert telemetry.force_flush(5.0)
    finally:
        telemetry.shutdown(1.0)
    assert '"name": "printed-span"' in capfd.readouterr().out


def test_traces_exporter_none_and_otlp_with_the_protocol(monkeypatch, receiver) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url)
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    telemetry = _ours()
    assert telemetry.span_processors == [] and telemetry.config.metrics_exporters == ("otlp",)
    telemetry.shutdown(1.0)
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp,console")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc")
    telemetry = _ours()
    kinds = {type(p.counting.exporter) for p in telemetry.span_processors}
    telemetry.shutdown(1.0)
    assert kinds == {ConsoleSpanExporter, GrpcSpanExporter}  # OTLP over gRPC, as the protocol says
