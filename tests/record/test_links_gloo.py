"""Every span link hp_otel emits opens a span some rank really exported: on real gloo ranks, the
union of every rank's spans holds the target of every link."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch.multiprocessing as mp
from link_workers import linked_steps_worker

from hp_otel.spans import schema
from hp_otel.spans.otlp_json import read_spans
from hp_otel.workloads.process_groups import free_port

pytestmark = pytest.mark.multiprocess


@pytest.mark.parametrize("world_size", [2, 4])
def test_the_union_of_the_ranks_spans_holds_every_link_target(tmp_path: Path, world_size: int) -> None:
    mp.spawn(linked_steps_worker, args=(world_size, free_port(), str(tmp_path)), nprocs=world_size)
    spans = [s for path in sorted(tmp_path.glob("spans_rank*_step*.json")) for s in read_spans(path)]
    exported = {(s.context.trace_id, s.context.span_id) for s in spans}
    links = [(s, link) for s in spans for link in s.links]
    collectives = [s for s in spans if s.attributes.get(schema.CALL_KIND) == schema.KIND_COLLECTIVE]
    # per step: 2 world all-reduces (+ 1 on each half of 4): every member but the group's first links
    per_step = 2 * (world_size - 1) + (world_size // 2 if world_size > 2 else 0)
    assert len(collectives) == 2 * world_size * (2 + (world_size > 2)) and len(links) == 2 * per_step
    for span, link in links:
        target = (link.context.trace_id, link.context.span_id)
        assert target in exported, f"{span.name} {dict(span.attributes)} links to a span no rank exported"
        assert link.context.trace_id == span.context.trace_id  # the step's trace, shared by every rank
    by_id = {(s.context.trace_id, s.context.span_id): s for s in spans}
    for span, link in links:  # the target is the same collective: same match id, seq and group
        target = by_id[(link.context.trace_id, link.context.span_id)]
        for key in (schema.COLLECTIVE_MATCH_ID, schema.COLLECTIVE_SEQ, schema.COLLECTIVE_GROUP_ID):
            assert target.attributes[key] == span.attributes[key]
