"""`OTEL_SDK_DISABLED=true`, OpenTelemetry's switch that turns the SDK off: hp_otel then opens no port,
makes no exporter, and does not log that the provider is not the SDK's (it is, handing out no-ops).
The zero-code instrumentor under it: tests/always_on/test_zero_code_cost.py."""

from __future__ import annotations

import logging
import socket

import pytest
import servers

import hp_otel
from hp_otel.common import said_once
from hp_otel.export import telemetry

pytestmark = pytest.mark.torch_free  # needs no torch: not rerun on torch 2.14.1 (tests/support/markers.py)


def test_configure_opens_and_exports_nothing(monkeypatch, caplog) -> None:
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    monkeypatch.setattr(said_once, "_said", set())  # its once-per-process lines are said again here
    port = servers.free_port()
    with caplog.at_level(logging.INFO, logger="hp_otel"):
        configured = hp_otel.configure(prometheus_port=port, prometheus_host="127.0.0.1", endpoint="http://127.0.0.1:9")
        try:
            assert configured.prometheus_port is None and configured.span_processors == []
            assert configured.metric_readers == []
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", port))  # before: hp_otel's /metrics held it
            with hp_otel.step(0, run_id="disabled", rank=0):
                pass
        finally:
            telemetry.shutdown()
    said = [r.getMessage() for r in caplog.records]
    assert not [m for m in said if "not the OTel SDK" in m], said  # before: "the tracer provider is not the OTel SDK's"
    assert [m for m in said if "OTEL_SDK_DISABLED=true" in m] == [
        "hp_otel: OTEL_SDK_DISABLED=true: configure() opens and exports nothing"
    ]
