"""Export settings under stress: secrets stay out of errors and reprs, a busy Prometheus
port is named and leaves nothing running, bad sampler and endpoint values are refused,
and a dead endpoint's log lines are rate-limited."""

from __future__ import annotations

import errno
import logging
import re
import socket
import threading
import time
from collections import Counter

import pytest
import servers
from events import design_mlp_forward

import hp_otel
from benchmarks.export_down import closed_port
from hp_otel import CommDebugMode
from hp_otel.common.launcher_env import LOCAL_RANK_VARIABLES
from hp_otel.export.config import ConfigError, ExportConfig
from hp_otel.export.log_limits import NOISY_LOGGERS, RateLimitFilter
from hp_otel.export.telemetry import (
    PrometheusPortError,
    build_telemetry,
    configure,
    configured,
    prometheus_port_for_this_rank,
    shutdown,
)

pytestmark = pytest.mark.torch_free  # needs no torch: not rerun on torch 2.14.1 (tests/support/markers.py)

SECRET = "Bearer s3cr3t-t0ken-value"


@pytest.mark.parametrize(
    "headers",
    [
        f"api-key={SECRET},Authorization {SECRET}",  # an entry without '='
        f"Authorization={SECRET},={SECRET}",  # an entry without a key
        f"{SECRET}",
    ],
)
def test_a_malformed_headers_variable_never_echoes_a_value(headers: str) -> None:
    with pytest.raises(ConfigError, match="OTEL_EXPORTER_OTLP_HEADERS") as caught:
        ExportConfig.resolve(environ={"OTEL_EXPORTER_OTLP_HEADERS": headers})
    assert "s3cr3t" not in str(caught.value)
    assert "entry 2" in str(caught.value) or "entry 1" in str(caught.value)


def test_reprs_name_header_keys_but_never_their_values() -> None:
    # Headers and endpoint given as arguments are kept in the config (the exporter gets them);
    # those from the variables are read by the exporter itself and never stored.
    config = ExportConfig.resolve(
        endpoint="https://user:p4ssw0rd@collector.example:4318",
        headers={"Authorization": SECRET, "x-tenant": "acme"},
        environ={"OTEL_EXPORTER_OTLP_HEADERS": f"Authorization={SECRET}"},
    )
    assert config.headers["Authorization"] == SECRET  # the exporter still gets it
    telemetry = build_telemetry(config)
    try:
        for text in (repr(config), str(config), repr(telemetry)):
            assert "s3cr3t" not in text and "p4ssw0rd" not in text and "acme" not in text
            assert "'Authorization': '***'" in text and "'x-tenant': '***'" in text
            assert "https://***@collector.example:4318/v1/traces" in text
    finally:
        telemetry.shutdown(1)
    assert configured() is None


@pytest.fixture
def busy_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_a_busy_prometheus_port_is_named_with_its_setting_and_nothing_keeps_running(busy_port, monkeypatch) -> None:
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    threads_before = set(threading.enumerate())
    with pytest.raises(PrometheusPortError) as caught:
        configure(
            prometheus_port=busy_port,
            prometheus_host="127.0.0.1",
            endpoint=f"http://127.0.0.1:{closed_port()}",  # OTLP export too: its threads must not be left running
            metric_export_interval_ms=50,
        )
    message = str(caught.value)
    assert f"Prometheus port {busy_port} on '127.0.0.1' is already in use" in message
    assert f"prometheus_port={busy_port}" in message and caught.value.errno == errno.EADDRINUSE
    time.sleep(0.3)
    assert set(threading.enumerate()) - threads_before == set()
    assert configured() is None


def test_a_busy_port_from_the_environment_names_the_variable_and_the_local_rank(busy_port, monkeypatch) -> None:
    monkeypatch.setenv("LOCAL_RANK", "1")
    environ_port = busy_port - 1
    with pytest.raises(PrometheusPortError, match=rf"OTEL_EXPORTER_PROMETHEUS_PORT={environ_port} \+ local rank 1"):
        build_telemetry(
            ExportConfig.resolve(
                prometheus_host="127.0.0.1", environ={"OTEL_EXPORTER_PROMETHEUS_PORT": str(environ_port)}
            )
        )


