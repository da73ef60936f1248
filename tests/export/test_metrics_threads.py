"""`/metrics` under idle connections: the rank's threads stay bounded and scrapes are still answered
(issue 43: each idle connection became a thread never reaped, 3,000 connections made 3,002 threads)."""

from __future__ import annotations

import socket
import time
import urllib.request
from pathlib import Path

import pytest

from hp_otel.export import metrics_server
from hp_otel.export.config import ExportConfig
from hp_otel.export.telemetry import build_telemetry


def _threads() -> int:
    """This process's threads as the kernel counts them (every thread, not only Python's)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError("no Threads line")


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        assert response.status == 200
        return response.read().decode()


@pytest.fixture
def telemetry(monkeypatch):
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    telemetry = build_telemetry(ExportConfig.resolve(prometheus_port=0, prometheus_host="127.0.0.1", run_id="t"))
    yield telemetry
    telemetry.shutdown(1.0)


def test_3000_idle_connections_add_a_bounded_number_of_threads(telemetry):
    port = telemetry.prometheus_port
    counter = telemetry.meter_provider.get_meter("t").create_counter("hp_test_scrapes")
    counter.add(1)
    assert "hp_test_scrapes" in _scrape(port)
    before = _threads()
    idle = []
    try:
        for _ in range(3000):
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        time.sleep(0.5)  # let the server accept them all
        during = _threads()
        started = time.monotonic()
        assert "hp_test_scrapes" in _scrape(port)  # a scrape is answered while they wait
        scrape_s = time.monotonic() - started
    finally:
        for s in idle:
            s.close()
    assert during - before <= metrics_server.WORKERS, f"{during - before} threads for 3,000 idle connections"
    assert scrape_s < 2.0
    assert "hp_test_scrapes" in _scrape(port)


def test_an_idle_connection_is_closed(telemetry, monkeypatch):
    monkeypatch.setattr(metrics_server, "IDLE_S", 0.3)
    port = telemetry.prometheus_port
    with socket.create_connection(("127.0.0.1", port), timeout=10) as idle:
        started = time.monotonic()
        assert idle.recv(1) == b""  # closed by the server
        assert time.monotonic() - started < 5


def test_shutdown_ends_the_server_and_its_threads(monkeypatch):
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    before = _threads()
    telemetry = build_telemetry(ExportConfig.resolve(prometheus_port=0, prometheus_host="127.0.0.1", run_id="t"))
    port = telemetry.prometheus_port
    _scrape(port)
    with socket.create_connection(("127.0.0.1", port), timeout=5):
        telemetry.shutdown(2.0)
    deadline = time.monotonic() + 5
    while _threads() > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _threads() <= before
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
