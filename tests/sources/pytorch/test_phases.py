"""Issue 19 item 4: phases beyond forward and backward.

A training step on a TP MLP: forward, the loss logged with an all_reduce outside the model,
backward, gradient-norm clipping over DTensor parameters (an all_reduce outside every module),
and an optimizer whose step all_reduces a statistic.  Before, everything outside backward was
"forward"; now the step's collectives are phase "optimizer" under "(optimizer)", the rest
outside the model phase "outside" under "(outside)" — in counts, spans, metrics and the table.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from referee import Referee
from span_counts import module_counts_from_spans

from hp_otel import CommDebugMode
from hp_otel.spans import schema


class _SyncedSGD(torch.optim.SGD):
    """An SGD whose step all_reduces the number of steps taken (a framework's bookkeeping)."""

    def step(self, closure=None):  # type: ignore[no-untyped-def]
        steps = torch.ones(1)
        dist.all_reduce(steps)
        return super().step(closure)


def _step(model, x, optimizer) -> None:
    loss = model(x).sum()
    logged = loss.detach().clone()
    dist.all_reduce(logged)  # the loss, averaged for the log: outside the model
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # DTensor norms: an all_reduce
    optimizer.step()
    optimizer.zero_grad()


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_optimizer_and_outside_phases_match_referee(tp_mlp) -> None:
    model, x = tp_mlp
    optimizer = _SyncedSGD(model.parameters(), lr=0.1)
    referee = Referee(model)
    with CommDebugMode(module=model) as mode, referee:
        _step(model, x, optimizer)
    assert mode.get_callback_error_counts() == {}
    ours = mode.get_comm_module_counts()
    assert mode.get_comm_counts() == dict(referee.counts)
    assert ours == referee.module_counts_dict()
    assert ours == module_counts_from_spans(mode.get_finished_spans())
    assert ours[schema.OPTIMIZER_FQN] == {"optimizer": {"c10d.allreduce_": 1}}
    outside = ours[schema.OUTSIDE_FQN]["outside"]
    assert outside["c10d.allreduce_"] == 1 and sum(outside.values()) >= 2  # the loss's, and clipping's
    # none of them is "forward" any more: forward counts are the model's own
    assert {p for phases in ours.values() for p in phases} == {"forward", "backward", "optimizer", "outside"}
    phases = [
        sp.attributes[schema.PHASE]
        for sp in mode.get_finished_spans()
        if sp.attributes[schema.CALL_KIND] == "collective"
    ]
    assert phases.count("optimizer") == 1 and phases.count("outside") == sum(outside.values())
    table = mode.generate_comm_debug_tracing_table(noise_level=2)
    assert "Module((optimizer)) [optimizer]" in table
    assert "phase=optimizer" in mode.generate_comm_debug_tracing_table(noise_level=3)
    assert "phase=outside" in mode.generate_comm_debug_tracing_table(noise_level=3)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_phases_reach_the_metrics(tp_mlp) -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    model, x = tp_mlp
    reader = InMemoryMetricReader()
    optimizer = _SyncedSGD(model.parameters(), lr=0.1)
    with CommDebugMode(module=model, meter_provider=MeterProvider(metric_readers=[reader])):
        _step(model, x, optimizer)
    calls: dict[str, int] = {}
    for rm in reader.get_metrics_data().resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                if metric.name == schema.METRIC_CALLS:
                    for point in metric.data.data_points:
                        phase = point.attributes[schema.PHASE]
                        calls[phase] = calls.get(phase, 0) + point.value
    assert calls["optimizer"] == 1
    assert calls["outside"] >= 2
    assert set(calls) == {"forward", "backward", "optimizer", "outside"}


def test_without_module_tracking_the_optimizer_phase_still_shows(fake_world) -> None:
    """No `module=`: nothing tells outside from forward, but the optimizer step is its own."""
    param = torch.nn.Parameter(torch.randn(4))
    param.grad = torch.ones(4)
    optimizer = _SyncedSGD([param], lr=0.1)
    with CommDebugMode() as mode, Referee() as referee:
        dist.all_reduce(torch.ones(2))
        optimizer.step()
    assert mode.get_comm_module_counts() == referee.module_counts_dict()
    assert mode.get_comm_module_counts() == {schema.OPTIMIZER_FQN: {"optimizer": {"c10d.allreduce_": 1}}}
    assert mode.get_comm_counts() == {"c10d.allreduce_": 2}