@pytest.mark.parametrize(
    "variable", ["LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "PMI_LOCAL_RANK"]
)
def test_ranks_of_one_host_get_different_prometheus_ports_under_every_launcher(variable: str, monkeypatch) -> None:
    for name in LOCAL_RANK_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    ports = set()
    for rank in range(4):
        monkeypatch.setenv(variable, str(rank))
        ports.add(prometheus_port_for_this_rank(9464))
    assert ports == {9464, 9465, 9466, 9467}


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"OTEL_TRACES_SAMPLER": "sometimes"}, r"OTEL_TRACES_SAMPLER must be one of always_on, .*got 'sometimes'"),
        (
            {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "ten percent"},
            r"OTEL_TRACES_SAMPLER_ARG must be a ratio between 0 and 1 for traceidratio, got 'ten percent'",
        ),
        (
            {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "1.5"},
            r"OTEL_TRACES_SAMPLER_ARG must be a ratio between 0 and 1",
        ),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "localhost:4318"},
            r"OTEL_EXPORTER_OTLP_ENDPOINT must be an http:// or https://",
        ),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://:4318"},
            r"OTEL_EXPORTER_OTLP_ENDPOINT must be an http:// or https://",
        ),
        (
            {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://user:pw@host:99999/v1/traces"},
            r"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT must be a URL like http://host:4318, got 'http://\*\*\*@host:99999",
        ),
    ],
)
def test_bad_sampler_and_endpoint_variables_raise_the_promised_config_error(environ, message) -> None:
    with pytest.raises(ConfigError, match=message):
        ExportConfig.resolve(environ=environ)


