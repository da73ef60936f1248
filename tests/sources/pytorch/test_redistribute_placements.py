"""A redistribute span's placements and shape are each call's own (the wrapper's text is cached)."""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor, Replicate, Shard

from hp_otel import CommDebugMode
from hp_otel.spans import schema


def test_redistribute_spans_carry_each_calls_placements(fake_world) -> None:
    """The same DTensor redistributed to different placements, twice over: every span has its own."""
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (fake_world,))
    x = DTensor.from_local(torch.randn(4, 6), mesh, (Shard(0),))
    targets = [(Replicate(),), (Shard(1),), (Replicate(),), (Shard(1),)]
    with CommDebugMode() as mode:
        for placements in targets:
            x.redistribute(mesh, placements)
    spans = sorted(
        (s for s in mode.get_finished_spans() if s.name == schema.REDISTRIBUTE_SPAN_NAME), key=lambda s: s.start_time
    )
    got = [
        (s.attributes[schema.REDISTRIBUTE_SRC_PLACEMENTS], s.attributes[schema.REDISTRIBUTE_DST_PLACEMENTS])
        for s in spans
    ]
    assert got == [("Shard(dim=0)", "Replicate()"), ("Shard(dim=0)", "Shard(dim=1)")] * 2
    assert all(s.attributes[schema.TENSOR_SHAPE] == (8, 6) for s in spans)
