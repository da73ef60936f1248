"""What a group's one description says on torch: its global members and the DeviceMesh dimension it is."""

from __future__ import annotations

import torch
from torch import nn

from hp_otel import CommDebugMode
from hp_otel.spans import schema
from hp_otel.spans.groups import GroupTable, group


def test_fully_shard_on_a_mesh_dimension_names_it_once(fake_world_of_4) -> None:
    """A 2 x 2 mesh (dims dp_replicate, dp_shard), FSDP2 over dp_shard; torch's own mesh says what it holds."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp_replicate", "dp_shard"))
    shard = mesh["dp_shard"]
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
    fully_shard(model, mesh=shard)
    with CommDebugMode(module=model) as mode:
        model(torch.randn(2, 8)).sum().backward()
    spans = [s for s in mode.get_finished_spans() if s.attributes[schema.CALL_KIND] == schema.KIND_COLLECTIVE]
    table = GroupTable.of(s.attributes for s in spans)
    members = tuple(shard.mesh.flatten().tolist())  # the referee: the mesh's own ranks of that dimension
    pg = shard.get_group()
    expected = group(pg.group_name, members, "dp_shard")
    assert table.to_json() == {expected.id: {"name": pg.group_name, "members": "0,1", "mesh_dim": "dp_shard"}}
    assert len(spans) >= 2 and all(s.attributes[schema.COLLECTIVE_GROUP_ID] == expected.id for s in spans)
    assert sum(schema.COLLECTIVE_GROUP_MEMBERS in s.attributes for s in spans) == 1  # described once
