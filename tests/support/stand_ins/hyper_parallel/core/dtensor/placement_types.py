"""Placements: `Shard(dim=0)` (str `S(0)`), `Replicate()` (str `R`), `Partial(reduce_op='sum')` (str `P`)."""

from __future__ import annotations

from dataclasses import dataclass


class Placement:
    pass


@dataclass(frozen=True)
class Shard(Placement):
    dim: int = 0

    def __str__(self) -> str:
        return f"S({self.dim})"


@dataclass(frozen=True)
class Replicate(Placement):
    def __str__(self) -> str:
        return "R"


@dataclass(frozen=True)
class Partial(Placement):
    reduce_op: str = "sum"

    def __str__(self) -> str:
        return "P"
