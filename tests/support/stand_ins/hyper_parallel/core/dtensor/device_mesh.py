"""DeviceMesh: `.mesh_shape` (no `.shape`), `.ndim`, `.size()`, `.mesh_dim_names`, `.rank_list`, `.get_group(dim)`.

Only 1-D meshes over the default torch process group (which must exist: call
`torch.distributed.init_process_group("gloo")` first).
"""

from __future__ import annotations

import torch.distributed as dist


class DeviceMesh:
    def __init__(self, device_type, mesh_shape, mesh_dim_names=None):
        mesh_shape = tuple(mesh_shape)
        if len(mesh_shape) != 1 or mesh_shape[0] != dist.get_world_size():
            raise NotImplementedError("the stand-in supports a 1-D mesh over the whole world only")
        self.device_type = device_type
        self.mesh_shape = mesh_shape
        self.mesh_dim_names = tuple(mesh_dim_names) if mesh_dim_names else ("dp",)
        self.rank_list = tuple(range(mesh_shape[0]))
        self._group = dist.group.WORLD

    @property
    def ndim(self):
        return len(self.mesh_shape)

    def size(self, dim=None):
        return self.mesh_shape[0]

    def get_group(self, dim=0):
        return self._group

    def get_local_rank(self, dim=0):
        return dist.get_rank(self._group)

    def __repr__(self):
        return f"DeviceMesh({self.device_type!r}, mesh_shape={self.mesh_shape})"


def init_device_mesh(device_type, mesh_shape, mesh_dim_names=None):
    return DeviceMesh(device_type, mesh_shape, mesh_dim_names)
