"""Spans files of several ranks, grouped by rank and cut down to one step: what the pictures draw.

The rank is the resource's `hp_otel.rank` (every file hp_otel writes has it under a
launcher), else the file's position on the command line. A step is the trace that
`hp_otel.step(n)` gave it (its `rank_step` spans carry `hp_otel.step`); files without step
spans (one CommDebugMode window each, as the demo writes) are one step already.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan

from hp_otel.spans import schema
from hp_otel.spans.call_tree import span_attributes
from hp_otel.spans.otlp_json import SpanFileError, read_spans


def load_rank_spans(
    paths: Sequence[str | os.PathLike[str]], step: str | None = None, every_step: bool = False
) -> dict[int, list[ReadableSpan]]:
    """{rank: spans of that rank in the chosen step (or in every step)}; SpanFileError names what is wrong."""
    by_rank: dict[int, list[ReadableSpan]] = {}
    for position, path in enumerate(paths):
        for span in read_spans(path):
            rank = span.resource.attributes.get(schema.RESOURCE_RANK) if span.resource else None
            key = int(rank) if isinstance(rank, (int, str)) and str(rank).isdigit() else position
            by_rank.setdefault(key, []).append(span)
    if not any(by_rank.values()):
        raise SpanFileError(f"no spans in {', '.join(map(os.fspath, paths))}")
    steps = _steps(by_rank)
    if every_step or not steps:
        if step is not None and not every_step:
            raise SpanFileError(f"--step {step}: these files have no step spans (hp_otel.step), they hold one window")
        return dict(sorted(by_rank.items()))
    chosen = step if step is not None else list(steps)[-1]
    if chosen not in steps:
        raise SpanFileError(f"--step {chosen}: no such step; the files hold steps {', '.join(steps)}")
    traces = steps[chosen]
    return {rank: [sp for sp in spans if sp.context.trace_id in traces] for rank, spans in sorted(by_rank.items())}


def _steps(by_rank: dict[int, list[ReadableSpan]]) -> dict[str, set[int]]:
    """{step as text: its trace ids}, in the order the steps started."""
    found: dict[str, tuple[int, set[int]]] = {}
    for spans in by_rank.values():
        for span in spans:
            attrs = span_attributes(span)
            if not schema.is_rank_step_span(span.name, attrs):
                continue
            step = str(attrs.get(schema.STEP))
            start, traces = found.get(step, (span.start_time or 0, set()))
            traces.add(span.context.trace_id)
            found[step] = (min(start, span.start_time or 0), traces)
    return {step: traces for step, (_, traces) in sorted(found.items(), key=lambda item: item[1][0])}
