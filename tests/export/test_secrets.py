"""Credentials stay out of what hp_otel prints, logs and raises: URL user parts, query
strings and header values, also in the SDK exporters' own log records; a header that would
inject lines into the request (CR/LF, also percent-encoded) is refused, naming the setting."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

import hp_otel
from hp_otel.export.config import ConfigError, ExportConfig
from hp_otel.export.secrets import mask_secrets, redact_url

pytestmark = pytest.mark.torch_free  # needs no torch: not rerun on torch 2.14.1 (tests/support/markers.py)

SECRET = "S3CR3T-T0KEN"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (f"http://user:{SECRET}@127.0.0.1:4318/v1/traces", "http://***@127.0.0.1:4318/v1/traces"),
        (f"https://collector:4318/v1/traces?token={SECRET}", "https://collector:4318/v1/traces?***"),
        (f"http://u:pa/ss{SECRET}@host/v1/traces", "http://***@host/v1/traces"),  # a '/' in the password
        (f"http://host:4318/#{SECRET}", "http://host:4318/#***"),
        ("http://localhost:4318", "http://localhost:4318"),
    ],
)
def test_urls_are_shown_without_user_part_query_or_fragment(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_free_text_is_masked_grpc_targets_and_known_header_values_included() -> None:
    line = f"Transient error StatusCode.UNAVAILABLE encountered while exporting traces to u:{SECRET}@host:4317"
    assert (
        mask_secrets(line)
        == "Transient error StatusCode.UNAVAILABLE encountered while exporting traces to ***@host:4317"
    )
    assert mask_secrets(f"sent Authorization: Bearer {SECRET}", ["Bearer " + SECRET]) == "sent Authorization: ***"
    assert mask_secrets("at 12:30:00 on host:4317, 1:2") == "at 12:30:00 on host:4317, 1:2"  # nothing to mask


@pytest.mark.parametrize(
    "endpoint",
    [
        f"http://user@host:{SECRET}",  # urlsplit: "Port could not be cast to integer value as 'S3CR3T...'"
        f"http://user:{SECRET}/x@host",
        f"ftp://host:4318/?token={SECRET}",  # not http(s): the query is not echoed either
    ],
)
def test_a_bad_endpoint_is_refused_without_its_credentials(endpoint: str) -> None:
    with pytest.raises(ConfigError, match="endpoint must be") as caught:
        ExportConfig.resolve(endpoint=endpoint)
    assert SECRET not in str(caught.value)
    with pytest.raises(ConfigError, match="OTEL_EXPORTER_OTLP_ENDPOINT must be") as caught:
        ExportConfig.resolve(environ={"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint})
    assert SECRET not in str(caught.value)


@pytest.mark.parametrize(
    ("environ", "variable", "what"),
    [
        ({"OTEL_EXPORTER_OTLP_HEADERS": f"x-token={SECRET}%0D%0AX-Injected: 1"}, "OTEL_EXPORTER_OTLP_HEADERS", "value"),
        (
            {"OTEL_EXPORTER_OTLP_TRACES_HEADERS": f"x-token={SECRET}\nX: 1"},
            "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
            "value",
        ),
        ({"OTEL_EXPORTER_OTLP_METRICS_HEADERS": f"x%0Ay={SECRET}"}, "OTEL_EXPORTER_OTLP_METRICS_HEADERS", "name"),
    ],
)
def test_line_breaks_in_header_variables_are_refused_naming_the_variable(environ, variable, what) -> None:
    with pytest.raises(ConfigError, match=rf"{variable}: the header {what} of entry 1.* line break") as caught:
        ExportConfig.resolve(environ=environ)
    assert SECRET not in str(caught.value)


def test_line_breaks_in_the_headers_argument_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"headers: the header value of entry 1 \(x-token\)") as caught:
        ExportConfig.resolve(headers={"x-token": f"{SECRET}\r\nX-Injected: 1"})
    assert SECRET not in str(caught.value)
    with pytest.raises(ConfigError, match="headers: entry 1 must be a non-empty text name"):
        ExportConfig.resolve(headers={"x-token": 5})  # type: ignore[dict-item]


@pytest.fixture
def configured():  # type: ignore[no-untyped-def]
    telemetry = hp_otel.configure(
        endpoint=f"http://user:{SECRET}@127.0.0.1:9/?token={SECRET}",
        headers={"Authorization": f"Bearer {SECRET}"},
        shutdown_timeout_s=0.5,
    )
    yield telemetry
    hp_otel.shutdown(0.5)


def test_telemetry_and_the_demo_show_the_endpoint_masked(configured, capsys) -> None:
    from hp_otel.cli.demo import DemoConfig, _report_export

    assert configured.traces_endpoint == "http://***@127.0.0.1:9/?***"
    _report_export(0, configured, DemoConfig(out_dir=Path(".")))
    out = capsys.readouterr().out
    assert "spans -> http://***@127.0.0.1:9/?***" in out and SECRET not in out


def test_the_exporters_own_log_records_are_masked(configured, caplog) -> None:
    caplog.set_level(logging.DEBUG)
    grpc = logging.getLogger("opentelemetry.exporter.otlp.proto.grpc.exporter")
    grpc.warning("Transient error %s encountered while exporting %s to %s", "UNAVAILABLE", "traces", f"u:{SECRET}@host")
    try:
        raise ConnectionError(f"cannot reach http://user:{SECRET}@127.0.0.1:9/v1/traces (header Bearer {SECRET})")
    except ConnectionError:
        logging.getLogger("opentelemetry.exporter.otlp.proto.http.trace_exporter").exception("Failed to export batch")
    logging.getLogger("urllib3.connectionpool").debug('http://127.0.0.1:9 "POST /v1/traces?token=%s HTTP/1.1"', SECRET)
    text = caplog.text
    assert "***@host" in text and "Failed to export batch" in text and "ConnectionError" in text
    assert SECRET not in text


def test_the_grpc_exporters_real_failure_line_is_masked(caplog) -> None:
    """The exporter's own 'Failed to export traces to u:PASSWORD@host' line, from a real export attempt."""
    caplog.set_level(logging.DEBUG)
    telemetry = hp_otel.configure(
        endpoint=f"http://u:{SECRET}@127.0.0.1:9", protocol="grpc", export_timeout_s=1, shutdown_timeout_s=2
    )
    try:
        with telemetry.tracer_provider.get_tracer("test").start_as_current_span("step"):
            pass
        telemetry.force_flush(3)
    finally:
        hp_otel.shutdown(2)
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("opentelemetry.exporter")]
    assert any("***@127.0.0.1:9" in line for line in lines)  # the exporter did log its target
    assert SECRET not in caplog.text
