"""One collective as one rank issued it: what `hp-otel ranks` lines up across ranks."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hp_otel.spans.schema import OUTSIDE_FQN

# Ops whose shapes legitimately differ between ranks (uneven splits, point to point).
SHAPE_FREE_OPS = frozenset({"all_to_all", "send", "recv", "gather", "scatter"})
P2P_OPS = frozenset({"send", "recv"})
# The module of a collective whose file cannot say (a Flight Recorder entry): not "outside every module".
UNKNOWN_MODULE = "(unknown)"


def module_where(module: str) -> str:
    """Where a report says a collective was issued: Module(fqn); outside every module, OUTSIDE_FQN, the
    one name for it everywhere (the module counts' key, the table, `hp-otel ranks`, `hp-otel diff`)."""
    if module == UNKNOWN_MODULE:
        return "an unknown module"
    return f"Module({module})" if module else OUTSIDE_FQN


def signature(
    op: str, input_shape: tuple[int, ...], output_shape: tuple[int, ...], dtype: str, reduce_op: str
) -> tuple[Any, ...]:
    """What must be equal on every rank of the group for one collective."""
    shown = "send/recv" if op in P2P_OPS else op
    if op in SHAPE_FREE_OPS:
        return (shown, dtype, reduce_op)
    return (shown, input_shape, output_shape, dtype, reduce_op)


@dataclass(frozen=True)
class RankCall:
    """One collective as one rank issued it."""

    rank: int
    window: str
    group: str
    group_ranks: tuple[int, ...]
    seq: int
    op: str
    name: str
    input_shape: tuple[int, ...]
    output_shape: tuple[int, ...]
    dtype: str
    reduce_op: str
    module: str
    phase: str
    start_ns: int
    end_ns: int
    in_flight: bool
    bytes: int = 0  # what it moved (its inputs' bytes, hp_otel.collective.input.size); 0 where the file says none
    stack: tuple[str, ...] = ()  # where it was issued (`stack=`, a Flight Recorder dump's frames), innermost first
    # NCCL-tests' bandwidths of this rank's call, bytes/s (0.0: none recorded: in flight, a barrier, older files)
    algbw: float = 0.0
    busbw: float = 0.0

    def signature(self) -> tuple[Any, ...]:
        """What must be equal on every rank of the group."""
        return signature(self.op, self.input_shape, self.output_shape, self.dtype, self.reduce_op)

    def where(self) -> str:
        return module_where(self.module)

    def describe(self) -> str:
        shapes = f"input {_shape(self.input_shape)} output {_shape(self.output_shape)}"
        reduce = f" {self.reduce_op}" if self.reduce_op else ""
        state = " (in flight)" if self.in_flight else ""
        at = f" at {self.stack[0]}" if self.stack else ""
        phase = f" [{self.phase}]" if self.phase else ""  # a Flight Recorder entry has none
        return f"{self.op} {shapes} {self.dtype}{reduce} in {self.where()}{phase}{state}{at}"

    def to_json(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "seq": self.seq,
            "op": self.op,
            "name": self.name,
            "input_shape": list(self.input_shape),
            "output_shape": list(self.output_shape),
            "dtype": self.dtype,
            "reduce_op": self.reduce_op,
            "module": self.module or OUTSIDE_FQN,
            "phase": self.phase,
            "start_ns": self.start_ns,
            "in_flight": self.in_flight,
            **({"stack": list(self.stack)} if self.stack else {}),
        }


def _shape(shape: Sequence[int]) -> str:
    return "(" + ", ".join(map(str, shape)) + ")"
