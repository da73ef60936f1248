"""placement_texts: a redistribute's placements text, cached by the placement objects, is never stale."""

from __future__ import annotations

import gc
import weakref

import torch
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor.placement_types import _StridedShard

from hp_otel import CommDebugMode
from hp_otel.sources.pytorch import placement_texts
from hp_otel.spans import codec, schema


def test_texts_are_the_codecs_for_every_torch_placement_and_mesh_rank() -> None:
    cases = [
        (Shard(0),),
        (Replicate(),),
        (Partial(),),
        (Partial("max"),),
        (_StridedShard(0, split_factor=2),),
        (Shard(1), Replicate()),
        (Replicate(), Shard(0), Partial()),
    ]
    for placements in cases:
        expected = codec.placements_text(placements)
        assert placement_texts.placements_text(placements) == expected
        assert placement_texts.placements_text(tuple(placements)) == expected  # a fresh tuple, cached objects
        assert placement_texts.placements_text(list(placements)) == expected


def test_an_entry_for_another_object_at_the_same_id_is_not_used() -> None:
    """A dead placement's id reused by a new one: the weak reference tells them apart."""
    old, new = Shard(0), Shard(1)
    # what the cache would hold had `old` lived at `new`'s address: a reference to another object
    placement_texts._texts[id(new)] = (weakref.ref(old), "Shard(dim=0)")
    assert placement_texts.placements_text((new,)) == "Shard(dim=1)"
    assert placement_texts.placements_text((Replicate(), new)) == "Replicate();Shard(dim=1)"


def test_a_dead_placements_entry_is_not_used_by_whatever_takes_its_id() -> None:
    texts = []
    for dim in range(50):  # CPython reuses a freed object's memory: most of these land on an id seen before
        placement = Shard(dim)
        texts.append(placement_texts.placements_text((placement,)))
        del placement
        gc.collect()
    assert texts == [f"Shard(dim={dim})" for dim in range(50)]


def test_other_objects_are_not_cached_by_identity() -> None:
    """Not a torch placement: its text may change, so it is formatted as the codec does, every time."""

    class Layout:
        def __init__(self) -> None:
            self.text = "S(0)"

        def __repr__(self) -> str:
            return self.text

    layout = Layout()
    assert placement_texts.placements_text((layout,)) == "S(0)"
    layout.text = "R"
    assert placement_texts.placements_text([layout]) == "R"
    assert placement_texts.placements_text(("Shard(dim=0)", Replicate())) == "Shard(dim=0);Replicate()"
    assert id(layout) not in placement_texts._texts


def test_the_cache_stays_bounded() -> None:
    kept = [Shard(dim) for dim in range(placement_texts._CACHE_LIMIT + 10)]
    for placement in kept:
        placement_texts.placements_text((placement,))
    assert len(placement_texts._texts) <= placement_texts._CACHE_LIMIT
    assert [placement_texts.placements_text((p,)) for p in kept[:3]] == ["Shard(dim=0)", "Shard(dim=1)", "Shard(dim=2)"]


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