def test_good_sampler_variables_are_left_to_the_sdk() -> None:
    environ = {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.25"}
    assert ExportConfig.resolve(environ=environ).sampler is None
    assert ExportConfig.resolve(environ={"OTEL_TRACES_SAMPLER": "always_on", "OTEL_TRACES_SAMPLER_ARG": "x"})
    assert ExportConfig.resolve(endpoint="https://collector.example:4318").traces_endpoint.endswith("/v1/traces")


def test_sdk_log_lines_are_limited_to_one_per_kind_per_interval(caplog) -> None:
    now = [0.0]
    limiter = RateLimitFilter(interval_s=60, clock=lambda: now[0])
    logger = logging.getLogger(NOISY_LOGGERS[0])
    # Alone with our filter: the SDK adds its own DuplicateFilter once an exporter was made, and
    # a configure() another test left would add a second limiter on the real clock.
    earlier = list(logger.filters)
    for f in earlier:
        logger.removeFilter(f)
    logger.addFilter(limiter)
    try:
        with caplog.at_level(logging.WARNING, logger=logger.name):
            for second in range(120):  # two minutes of a retry line every second, and a batch line every 10 s
                now[0] = float(second)
                logger.warning("Transient error %s encountered, retrying in %.2fs.", "UNAVAILABLE", 1.0)
                if second % 10 == 0:
                    logger.error("Failed to export batch code: %s", 503)
    finally:
        logger.removeFilter(limiter)
        for f in earlier:
            logger.addFilter(f)
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 4  # two kinds, once per minute each
    assert lines[2] == (
        "Transient error UNAVAILABLE encountered, retrying in 1.00s."
        " [hp_otel: 59 more like this in the last 60 s not shown]"
    )
    assert lines[3].endswith("[hp_otel: 5 more like this in the last 60 s not shown]")


def _limited() -> bool:
    return any(isinstance(f, RateLimitFilter) for name in NOISY_LOGGERS for f in logging.getLogger(name).filters)


def test_configure_limits_the_sdk_loggers_and_shutdown_puts_them_back_after_the_flush(monkeypatch) -> None:
    configure(endpoint=f"http://127.0.0.1:{closed_port()}", export_timeout_s=1, environ={})
    try:
        assert all(
            any(isinstance(f, RateLimitFilter) for f in logging.getLogger(name).filters) for name in NOISY_LOGGERS
        )
    finally:
        shutdown(1)
    servers.wait_for(lambda: not _limited(), 30, "the SDK loggers' limit removed once the flush ended")


def test_a_dead_endpoint_logs_one_line_per_kind_at_shutdown(caplog) -> None:
    """A 1-step run against a dead endpoint, shut down: the flush's retries are one line per kind, a kind
    being the message with its numbers left out (before: every retry was a line, "retrying in 1.10s",
    "retrying in 1.78s", ..., and the limit was removed before the flush)."""
    with caplog.at_level(logging.DEBUG):
        configure(endpoint=f"http://127.0.0.1:{closed_port()}", export_timeout_s=4, environ={})
        with hp_otel.step(0, run_id="dead", rank=0), CommDebugMode() as mode:
            design_mlp_forward(mode.observer)
        shutdown(2)
        servers.wait_for(lambda: not _limited(), 60, "the flush to end")
    noisy = [r for r in caplog.records if r.name in NOISY_LOGGERS]
    kinds = Counter((r.name, re.sub(r"[0-9.]+", "N", str(r.msg).split(" [hp_otel:")[0])) for r in noisy)
    assert noisy and max(kinds.values()) == 1, kinds


def test_the_table_says_when_the_span_cap_dropped_spans() -> None:
    with CommDebugMode(max_spans=3) as mode:
        for _ in range(4):
            design_mlp_forward(mode.observer)
    table = mode.generate_comm_debug_tracing_table(noise_level=0)
    dropped = mode.get_dropped_record_count()
    assert dropped > 0
    assert table.splitlines()[-1] == (
        f"! {dropped} span(s) were dropped by the max_spans cap and are not in this table "
        "(get_comm_counts() still counts every collective)"
    )


@pytest.mark.parametrize(
    ("variable", "value", "allowed"),
    [
        ("OTEL_BSP_MAX_QUEUE_SIZE", "-1", "a positive integer (spans)"),
        ("OTEL_BSP_MAX_QUEUE_SIZE", "0", "a positive integer (spans)"),
        ("OTEL_BSP_MAX_QUEUE_SIZE", "lots", "a positive integer (spans)"),  # the SDK: a traceback, then 2048
        ("OTEL_BSP_SCHEDULE_DELAY", "-5", "a positive integer (milliseconds)"),
        ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "0", "a positive integer (spans)"),
        ("OTEL_BSP_EXPORT_TIMEOUT", "-1", "a positive integer (milliseconds)"),  # the SDK: used as is
        ("OTEL_METRIC_EXPORT_INTERVAL", "-1", "a positive number (milliseconds; inf: no periodic export)"),
        ("OTEL_METRIC_EXPORT_INTERVAL", "0", "a positive number (milliseconds; inf: no periodic export)"),
        ("OTEL_METRIC_EXPORT_TIMEOUT", "-700", "a positive number (milliseconds)"),
        ("OTEL_EXPORTER_OTLP_TIMEOUT", "0", "a positive number (seconds)"),
        ("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "soon", "a positive number (seconds)"),
        ("OTEL_EXPORTER_OTLP_METRICS_TIMEOUT", "nan", "a positive number (seconds)"),
    ],
)
def test_a_bad_number_the_sdk_reads_is_a_config_error_naming_it(monkeypatch, variable, value, allowed) -> None:
    """Not the SDK's bare `ValueError: max_queue_size must be a positive integer.` (or its silent default)."""
    monkeypatch.setenv(variable, value)
    before = configured()
    with pytest.raises(ConfigError) as caught:
        configure(endpoint="http://127.0.0.1:9", prometheus_port=0, shutdown_timeout_s=1.0)
    assert str(caught.value) == f"{variable} must be {allowed}, got {value!r}"
    assert configured() is before  # refused before anything was replaced


def test_an_argument_wins_over_a_bad_sdk_number_and_good_ones_pass() -> None:
    environ = {"OTEL_BSP_MAX_QUEUE_SIZE": "-1", "OTEL_EXPORTER_OTLP_TIMEOUT": "0", "OTEL_METRIC_EXPORT_TIMEOUT": "0"}
    assert ExportConfig.resolve(max_queue_size=64, export_timeout_s=2.5, environ=environ).max_queue_size == 64
    good = {"OTEL_BSP_MAX_QUEUE_SIZE": " 64 ", "OTEL_METRIC_EXPORT_INTERVAL": "inf"}
    good["OTEL_EXPORTER_OTLP_TIMEOUT"] = "2.5"
    assert ExportConfig.resolve(environ=good).max_queue_size is None  # left to the SDK, which reads the same


@pytest.mark.parametrize("name", ["CERTIFICATE", "CLIENT_CERTIFICATE", "CLIENT_KEY"])
@pytest.mark.parametrize("middle", ["", "TRACES_", "METRICS_"])
def test_a_tls_file_that_cannot_be_read_is_refused_at_configure(tmp_path, monkeypatch, name: str, middle: str) -> None:
    variable = f"OTEL_EXPORTER_OTLP_{middle}{name}"
    missing = tmp_path / "no-such.pem"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
    monkeypatch.setenv(variable, str(missing))
    with pytest.raises(ConfigError) as caught:
        configure()
    message = str(caught.value)
    assert variable in message and str(missing) in message and "readable PEM file" in message, message
    assert configured() is None


def test_a_readable_tls_file_and_known_compressions_are_taken(tmp_path, monkeypatch) -> None:
    pem = tmp_path / "ca.pem"
    pem.write_text("-----BEGIN CERTIFICATE-----\n")
    for compression in ("gzip", "Deflate", " none "):
        environ = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318",
            "OTEL_EXPORTER_OTLP_CERTIFICATE": str(pem),
            "OTEL_EXPORTER_OTLP_COMPRESSION": compression,
        }
        assert ExportConfig.resolve(environ=environ).traces_exporters == ("otlp",)


@pytest.mark.parametrize("middle", ["", "TRACES_", "METRICS_"])
def test_an_unknown_compression_is_refused_at_configure(monkeypatch, middle: str) -> None:
    variable = f"OTEL_EXPORTER_OTLP_{middle}COMPRESSION"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
    monkeypatch.setenv(variable, "brotli")
    with pytest.raises(ConfigError, match=rf"{variable} must be one of gzip, deflate, none, got 'brotli'"):
        configure()
    assert configured() is None


def test_tls_and_compression_are_not_checked_when_nothing_is_exported_by_otlp(monkeypatch) -> None:
    environ = {"OTEL_EXPORTER_OTLP_COMPRESSION": "brotli", "OTEL_EXPORTER_OTLP_CERTIFICATE": "/no/such.pem"}
    assert ExportConfig.resolve(environ=environ).traces_exporters == ()
