"""What a Kineto reader needs of a collective that the span did not say: the group's mesh dimension
(from torch's `group_desc`, "mesh_<dim name>" for a DeviceMesh dimension; in the group table, described
once per group) and all_to_all's split sizes.

Referees: the DeviceMesh the test builds (its dimensions' names) and the split sizes the test
passes; torch's fake process group over 4 ranks, so a 2 x 2 mesh has real sub-groups.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from hp_otel import CommDebugMode
from hp_otel.spans import schema
from hp_otel.spans.codec import decode_collective
from hp_otel.spans.groups import GroupTable


def _collectives(mode: CommDebugMode) -> list:
    spans = [sp for sp in mode.get_finished_spans() if sp.attributes.get(schema.CALL_KIND) == schema.KIND_COLLECTIVE]
    return sorted(spans, key=lambda sp: sp.start_time)


def test_a_mesh_dimensions_group_is_described_by_its_name(fake_world_of_4) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    with CommDebugMode() as mode:
        for dim in ("dp", "tp"):
            dist.all_reduce(torch.ones(4), group=mesh.get_group(dim))  # c10d
            funcol.wait_tensor(funcol.all_reduce(torch.ones(4), "sum", (mesh, mesh.mesh_dim_names.index(dim))))
        dist.all_reduce(torch.ones(4))  # the world: torch's default group
    spans = _collectives(mode)
    table = GroupTable.of(sp.attributes for sp in spans)
    assert [table.group_of(sp.attributes).mesh_dim for sp in spans] == ["dp", "dp", "tp", "tp", ""]
    assert decode_collective(spans[2].attributes, spans[2].name, table).mesh_dim == "tp"  # read back


def test_all_to_all_split_sizes_are_on_the_span(fake_world_of_4) -> None:
    splits_in, splits_out = [1, 2, 3, 4], [4, 3, 2, 1]
    with CommDebugMode() as mode:
        dist.all_to_all_single(torch.empty(10, 2), torch.ones(10, 2), splits_out, splits_in)
        funcol.wait_tensor(funcol.all_to_all_single(torch.ones(10, 2), splits_out, splits_in, dist.group.WORLD))
        dist.all_to_all_single(torch.empty(8), torch.ones(8))  # even: no split sizes given, none recorded
    uneven_c10d, uneven_functional, even = _collectives(mode)
    for span in (uneven_c10d, uneven_functional):
        assert span.attributes[schema.COLLECTIVE_INPUT_SPLIT_SIZES] == tuple(splits_in)
        assert span.attributes[schema.COLLECTIVE_OUTPUT_SPLIT_SIZES] == tuple(splits_out)
        info = decode_collective(span.attributes)
        assert (info.input_split_sizes, info.output_split_sizes) == (tuple(splits_in), tuple(splits_out))
    assert schema.COLLECTIVE_INPUT_SPLIT_SIZES not in even.attributes
