"""hp_otel's cache of process-group descriptions must not keep a group alive: after
`destroy_process_group(group)` the group is freed then, not at interpreter shutdown (where
gloo's worker threads can abort the process, pytorch/pytorch#179291)."""

from __future__ import annotations

import gc
import weakref

import torch
import torch.distributed as dist
from torch.distributed._functional_collectives import all_reduce

from hp_otel import CommDebugMode
from hp_otel.sources.pytorch import collectives


def test_a_destroyed_group_is_freed_and_forgotten(fake_world) -> None:
    group = dist.new_group(ranks=list(range(fake_world)))
    with CommDebugMode() as mode:
        all_reduce(torch.ones(4), "sum", group).wait()
    assert mode.get_comm_counts() == {"_c10d_functional.all_reduce": 1}
    key = id(group)
    assert key in collectives._groups  # described once, then cached
    freed = weakref.ref(group)
    dist.destroy_process_group(group)
    del group
    gc.collect()
    assert freed() is None, "the group outlived destroy_process_group"
    assert key not in collectives._groups
