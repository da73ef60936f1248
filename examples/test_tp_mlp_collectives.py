"""What a user's own test looks like with hp_otel's pytest plugin (loaded automatically).

Run: `pytest examples/test_tp_mlp_collectives.py`.  One process, torch's fake process
group: DTensor issues the same collectives as on a real 2-rank run, and they return at once.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from hp_otel.testing import assert_collective_counts, assert_no_callback_errors, assert_span_tree


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


@pytest.fixture(scope="module")
def model():
    from torch.testing._internal.distributed.fake_pg import FakeStore

    created = not dist.is_initialized()
    if created:
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    torch.manual_seed(0)
    mesh = init_device_mesh("cpu", (2,))
    yield parallelize_module(MLP(), mesh, {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
    if created:
        dist.destroy_process_group()


def test_one_step_issues_two_all_reduces(model, make_comm_debug_mode, hp_span_exporter) -> None:
    x = torch.randn(4, 16, requires_grad=True)
    with make_comm_debug_mode(module=model) as mode:
        model(x).sum().backward()

    # counts: exact, from the mode; the same read back from the spans your exporter received
    assert_collective_counts(mode, {"all_reduce": 2}, normalized=True)
    assert_collective_counts(hp_span_exporter, {"_c10d_functional.all_reduce": 2})
    # where they come from: fc2's forward output and fc1's backward
    assert_span_tree(
        hp_span_exporter,
        """
        MLP
          fc1
          fc2
            all_reduce
        MLP [backward]
          fc2 [backward]
          fc1 [backward]
            all_reduce
        """,
        kinds=["module", "collective"],
    )
    assert_no_callback_errors(mode)
