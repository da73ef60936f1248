"""Collectives issued on another thread than the one running the model (a data loader's, a
checkpoint writer's) belong to no module of the training thread: module calls are open on the
thread that runs them (hp_otel.record.attribution).

Proven against referees: a dispatch mode with its own module hooks on the training thread (what
ran in each module there), and one on the loader thread (what that thread issued; torch's
dispatch modes are per thread, so neither sees the other's).
"""

from __future__ import annotations

import threading
from collections import Counter

import pytest
import torch
import torch.distributed as dist
from referee import Referee

from hp_otel import CommDebugMode
from hp_otel.spans import schema
from hp_otel.spans.call_tree import build_call_tree
from hp_otel.workloads.tp_mlp import train_step

LOADS = 50


class _Loader:
    """A data-loader thread that broadcasts `LOADS` times while the training thread is in fc2's
    forward (held there by a hook until the loader is done), each broadcast counted by its referee."""

    def __init__(self, model: torch.nn.Module, own_window: bool) -> None:
        self.own_window = own_window
        self.referee = Referee()
        self.window: CommDebugMode | None = None
        self._go, self._done = threading.Event(), threading.Event()
        self._handle = model.fc2.register_forward_pre_hook(self._hold_fc2)
        self._thread = threading.Thread(target=self._run, name="loader")
        self._thread.start()

    def _hold_fc2(self, module: torch.nn.Module, args: object) -> None:
        if not self._go.is_set():
            self._go.set()
            assert self._done.wait(30), "the loader thread did not finish"

    def _run(self) -> None:
        assert self._go.wait(30), "the training thread never reached fc2"
        try:
            with self.referee:
                if self.own_window:
                    with CommDebugMode() as self.window:
                        self._load()
                else:
                    self._load()
        finally:
            self._done.set()

    @staticmethod
    def _load() -> None:
        for _ in range(LOADS):
            dist.broadcast(torch.ones(4), src=0)

    def join(self) -> None:
        self._thread.join(30)
        self._handle.remove()


def _merged(*counts: dict[str, dict[str, dict[str, int]]]) -> dict[str, dict[str, dict[str, int]]]:
    out: dict[str, dict[str, Counter[str]]] = {}
    for one in counts:
        for fqn, phases in one.items():
            for phase, names in phases.items():
                out.setdefault(fqn, {}).setdefault(phase, Counter()).update(names)
    return {fqn: {phase: dict(names) for phase, names in phases.items()} for fqn, phases in out.items()}


@pytest.mark.parametrize("record_spans", [True, False], ids=["traced", "counts_only"])
def test_a_loader_threads_collectives_count_outside_every_module(tp_mlp, record_spans: bool) -> None:
    model, x = tp_mlp
    trainer = Referee(model)
    with CommDebugMode(module=model, record_spans=record_spans) as mode, trainer:
        loader = _Loader(model, own_window=False)
        train_step(model, x)
        loader.join()
    assert loader.referee.counts == {"c10d.broadcast_": LOADS}
    assert sum(trainer.counts.values()) > 0 and "c10d.broadcast_" not in trainer.counts
    loads = {schema.OUTSIDE_FQN: {schema.PHASE_OUTSIDE: dict(loader.referee.counts)}}
    assert mode.get_comm_module_counts() == _merged(trainer.module_counts_dict(), loads)
    assert mode.get_comm_counts() == dict(trainer.counts + loader.referee.counts)
    assert mode.get_callback_error_counts() == {}
    if record_spans:  # their spans at the window's root, not under fc2's (the training thread's) span
        roots = build_call_tree(mode.get_finished_spans())
        broadcasts = [r for r in roots if r.kind == schema.KIND_COLLECTIVE and r.name == "broadcast"]
        assert len(broadcasts) == LOADS
        assert all(r.phase == schema.PHASE_OUTSIDE for r in broadcasts)


def test_a_loader_thread_with_its_own_window_records_there(tp_mlp) -> None:
    model, x = tp_mlp
    trainer = Referee(model)
    with CommDebugMode(module=model) as mode, trainer:
        loader = _Loader(model, own_window=True)
        train_step(model, x)
        loader.join()
    assert loader.window is not None
    assert loader.window.get_comm_counts() == dict(loader.referee.counts) == {"c10d.broadcast_": LOADS}
    assert mode.get_comm_counts() == dict(trainer.counts)
    assert mode.get_comm_module_counts() == trainer.module_counts_dict()
