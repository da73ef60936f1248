"""Export settings under stress: secrets stay out of errors and reprs, a busy Prometheus
port is named and leaves nothing running, bad sampler and endpoint values are refused,
and a dead endpoint's log lines are rate-limited."""

from __future__ import annotations

import errno
import socket
import threading
import time

import pytest

from hp_otel.cli.bench_export import closed_port
from hp_otel.config import ConfigError, ExportConfig
from hp_otel.export import PrometheusPortError, build_telemetry, configure, configured, prometheus_port_for_this_rank
from hp_otel.launcher_env import LOCAL_RANK_VARIABLES

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
    environ = {
        "OTEL_EXPORTER_OTLP_HEADERS": f"Authorization={SECRET},x-tenant=acme",
        "OTEL_EXPORTER_OTLP_ENDPOINT": "https://user:p4ssw0rd@collector.example:4318",
    }
    config = ExportConfig.resolve(environ=environ)
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
