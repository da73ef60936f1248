"""A bad setting or argument is refused where the object is made, naming it.

Before, a bad `HP_OTEL_TORCH_*` value was read only as the window's source attached: a fault
logged once, a window that counted `{}`, and then "no DTensor op ran". And `instrument()` /
`StepTracer` took any provider or module, then lost every step.
"""

from __future__ import annotations

import logging

import pytest
import torch
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider

import hp_otel
import hp_otel.torch
from hp_otel.always_on.instrumentation import active_session
from hp_otel.always_on.instrumentor import HpOtelInstrumentor
from hp_otel.integrations.tracer import StepTracer

SETTINGS = {
    "HP_OTEL_TORCH_NATIVE": r"'auto' \(default: the gate if built\) and 'off'",
    "HP_OTEL_TORCH_OP_HOOK": r"'class' \(default\) and 'mode'",
    "HP_OTEL_TORCH_COLLECTIVE_HOOK": r"'kernels' \(default\) and 'dispatch'",
}


@pytest.mark.parametrize("variable", sorted(SETTINGS))
def test_a_bad_torch_setting_is_refused_when_the_window_is_made(monkeypatch, caplog, variable: str) -> None:
    monkeypatch.setenv(variable, "sometimes")
    message = rf"^{variable}='sometimes': allowed values are {SETTINGS[variable]}$"
    with caplog.at_level(logging.INFO, logger="hp_otel"):
        with pytest.raises(ValueError, match=message):
            hp_otel.CommDebugMode(torch.nn.Linear(2, 2))
        with pytest.raises(ValueError, match=message):
            hp_otel.torch.CommDebugMode()  # the torch drop-in
        with pytest.raises(ValueError, match=message):
            HpOtelInstrumentor().instrument(tracer_provider=TracerProvider(), meter_provider=MeterProvider())
        with pytest.raises(ValueError, match=message):
            StepTracer()
    assert active_session() is None and not HpOtelInstrumentor().is_instrumented_by_opentelemetry
    assert not [r for r in caplog.records if "saw no collective" in r.getMessage()]


_TRACER = "tracer_provider must be an OpenTelemetry TracerProvider or None, got "
_METER = "meter_provider must be an OpenTelemetry MeterProvider or None, got "
_MODULE = "module must be a torch.nn.Module, a mindspore.nn.Cell or None, got "


@pytest.mark.parametrize(
    ("argument", "value", "message"),
    [
        ("tracer_provider", "http://collector:4317", _TRACER + "str"),
        ("tracer_provider", MeterProvider(), _TRACER + "MeterProvider"),
        ("meter_provider", TracerProvider(), _METER + "TracerProvider"),
        ("module", "model", _MODULE + "str"),
        ("module", [torch.nn.Linear(2, 2)], _MODULE + "list"),
    ],
)
def test_instrument_and_step_tracer_refuse_a_wrong_type_up_front(argument: str, value: object, message: str) -> None:
    with pytest.raises(TypeError, match=f"^{message}$"):
        HpOtelInstrumentor().instrument(**{argument: value})
    assert active_session() is None and not HpOtelInstrumentor().is_instrumented_by_opentelemetry
    with pytest.raises(TypeError, match=f"^{message}$"):
        StepTracer(**{argument: value})


def test_step_tracer_with_right_types_records_every_step() -> None:
    """The checks refuse only what is wrong: SDK providers and a module still record each step."""
    model = torch.nn.Linear(2, 2)
    tracer = StepTracer(tracer_provider=TracerProvider(), meter_provider=MeterProvider(), module=model)
    try:
        for step in range(3):
            with tracer.step(step, model):
                model(torch.ones(1, 2))
    finally:
        tracer.close()
    assert tracer.traced == [0, 1, 2] and tracer.faults == 0
