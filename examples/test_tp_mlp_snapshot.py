"""A user's test that guards a step's communication with a committed snapshot.

Run: `pytest examples/test_tp_mlp_snapshot.py`.  The first run wrote
`examples/snapshots/tp_mlp_step.json` (committed beside this file); from then on the test
fails, with `hp-otel diff`'s report, when the step issues other collectives, in other
modules or phases, or moves other byte counts.  After an intended change:
`pytest examples/test_tp_mlp_snapshot.py --hp-otel-update-snapshots`, review the
snapshot's diff, commit it.  One process, torch's fake process group.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from hp_otel.testing import assert_comm_snapshot
from hp_otel.workloads.tp_mlp import build_tp_mlp


@pytest.fixture(scope="module")
def model():
    from torch.testing._internal.distributed.fake_pg import FakeStore

    created = not dist.is_initialized()
    if created:
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    yield build_tp_mlp(world_size=2)
    if created:
        dist.destroy_process_group()


def test_tp_mlp_step_communicates_as_the_snapshot_says(model, make_comm_debug_mode) -> None:
    x = torch.randn(4, 16, requires_grad=True)
    with make_comm_debug_mode(module=model) as mode:
        model(x).sum().backward()
    # relative to this file: examples/snapshots/tp_mlp_step.json
    assert_comm_snapshot(mode, "snapshots/tp_mlp_step.json")
