"""Bandwidth of one collective, as NCCL-tests defines it (doc/PERFORMANCE.md of NVIDIA/nccl-tests).

`algbw = S / t` and `busbw = algbw * factor(op, n)`, with `S` the size NCCL-tests uses for
the op and `n` the group size.  hp_otel's `bytes` is what this rank handed to the
collective (its input), so `S` is derived from it:

| op                   | S (bytes)                          | bus factor |
|----------------------|------------------------------------|------------|
| all_reduce           | input (= output)                   | 2(n-1)/n   |
| reduce_scatter       | input (the whole array, n pieces)  | (n-1)/n    |
| all_gather           | output = n x input                 | (n-1)/n    |
| all_to_all           | input (this rank's send buffer)    | (n-1)/n    |
| gather               | n x input (the root's output)      | (n-1)/n    |
| broadcast, reduce    | input                              | 1          |
| send, recv, p2p      | input (every tensor of a p2p batch)| 1          |

Barriers, scatter (its input lives on the root only) and calls that moved no bytes
have no bandwidth.  `t` is the span's duration: the host time from the call to its
completion (for an async collective: its wait or Work), so on a rank that arrived first
it includes the wait for the others — `hp-otel ranks` also reports the bandwidth from
the shortest duration across ranks, the time after the last rank arrived.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, NamedTuple

from hp_otel.spans import schema


def _all_reduce(n: int) -> float:
    return 2.0 * (n - 1) / n


def _one_less(n: int) -> float:
    return (n - 1) / n


def _one(n: int) -> float:
    return 1.0


# op -> (how many times its input S is, bus factor of n)
_RULES = MappingProxyType(
    {
        "all_reduce": (False, _all_reduce),
        "reduce_scatter": (False, _one_less),
        "all_gather": (True, _one_less),
        "all_to_all": (False, _one_less),
        "gather": (True, _one_less),
        "broadcast": (False, _one),
        "reduce": (False, _one),
        "send": (False, _one),
        "recv": (False, _one),
        "p2p": (False, _one),
    }
)
# The normalised ops with no bandwidth, by decision (every other op of schema.NORMALISED_OPS has a rule).
NO_BANDWIDTH = frozenset({"barrier", "scatter"})


class Bandwidth(NamedTuple):
    size: int  # S, bytes
    algbw: float  # bytes/s
    busbw: float  # bytes/s


def nccl_size(op: str, nbytes: int, group_size: int) -> int:
    """The size S NCCL-tests uses for `op` given this rank's input bytes (0: no bandwidth for this op)."""
    rule = _RULES.get(op)
    if rule is None or nbytes <= 0 or group_size <= 0:
        return 0
    return nbytes * group_size if rule[0] else nbytes


def bus_factor(op: str, group_size: int) -> float:
    """NCCL-tests' correction from algorithm to bus bandwidth (0.0 for an op without one)."""
    rule = _RULES.get(op)
    if rule is None or group_size <= 0:
        return 0.0
    return rule[1](group_size)


def bandwidth(op: str, nbytes: int, group_size: int, duration_ns: int) -> Bandwidth | None:
    """algbw and busbw of one call, or None when it has none (a barrier, no bytes, no duration)."""
    size = nccl_size(op, nbytes, group_size)
    if size <= 0 or duration_ns <= 0:
        return None
    algbw = size * 1e9 / duration_ns
    return Bandwidth(size, algbw, algbw * bus_factor(op, group_size))


def attributes_of(bw: Bandwidth | None) -> dict[str, Any]:
    """The span attributes of a bandwidth already computed (empty for None)."""
    if bw is None:
        return {}
    return {schema.COLLECTIVE_BW_BYTES: bw.size, schema.COLLECTIVE_ALGBW: bw.algbw, schema.COLLECTIVE_BUSBW: bw.busbw}


def bandwidth_attributes(op: str, nbytes: int, group_size: int, duration_ns: int) -> dict[str, Any]:
    """The span attributes of one call's bandwidth (empty when it has none)."""
    return attributes_of(bandwidth(op, nbytes, group_size, duration_ns))


def format_rate(bytes_per_s: float) -> str:
    """`12.3 GB/s` (decimal units, as NCCL-tests prints GB/s)."""
    for unit, scale in (("TB/s", 1e12), ("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if bytes_per_s >= scale:
            return f"{bytes_per_s / scale:.3g} {unit}"
    return f"{bytes_per_s:.3g} B/s"
