"""Module counts read back from the span tree: the truth `get_comm_module_counts()` must agree with.

A collective counts for module M in phase P when one of its ancestor spans is a module span
of M in phase P (a recompute nested in a backward span counts for that module too, in phase
recompute: no backward work of it, but inside its call);
one of phase "outside" (under no module span) counts for the pseudo-module "(outside)".
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from hp_otel.spans import schema
from hp_otel.spans.call_tree import CallRecord, build_call_tree


def module_counts_from_spans(spans: Any) -> dict[str, dict[str, dict[str, int]]]:
    counts: dict[str, dict[str, Counter[str]]] = defaultdict(lambda: defaultdict(Counter))

    def visit(record: CallRecord, ancestors: tuple[tuple[str, str], ...]) -> None:
        if record.kind == schema.KIND_MODULE:
            ancestors = (*ancestors, (record.fqn, record.phase))
        elif record.kind == schema.KIND_COLLECTIVE:
            name = record.collective.name
            if record.phase == schema.PHASE_OUTSIDE:  # under no module span: the pseudo-module's
                assert not ancestors, ancestors
                counts[schema.OUTSIDE_FQN][record.phase][name] += 1
            # a recompute also counts for the backward spans holding it (in phase recompute)
            phases = {record.phase, schema.PHASE_BACKWARD} if record.phase == schema.PHASE_RECOMPUTE else {record.phase}
            for fqn in {f for f, p in ancestors if p in phases}:
                counts[fqn][record.phase][name] += 1
        for child in record.children:
            visit(child, ancestors)

    for root in build_call_tree(spans):
        visit(root, ())
    return {fqn: {p: dict(c) for p, c in phases.items()} for fqn, phases in counts.items()}


def collectives_inside_calls(spans: Any) -> dict[str, Counter[str]]:
    """For each module, the collectives whose spans lie inside one of its call spans (any phase)."""
    inside: dict[str, Counter[str]] = defaultdict(Counter)

    def visit(record: CallRecord, ancestors: frozenset[str]) -> None:
        if record.kind == schema.KIND_MODULE:
            ancestors = ancestors | {record.fqn}
        elif record.kind == schema.KIND_COLLECTIVE:
            for fqn in ancestors:
                inside[fqn][record.collective.name] += 1
        for child in record.children:
            visit(child, ancestors)

    for root in build_call_tree(spans):
        visit(root, frozenset())
    return dict(inside)


def assert_counts_add_up(mode: Any) -> None:
    """Every module's counts, summed over phases, are the collectives inside its calls; the root's
    are the window's (the invariant of docs/attribution.md)."""
    summed: dict[str, Counter[str]] = defaultdict(Counter)
    for fqn, phases in mode.get_comm_module_counts().items():
        if fqn != schema.OUTSIDE_FQN:  # outside every call: a pseudo-module with no span
            for counts in phases.values():
                summed[fqn].update(counts)
    inside = collectives_inside_calls(mode.get_finished_spans())
    assert dict(summed) == inside, (dict(summed), inside)
    assert dict(summed[schema.ROOT_MODULE_FQN]) == mode.get_comm_counts(), (
        summed[schema.ROOT_MODULE_FQN],
        mode.get_comm_counts(),
    )
