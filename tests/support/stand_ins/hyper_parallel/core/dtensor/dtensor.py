"""DTensor: a torch.Tensor subclass whose ops go through `_OP_DISPATCHER.dispatch` (`__torch_function__`).

`.shape` is the **global** shape (`.local_shape` / `to_local().shape` the local one);
metadata the framework reads is plain Python properties, so reading it dispatches nothing.
"""

from __future__ import annotations

import torch

from hyper_parallel.core.dtensor.placement_types import Shard


def _global_shape(local_shape, device_mesh, placements):
    shape = list(local_shape)
    for mesh_dim, placement in enumerate(placements):
        if isinstance(placement, Shard):
            shape[placement.dim] *= device_mesh.mesh_shape[mesh_dim]
    return torch.Size(shape)


class DTensor(torch.Tensor):
    @staticmethod
    def __new__(cls, local_tensor, device_mesh, placements, shape=None):
        t = torch.Tensor._make_subclass(cls, local_tensor, local_tensor.requires_grad)
        t._local_tensor = local_tensor
        t._device_mesh = device_mesh
        t._placements = tuple(placements)
        t._global_shape = (
            torch.Size(shape) if shape is not None else _global_shape(local_tensor.shape, device_mesh, t._placements)
        )
        return t

    def __init__(self, *args, **kwargs):
        pass

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        from hyper_parallel.core.shard._op_dispatch import _OP_DISPATCHER

        return _OP_DISPATCHER.dispatch(func, args, kwargs or {})

    # --- metadata ---------------------------------------------------------------------
    @property
    def placements(self):
        return self._placements

    @property
    def device_mesh(self):
        return self._device_mesh

    @property
    def layout(self):
        return (self._device_mesh, self._placements)

    @property
    def shape(self):
        return self._global_shape

    @property
    def local_shape(self):
        return self._local_tensor.shape

    @property
    def dtype(self):
        return self._local_tensor.dtype

    @property
    def device(self):
        return self._local_tensor.device

    @property
    def requires_grad(self):
        return self._local_tensor.requires_grad

    @property
    def grad_fn(self):
        return self._local_tensor.grad_fn

    @property
    def is_leaf(self):
        return self._local_tensor.is_leaf

    @property
    def grad(self):
        return self._local_tensor.grad

    # --- conversions ------------------------------------------------------------------
    def to_local(self):
        return self._local_tensor

    @staticmethod
    def from_local(local_tensor, device_mesh, placements):
        return DTensor(local_tensor, device_mesh, placements)

    def redistribute(self, device_mesh, placements):
        from hyper_parallel.core.dtensor.tensor_redistribution import redistribute

        return redistribute(self, device_mesh, tuple(placements))

    def full_tensor(self):
        from hyper_parallel.core.dtensor.placement_types import Replicate

        return self.redistribute(self._device_mesh, (Replicate(),)).to_local()

    def backward(self, gradient=None, retain_graph=None, create_graph=False):
        self._local_tensor.backward(gradient, retain_graph, create_graph)

    def __repr__(self):
        return f"DTensor(shape={tuple(self._global_shape)}, placements={self._placements}, mesh={self._device_mesh})"
