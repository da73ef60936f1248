"""Which collectives torch's CommDebugMode counts, and under which key.

torch 2.13 counts the functional collectives (the native `_c10d_functional` ops,
reported under their legacy `c10d_functional` packet so old tests keep working), the
autograd `all_to_all_single`, `_dtensor.shard_dim_alltoall` and fifteen eager
`c10d` ops — each keyed by its `OpOverloadPacket`.  hp_otel counts more (in-place
and `_out` variants, `barrier`, `send`, `recv`, ...); those are "extra" here, kept
apart so torch-shaped counts stay equal to torch's.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import torch

# native packet name -> the legacy packet name torch reports it under
_NATIVE_TO_LEGACY: Mapping[str, str] = MappingProxyType(
    {
        "_c10d_functional.all_gather_into_tensor": "c10d_functional.all_gather_into_tensor",
        "_c10d_functional.all_gather_into_tensor_coalesced": "c10d_functional.all_gather_into_tensor_coalesced",
        "_c10d_functional.all_reduce": "c10d_functional.all_reduce",
        "_c10d_functional.all_reduce_coalesced": "c10d_functional.all_reduce_coalesced",
        "_c10d_functional.all_to_all_single": "c10d_functional.all_to_all_single",
        "_c10d_functional.broadcast": "c10d_functional.broadcast",
        "_c10d_functional.reduce_scatter_tensor": "c10d_functional.reduce_scatter_tensor",
        "_c10d_functional.reduce_scatter_tensor_coalesced": "c10d_functional.reduce_scatter_tensor_coalesced",
        "_c10d_functional_autograd.all_to_all_single": "c10d_functional.all_to_all_single",
    }
)
# eager c10d ops torch counts under their own packet
_C10D_COUNTED: tuple[str, ...] = (
    "c10d._allgather_base_",
    "c10d._reduce_scatter_base_",
    "c10d.allgather_",
    "c10d.allgather_coalesced_",
    "c10d.allgather_into_tensor_coalesced_",
    "c10d.allreduce_",
    "c10d.allreduce_coalesced_",
    "c10d.alltoall_",
    "c10d.alltoall_base_",
    "c10d.broadcast_",
    "c10d.gather_",
    "c10d.scatter_",
    "c10d.reduce_",
    "c10d.reduce_scatter_",
    "c10d.reduce_scatter_tensor_coalesced_",
)


def packet(name: str) -> Any:
    """`torch.ops.<namespace>.<op>` for "namespace.op", or None where this torch build lacks it."""
    namespace, _, op = name.partition(".")
    try:
        return getattr(getattr(torch.ops, namespace), op)
    except (AttributeError, RuntimeError):
        return None


@functools.cache
def _native_to_legacy() -> dict[Any, Any]:
    out = {}
    for native, legacy in _NATIVE_TO_LEGACY.items():
        p, key = packet(native), packet(legacy)
        if p is not None and key is not None:
            out[p] = key
    return out


@functools.cache
def c10d_collectives() -> frozenset[Any]:
    """The eager c10d packets torch counts (not user-extensible in torch either)."""
    return frozenset(p for p in map(packet, _C10D_COUNTED) if p is not None)


def comm_registry() -> set[Any]:
    """A fresh copy of torch's `comm_registry`: the functional packets, native and legacy, and
    `_dtensor.shard_dim_alltoall` (a set: like torch's, a user may add packets to count)."""
    names = (*_NATIVE_TO_LEGACY, *_NATIVE_TO_LEGACY.values(), "_dtensor.shard_dim_alltoall")
    return {p for p in map(packet, names) if p is not None}


def count_key(op_packet: Any, registry: set[Any]) -> Any | None:
    """The key torch's CommDebugMode counts this dispatched packet under, or None if it does not count it."""
    if op_packet in registry or op_packet in c10d_collectives():
        return _native_to_legacy().get(op_packet, op_packet)
    return None


def torch_key_for_name(name: str, registry: set[Any]) -> Any | None:
    """hp_otel's count key ("_c10d_functional.all_reduce") -> torch's key, or None if torch does not count it."""
    p = packet(name)
    return count_key(p, registry) if p is not None else None


def extra_key_for_name(name: str) -> Any:
    """A collective torch does not count, keyed like torch would: its packet (its name if it has none)."""
    p = packet(name)
    return p if p is not None else name
