"""Real 2-process runs over gloo on loopback: the TP MLP and every eager collective."""

from __future__ import annotations

import gloo_workers
import pytest
import torch.multiprocessing as mp

from hp_otel.cli.demo import free_port

pytestmark = pytest.mark.slow  # two gloo processes

WORLD_SIZE = 2


def test_tp_mlp_forward_backward_on_two_ranks() -> None:
    mp.spawn(gloo_workers.tp_mlp_worker, args=(WORLD_SIZE, free_port()), nprocs=WORLD_SIZE, join=True)


def test_eager_and_functional_collectives_on_two_ranks() -> None:
    mp.spawn(gloo_workers.eager_collectives_worker, args=(WORLD_SIZE, free_port()), nprocs=WORLD_SIZE, join=True)
