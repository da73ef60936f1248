"""Real 2-process runs over gloo on loopback: the TP MLP and every eager collective."""

from __future__ import annotations

import gloo_workers
import pytest
import torch.multiprocessing as mp

from hp_otel.workloads.process_groups import free_port

pytestmark = pytest.mark.multiprocess  # two gloo processes

WORLD_SIZE = 2


def test_tp_mlp_forward_backward_on_two_ranks() -> None:
    mp.spawn(gloo_workers.tp_mlp_worker, args=(WORLD_SIZE, free_port()), nprocs=WORLD_SIZE, join=True)


def test_eager_and_functional_collectives_on_two_ranks() -> None:
    mp.spawn(gloo_workers.eager_collectives_worker, args=(WORLD_SIZE, free_port()), nprocs=WORLD_SIZE, join=True)


@pytest.mark.parametrize("hook", ["kernels", "dispatch"])
def test_hooks_survive_work_freed_on_the_gloo_thread(hook) -> None:
    """The pattern that deadlocked kernels on the CPU key (docs/how-it-works/collective-hook.md)."""
    args = (WORLD_SIZE, free_port(), 300, hook)
    mp.spawn(gloo_workers.work_freed_on_gloo_thread_worker, args=args, nprocs=WORLD_SIZE, join=True)
