"""Redistribution on a 1-D mesh: which collective each transition calls (group passed by keyword).

| transition | collective |
|---|---|
| Shard -> Replicate | differentiable_all_gather_concat |
| Shard(a) -> Shard(b) | differentiable_all_to_all (keywords only) |
| Partial -> Replicate | differentiable_all_reduce |
| Partial -> Shard | differentiable_reduce_scatter |
| Replicate -> Shard | none (local chunk) |

The collectives are looked up at call time: on the platform before the newest
release, in `hyper_parallel.core.dtensor._utils` from it on.
"""

from __future__ import annotations

import torch

from hyper_parallel._release import PLATFORM_HAS_DIFFERENTIABLE
from hyper_parallel.core.dtensor.placement_types import Partial, Replicate, Shard


def _collectives():
    if PLATFORM_HAS_DIFFERENTIABLE:
        from hyper_parallel.platform import get_platform

        return get_platform()
    from hyper_parallel.core.dtensor import _utils

    return _utils


def redistribute(dtensor, device_mesh, placements):
    from hyper_parallel.core.dtensor.dtensor import DTensor

    (src,), (dst,) = dtensor.placements, placements
    local = dtensor.to_local()
    group = device_mesh.get_group(0)
    size = device_mesh.size()
    ops = _collectives()
    if src == dst:
        out = local
    elif isinstance(src, Partial) and isinstance(dst, Replicate):
        out = ops.differentiable_all_reduce(local, src.reduce_op, group=group)
    elif isinstance(src, Partial) and isinstance(dst, Shard):
        out = ops.differentiable_reduce_scatter(local, size, dst.dim, src.reduce_op, group=group)
    elif isinstance(src, Shard) and isinstance(dst, Replicate):
        out = ops.differentiable_all_gather_concat(local, group=group, concat_size=size, concat_dim=src.dim)
    elif isinstance(src, Shard) and isinstance(dst, Shard):
        parts = torch.cat(local.chunk(size, dim=dst.dim), dim=0)
        exchanged = ops.differentiable_all_to_all(input_data=parts, output_shape=parts.shape, group=group)
        out = torch.cat(exchanged.chunk(size, dim=0), dim=src.dim)
    elif isinstance(src, Replicate) and isinstance(dst, Shard):
        out = local.chunk(size, dim=dst.dim)[device_mesh.get_local_rank()]
    else:
        raise NotImplementedError(f"redistribute {src} -> {dst}")
    return DTensor(out, device_mesh, (dst,), dtensor.shape)
