"""The design's 2-rank MLP on the hyper-parallel stand-in over real gloo, every release variant."""

from __future__ import annotations

import hyper_parallel_workers
import pytest
import torch.multiprocessing as mp

from hp_otel.workloads.process_groups import free_port

pytestmark = pytest.mark.multiprocess  # two gloo processes


def test_design_mlp_and_redistributions_on_two_ranks() -> None:
    mp.spawn(hyper_parallel_workers.hyper_parallel_worker, args=(2, free_port()), nprocs=2, join=True)
