"""Zero-code pieces: the model found from the optimizer, and the launcher left alone."""

from __future__ import annotations

import sys

import torch
from torch import nn

from hp_otel.always_on.instrumentation import active_session
from hp_otel.always_on.instrumentor import HpOtelInstrumentor
from hp_otel.always_on.model_tracker import ModelTracker


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 8)
        self.fc2 = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.fc1(x))


def test_the_model_is_the_module_holding_the_optimizers_parameters_and_the_hook_goes() -> None:
    model, other, loss_fn = Model(), nn.Linear(4, 4), nn.MSELoss()
    tracker = ModelTracker()
    assert tracker.start() and tracker.find() is None  # nothing ran yet
    loss = loss_fn(model(torch.randn(2, 4)), torch.zeros(2, 4)) + other(torch.randn(2, 4)).sum()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loss.backward()
    assert tracker.find(optimizer) is model  # not fc1/fc2 (fewer parameters), not other, not the loss
    assert tracker.find(torch.optim.SGD(other.parameters(), lr=0.1)) is other
    assert tracker.find(torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=0.1)) is None  # trains none of them
    hooks_before = len(torch.nn.modules.module._global_forward_pre_hooks)
    tracker.stop()
    assert len(torch.nn.modules.module._global_forward_pre_hooks) == hooks_before - 1
    model(torch.randn(2, 4))
    assert tracker.find(optimizer) is None  # forgets, and sees nothing after stop()


def test_the_instrumentor_attributes_implicit_steps_to_the_trained_model(monkeypatch) -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider

    model = Model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    instrumentor = HpOtelInstrumentor()
    instrumentor.instrument(
        tracer_provider=TracerProvider(shutdown_on_exit=False), meter_provider=MeterProvider(shutdown_on_exit=False)
    )
    try:
        session = active_session()
        assert session is not None and session.module is None and session.tracker.tracking
        for _ in range(2):
            model(torch.randn(2, 4)).sum().backward()
            optimizer.step()
        assert session.module is model and not session.tracker.tracking
        mode = session._implicit[1]
        assert mode.module is model  # the open window traces the model's modules
    finally:
        instrumentor.uninstrument()


def test_the_launcher_process_is_not_instrumented(monkeypatch) -> None:
    monkeypatch.setattr(sys, "orig_argv", ["/v/bin/python", "/v/bin/torchrun", "--nproc-per-node", "2", "train.py"])
    instrumentor = HpOtelInstrumentor()
    instrumentor.instrument()
    try:
        assert active_session() is None
    finally:
        instrumentor.uninstrument()
