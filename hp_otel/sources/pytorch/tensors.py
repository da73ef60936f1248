"""TensorInfo snapshots of torch tensors and DTensors."""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.tensor import DTensor

from hp_otel.sources.pytorch import _compat
from hp_otel.spans.infos import TensorInfo

_dtype_names: dict[torch.dtype, str] = {}


def dtype_name(dtype: torch.dtype) -> str:
    name = _dtype_names.get(dtype)
    if name is None:
        name = _dtype_names[dtype] = str(dtype)
    return name


# DTensorSpec -> TensorInfo: specs hash once and are shared by every step's parameters
# and most activations, so a hit costs a dict lookup instead of formatting the placements again.
_spec_infos: dict[Any, TensorInfo] = {}
_SPEC_CACHE_LIMIT = 4096
_dtensor_spec = _compat.dtensor_spec


# (shape, dtype) -> TensorInfo of a plain tensor: a frozen dataclass costs a Python __setattr__ per
# field to make, and a step's plain tensors repeat a few shapes.
_plain_infos: dict[tuple[Any, torch.dtype], TensorInfo] = {}
_PLAIN_CACHE_LIMIT = 1024


def tensor_info(t: torch.Tensor) -> TensorInfo:
    dtype = t.dtype
    if isinstance(t, DTensor):
        spec = _dtensor_spec(t)
        info = _spec_infos.get(spec)
        if info is None or info.dtype != _dtype_names.get(dtype):
            info = TensorInfo(
                shape=tuple(spec.shape),
                dtype=dtype_name(dtype),
                is_dtensor=True,
                placements=tuple(repr(p) for p in spec.placements),
                mesh_shape=tuple(spec.mesh.shape),
            )
            if len(_spec_infos) >= _SPEC_CACHE_LIMIT:
                _spec_infos.clear()
            _spec_infos[spec] = info
        return info
    key = (t.shape, dtype)
    try:
        info = _plain_infos.get(key)
    except TypeError:  # a symbolic size does not hash: no cache
        return TensorInfo(shape=tuple(t.shape), dtype=dtype_name(dtype))
    if info is None:
        info = TensorInfo(shape=tuple(key[0]), dtype=dtype_name(dtype))
        if len(_plain_infos) >= _PLAIN_CACHE_LIMIT:
            _plain_infos.clear()
        _plain_infos[key] = info
    return info


def tensor_infos(*values: Any) -> list[TensorInfo]:
    """Infos of the tensors among `values`, looking one level into lists, tuples and dicts."""
    out: list[TensorInfo] = []
    for value in values:
        if isinstance(value, torch.Tensor):
            out.append(tensor_info(value))
        elif isinstance(value, (list, tuple)):
            out.extend(tensor_info(v) for v in value if isinstance(v, torch.Tensor))
        elif isinstance(value, dict):
            out.extend(tensor_info(v) for v in value.values() if isinstance(v, torch.Tensor))
    return out
