"""Module counts read back from the span tree: the truth `get_comm_module_counts()` must agree with.

A collective counts for module M in phase P when one of its ancestor spans is a module span
of M in phase P (a recompute nested in a backward span is no backward work of that module);
one of phase "outside" (under no module span) counts for the pseudo-module "(outside)".
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from hp_otel.spans import schema as s
from hp_otel.spans.call_tree import CallRecord, build_call_tree


def module_counts_from_spans(spans: Any) -> dict[str, dict[str, dict[str, int]]]:
    counts: dict[str, dict[str, Counter[str]]] = defaultdict(lambda: defaultdict(Counter))

    def visit(record: CallRecord, ancestors: tuple[tuple[str, str], ...]) -> None:
        if record.kind == s.KIND_MODULE:
            ancestors = (*ancestors, (record.fqn, record.phase))
        elif record.kind == s.KIND_COLLECTIVE:
            name = record.collective.name
            if record.phase == s.PHASE_OUTSIDE:  # under no module span: the pseudo-module's
                assert not ancestors, ancestors
                counts[s.OUTSIDE_FQN][record.phase][name] += 1
            for fqn in {f for f, p in ancestors if p == record.phase}:
                counts[fqn][record.phase][name] += 1
        for child in record.children:
            visit(child, ancestors)

    for root in build_call_tree(spans):
        visit(root, ())
    return {fqn: {p: dict(c) for p, c in phases.items()} for fqn, phases in counts.items()}
