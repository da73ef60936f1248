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


def _outside_every_call(spans: Any) -> tuple[Counter[str], set[str]]:
    """The collectives under no module span, and the modules of the top-level module spans."""
    outside: Counter[str] = Counter()
    tops: set[str] = set()

    def visit(record: CallRecord, inside: bool) -> None:
        if record.kind == schema.KIND_MODULE:
            if not inside:
                tops.add(record.fqn)
            inside = True
        elif record.kind == schema.KIND_COLLECTIVE and not inside:
            outside[record.collective.name] += 1
        for child in record.children:
            visit(child, inside)

    for root in build_call_tree(spans):
        visit(root, False)
    return outside, tops


def assert_counts_add_up(mode: Any) -> None:
    """Every module's counts, summed over phases, are the collectives inside its calls; those outside
    every call are the pseudo-module "(outside)"'s; the root's are all the others when every call is
    inside the root's (the invariant of docs/attribution.md; a pipeline stage's window runs calls of
    stage modules, never the root)."""
    summed: dict[str, Counter[str]] = defaultdict(Counter)
    for fqn, phases in mode.get_comm_module_counts().items():
        for counts in phases.values():
            summed[fqn].update(counts)
    outside_counted = summed.pop(schema.OUTSIDE_FQN, Counter())
    spans = mode.get_finished_spans()
    inside = collectives_inside_calls(spans)
    assert dict(summed) == inside, (dict(summed), inside)
    outside, tops = _outside_every_call(spans)
    assert outside_counted == outside, (outside_counted, outside)  # what no call holds is "(outside)"'s
    # every collective of the window is inside one top-level call (the root's, for a model's step) or none
    in_calls = sum((inside.get(fqn, Counter()) for fqn in tops), Counter())
    assert in_calls + outside == Counter(mode.get_comm_counts()), (in_calls, outside, mode.get_comm_counts())
