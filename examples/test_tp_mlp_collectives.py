"""What a user's own test looks like with hp_otel's pytest plugin (loaded automatically).

Run: `pytest examples/test_tp_mlp_collectives.py`.  One process, torch's fake process
group: DTensor issues the same collectives as on a real 2-rank run, and they return at once.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from hp_otel.cli.tp_mlp import build_tp_mlp
from hp_otel.testing import assert_collective_counts, assert_no_callback_errors, assert_span_tree


@pytest.fixture(scope="module")
def model():
    from torch.testing._internal.distributed.fake_pg import FakeStore

    created = not dist.is_initialized()
    if created:
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    yield build_tp_mlp(world_size=2)
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
