"""Whether the instrumentor configures export itself when nobody set global providers: a visible choice.

Contrib instrumentors never do: they use the global providers, which `opentelemetry-instrument`
sets only with `opentelemetry-distro` installed (without it, their telemetry goes nowhere).
hp_otel does by default (`hp_otel.configure()` from the OTEL_* environment, so the zero-code
command works without the distro) and says so once in the log; `configure_export=False` or
`HP_OTEL_CONFIGURE_EXPORT=0` gives contrib's behaviour: the global (proxy) providers, nothing
configured.  The referee is `hp_otel.export.telemetry.configured()`: what configure() installed.
"""

from __future__ import annotations

import logging

import pytest
from opentelemetry import metrics, trace
from opentelemetry.trace import ProxyTracerProvider

from hp_otel.always_on import instrumentation
from hp_otel.always_on.instrumentation import active_session
from hp_otel.always_on.instrumentor import HpOtelInstrumentor
from hp_otel.common._otel_compat import proxy_meter_provider_class
from hp_otel.export import telemetry

pytestmark = pytest.mark.torch_free  # needs no torch: not rerun on torch 2.14.1 (tests/support/markers.py)


@pytest.fixture
def no_global_providers(monkeypatch):
    """As in a fresh process: OTel's globals are still its proxies; no OTLP/Prometheus settings."""
    tracer_proxy, meter_proxy = ProxyTracerProvider(), proxy_meter_provider_class()()
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: tracer_proxy)
    monkeypatch.setattr(metrics, "get_meter_provider", lambda: meter_proxy)
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_TRACES_EXPORTER", "OTEL_METRICS_EXPORTER",
                 "OTEL_EXPORTER_PROMETHEUS_PORT", "HP_OTEL_CONFIGURE_EXPORT", "LOCAL_RANK", "RANK"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    assert telemetry.configured() is None
    yield tracer_proxy, meter_proxy
    HpOtelInstrumentor().uninstrument()
    telemetry.shutdown()


def test_by_default_it_configures_export_itself_and_says_so(no_global_providers, caplog) -> None:
    with caplog.at_level(logging.INFO, logger=instrumentation.logger.name):
        HpOtelInstrumentor().instrument()
    configured = telemetry.configured()
    assert configured is not None
    session = active_session()
    assert session is not None and session.tracer_provider is configured.tracer_provider
    assert session.meter_provider is configured.meter_provider
    (said,) = [r.getMessage() for r in caplog.records if "HP_OTEL_CONFIGURE_EXPORT" in r.getMessage()]
    assert "no global OpenTelemetry providers" in said and "configure_export=False" in said


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_turned_off_it_uses_the_global_providers_as_contrib_instrumentors_do(no_global_providers, monkeypatch, how):
    tracer_proxy, meter_proxy = no_global_providers
    if how == "argument":
        HpOtelInstrumentor().instrument(configure_export=False)
    else:
        monkeypatch.setenv("HP_OTEL_CONFIGURE_EXPORT", "0")
        HpOtelInstrumentor().instrument()
    assert telemetry.configured() is None  # nothing exported by hp_otel
    session = active_session()
    assert session is not None and session.tracer_provider is tracer_proxy and session.meter_provider is meter_proxy


def test_a_bad_setting_is_logged_and_the_default_kept(no_global_providers, monkeypatch, caplog) -> None:
    monkeypatch.setenv("HP_OTEL_CONFIGURE_EXPORT", "maybe")
    with caplog.at_level(logging.WARNING, logger=instrumentation.logger.name):
        HpOtelInstrumentor().instrument()  # a zero-code run is not stopped by a typo
    assert telemetry.configured() is not None
    assert any("HP_OTEL_CONFIGURE_EXPORT" in r.getMessage() and "'maybe'" in r.getMessage() for r in caplog.records)


def test_a_bad_argument_is_refused_by_name(no_global_providers) -> None:
    with pytest.raises(ValueError, match="configure_export must be True or False"):
        HpOtelInstrumentor().instrument(configure_export="no")
