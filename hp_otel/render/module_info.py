"""Parameter and sharding info of the modules that ran, from their forward spans."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from hp_otel.spans import schema
from hp_otel.spans.call_tree import CallRecord


def parameter_info(roots: Iterable[CallRecord]) -> dict[str, dict[str, dict[str, Any]]]:
    """`{module fqn: {param name: {shape, dtype, placements}}}` from module span attributes."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for record in _forward_modules(roots):
        params = out.setdefault(record.fqn, {})
        for p in record.parameters:
            params[p.name] = {"shape": list(p.shape), "dtype": p.dtype, "placements": p.placements}
    return {fqn: params for fqn, params in out.items() if params}


def sharding_info(parameters: dict[str, dict[str, dict[str, Any]]]) -> dict[str, str]:
    """`{"fc2.weight": "Shard(dim=1)"}` for DTensor parameters, from a `parameter_info` result."""
    flat: dict[str, str] = {}
    for fqn, params in parameters.items():
        prefix = "" if fqn == schema.ROOT_MODULE_FQN else fqn + "."
        for name, info in params.items():
            if info["placements"]:
                flat[prefix + name] = info["placements"]
    return flat


def _forward_modules(roots: Iterable[CallRecord]) -> Iterator[CallRecord]:
    for root in roots:
        for record in root.walk():
            if record.kind == schema.KIND_MODULE and record.phase == schema.PHASE_FORWARD:
                yield record
