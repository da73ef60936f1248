"""Per-event costs: what a variant adds per module call, per collective and per window.

A variant adds to untraced's step about `a * module_calls + b * collectives + c` (one window
a step): hp_otel's work is per event, not per flop. Runs of one model that differ in layers
(more module calls and collectives) and in TP (without TP: no collective) give one such
equation each; `solve_events` solves them, exactly from three independent runs, by least
squares from more (then the largest residual says how well the model fits). Runs that only
differ in layers cannot tell a module call from a collective (both grow with the layers, in
a fixed proportion): it says so instead of guessing.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

UNKNOWNS = ("module call", "collective", "window")


@dataclass(frozen=True)
class Run:
    """One workload's figures for one variant: what it adds per step, and its events per step."""

    workload: str
    module_calls: int
    collectives: int
    added: float  # the variant's per-step figure minus untraced's (instructions or µs)


@dataclass(frozen=True)
class EventCosts:
    """The solved cost of each event; `method` says how ("exact" or "least squares")."""

    per_module_call: float
    per_collective: float
    per_window: float
    method: str
    runs: int
    max_residual: float  # 0 for an exact solve


class Unsolvable(ValueError):
    """Fewer than three runs, or runs that do not tell the events apart: the message says which."""


def solve_events(runs: Sequence[Run]) -> EventCosts:
    """Solve `added = a * module_calls + b * collectives + c` for (a, b, c) over `runs`.

    Three runs: Gaussian elimination on them; more: the normal equations (least squares).
    Raises Unsolvable when the runs leave an unknown undetermined.
    """
    if len(runs) < len(UNKNOWNS):
        raise Unsolvable(f"need at least 3 runs (different layers, with and without TP), got {len(runs)}")
    rows = [[float(r.module_calls), float(r.collectives), 1.0] for r in runs]
    values = [float(r.added) for r in runs]
    if len(runs) == len(UNKNOWNS):
        matrix, rhs, method = rows, values, "exact"
    else:  # AᵀA x = Aᵀy
        matrix = [[sum(row[i] * row[j] for row in rows) for j in range(3)] for i in range(3)]
        rhs = [sum(row[i] * y for row, y in zip(rows, values, strict=True)) for i in range(3)]
        method = "least squares"
    solution = _gauss(matrix, rhs)
    if solution is None:
        raise Unsolvable(_why_singular(runs))
    a, b, c = solution
    residual = max(abs(a * r[0] + b * r[1] + c - y) for r, y in zip(rows, values, strict=True))
    return EventCosts(a, b, c, method, len(runs), 0.0 if method == "exact" else residual)


def _gauss(matrix: list[list[float]], rhs: list[float]) -> list[float] | None:
    """The solution of a 3x3 system by elimination with partial pivoting; None when singular."""
    n = len(rhs)
    m = [[*row, value] for row, value in zip(matrix, rhs, strict=True)]
    scale = max((abs(x) for row in matrix for x in row), default=0.0) or 1.0
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) <= 1e-12 * scale:
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(n):
            if r != col:
                factor = m[r][col] / m[col][col]
                m[r] = [x - factor * p for x, p in zip(m[r], m[col], strict=True)]
    return [m[i][n] / m[i][i] for i in range(n)]


def _why_singular(runs: Sequence[Run]) -> str:
    if len({r.collectives > 0 for r in runs}) == 1:
        return "the runs cannot tell a module call from a collective: add a run without TP (no collectives)"
    return "the runs cannot tell the events apart: add runs with other layer counts"


def format_events(variant: str, costs: EventCosts | str, unit: str) -> str:
    """One table line: a variant's cost per module call, per collective and per window (or why none)."""
    if isinstance(costs, str):
        return f"{variant:<34}{costs}"
    if unit == "Ir":
        return (
            f"{variant:<34}{costs.per_module_call / 1e3:>12.1f}{costs.per_collective / 1e3:>13.1f}"
            f"{costs.per_window / 1e6:>12.3f}"
        )
    return f"{variant:<34}{costs.per_module_call:>12.2f}{costs.per_collective:>13.2f}{costs.per_window:>12.1f}"


def events_header(unit: str) -> str:
    if unit == "Ir":
        return f"{'variant':<34}{'kIr/module':>12}{'kIr/collect.':>13}{'MIr/window':>12}"
    return f"{'variant':<34}{'µs/module':>12}{'µs/collect.':>13}{'µs/window':>12}"


def describe(costs: Iterator[EventCosts] | Sequence[EventCosts]) -> str:
    """How the figures were solved, for the line under the table."""
    seen = list(costs)
    if not seen:
        return ""
    first = seen[0]
    how = "exactly from 3 runs" if first.method == "exact" else f"by least squares from {first.runs} runs"
    return f"solved {how} of added = a·module calls + b·collectives + c·window"
