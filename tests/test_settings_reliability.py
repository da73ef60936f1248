"""Export settings under stress: secrets stay out of errors and reprs, a busy Prometheus
port is named and leaves nothing running, bad sampler and endpoint values are refused,
and a dead endpoint's log lines are rate-limited."""

from __future__ import annotations

import pytest

from hp_otel.config import ConfigError, ExportConfig
from hp_otel.export import build_telemetry, configured

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
