"""Long windows and windows per step stay cheap: what a window keeps is bounded whatever its
length, and a window with kept hooks walks no module tree.

- counts-only windows over many steps: the async collectives awaiting completion are settled
  as they complete (their durations checked against the sum this test computes), a completion
  that comes late is still the one measured, and work never waited for stays bounded;
- `hp_otel.install()`: opening a window per step on one thread never walks the model
  (the tree is walked only when a window on another thread traces a model).
"""

from __future__ import annotations

import threading

import pytest
import torch
from events import ALL_REDUCE
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from referee import Referee

import hp_otel
from hp_otel import CommDebugMode
from hp_otel.mode import registry
from hp_otel.record import collective_metrics as recorder_module
from hp_otel.record import installation
from hp_otel.spans import schema

STEPS = 600  # 9,600 collectives: past _MAX_PENDING_VALUES, so the early hand-over runs too
PER_STEP = 16  # async collectives a step, as the TP transformer's backward


def _durations(reader: InMemoryMetricReader) -> tuple[int, float]:
    """(count, sum in seconds) of the duration histogram over every series."""
    data = reader.get_metrics_data()
    points = [
        p
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name == schema.METRIC_DURATION
        for p in m.data.data_points
    ]
    return sum(p.count for p in points), sum(p.sum for p in points)


def _pending_values(mode: CommDebugMode) -> int:
    return sum(len(values) for values in mode._recorder.metrics._pending_durations.values())


def test_counts_only_window_settles_completed_collectives_and_keeps_a_late_one() -> None:
    reader = InMemoryMetricReader()
    with CommDebugMode(meter_provider=MeterProvider(metric_readers=[reader]), record_spans=False) as mode:
        observer = mode.observer
        late = observer.on_collective(ALL_REDUCE, 0, 10, awaits_completion=True)  # waited for at the very end
        expected_ns = 0
        most_awaiting = most_pending = 0
        t = 1_000
        for step in range(STEPS):
            tokens = []
            for _ in range(PER_STEP):
                tokens.append((observer.on_collective(ALL_REDUCE, t, t + 5, awaits_completion=True), t))
                t += 10
            for i, (token, start) in enumerate(tokens):  # completes (its wait) some time after the launch
                end = start + 100 + i + step % 7
                observer.on_collective_complete(token, end, schema.COMPLETION_WAIT)
                expected_ns += end - start
            most_awaiting = max(most_awaiting, len(mode._recorder.metrics._awaiting))
            most_pending = max(most_pending, _pending_values(mode))
        observer.on_collective_complete(late, 50_000, schema.COMPLETION_WAIT)
        expected_ns += 50_000
    assert mode.get_total_counts() == STEPS * PER_STEP + 1
    # bounded: the old recorder held all 9,601 until the window closed
    assert most_awaiting <= 2 * recorder_module._AWAITING_SWEEP
    assert most_pending <= recorder_module._MAX_PENDING_VALUES
    count, total_s = _durations(reader)
    assert count == STEPS * PER_STEP + 1  # every duration once, none lost, none twice
    assert total_s == pytest.approx(expected_ns / 1e9, rel=1e-9)  # each one to its completion, the late one too


def test_counts_only_window_bounds_work_nobody_waits_for() -> None:
    reader = InMemoryMetricReader()
    launches = 3 * recorder_module._MAX_AWAITING
    with CommDebugMode(meter_provider=MeterProvider(metric_readers=[reader]), record_spans=False) as mode:
        most = 0
        for i in range(launches):
            mode.observer.on_collective(ALL_REDUCE, i * 10, i * 10 + 3, awaits_completion=True)
            most = max(most, len(mode._recorder.metrics._awaiting))
    assert most <= 2 * recorder_module._MAX_AWAITING
    count, total_s = _durations(reader)
    assert count == launches  # never completed: each counts with its launch time, as at window end
    assert total_s == pytest.approx(launches * 3e-9, rel=1e-9)


@pytest.fixture
def transformer(fake_world):
    from hp_otel.workloads.tp_transformer import build_tp_transformer, demo_tokens

    return build_tp_transformer(fake_world), demo_tokens()


@pytest.fixture
def kept_hooks():
    hp_otel.uninstall()
    hp_otel.install()
    yield
    hp_otel.uninstall()
    assert installation.lingering_count() == 0


def _step(model: torch.nn.Module, tokens: torch.Tensor) -> None:
    model(tokens).sum().backward()
    model.zero_grad(set_to_none=True)


def test_counts_only_window_over_many_real_steps_stays_bounded(transformer, kept_hooks) -> None:
    model, tokens = transformer
    with Referee(model) as referee:
        _step(model, tokens)
    per_step = sum(referee.counts.values())
    steps = 40
    with CommDebugMode(module=model, record_spans=False) as mode:
        most = 0
        for _ in range(steps):
            _step(model, tokens)
            most = max(most, len(mode._recorder.metrics._awaiting))
    assert mode.get_total_counts() == steps * per_step
    assert per_step * steps > 2 * recorder_module._AWAITING_SWEEP  # long enough that the old list would exceed it
    assert most <= 2 * recorder_module._AWAITING_SWEEP


def test_windows_with_kept_hooks_walk_no_module_tree(transformer, kept_hooks, monkeypatch) -> None:
    model, tokens = transformer
    walks: list[object] = []
    real_tree = registry.module_tree

    def counting_tree(module):
        walks.append(module)
        return real_tree(module)

    monkeypatch.setattr(registry, "module_tree", counting_tree)
    for _ in range(5):
        with CommDebugMode(module=model) as mode:
            _step(model, tokens)
    assert walks == []  # one thread, one model: nothing to check against
    assert mode.get_total_counts() > 0

    opened, release = threading.Event(), threading.Event()
    other = torch.nn.Linear(2, 2)

    def hold() -> None:
        with CommDebugMode(module=other, engine="torch"):
            opened.set()
            release.wait(10)

    holder = threading.Thread(target=hold, name="other-trainer")
    holder.start()
    try:
        assert opened.wait(10)
        with CommDebugMode(module=model):  # another thread traces a model: now both trees are compared
            _step(model, tokens)
        assert set(map(id, walks)) == {id(model), id(other)}
        with pytest.raises(RuntimeError, match=r"module Linear is already traced by a window on another thread"):
            with CommDebugMode(module=other, engine="torch"):
                pass
    finally:
        release.set()
        holder.join()
    assert registry.traced_modules == {}
