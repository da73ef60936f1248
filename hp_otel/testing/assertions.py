"""Assertions for your own tests on hp_otel's spans and counts, with readable failures.

They take a `CommDebugMode`, an `InMemorySpanExporter`, or any sequence of finished
spans (e.g. what your exporter collected), so the same assertion works on the mode's
local store and on what reached your tracer provider.  The pytest plugin
(`hp_otel.testing.pytest_plugin`, loaded automatically) gives fixtures that wire them up.
"""

from __future__ import annotations

import difflib
import textwrap
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan

from hp_otel.spans import schema
from hp_otel.spans.call_tree import CallRecord, build_call_tree, count_collectives


def _spans(source: Any, argument: str = "source") -> tuple[ReadableSpan, ...]:
    """Finished spans of a CommDebugMode, an exporter with `get_finished_spans()`, or a span sequence."""
    getter = getattr(source, "get_finished_spans", None)
    if callable(getter):
        return tuple(getter())
    if isinstance(source, (str, bytes)) or not isinstance(source, Iterable):
        raise TypeError(
            f"{argument} must be a CommDebugMode, an InMemorySpanExporter or a sequence of finished spans, "
            f"got {type(source).__name__}"
        )
    spans = tuple(source)
    for span in spans:
        if not isinstance(span, ReadableSpan):
            raise TypeError(f"{argument} must hold finished spans (ReadableSpan), found {type(span).__name__}")
    return spans


def _check_kinds(kinds: Any) -> frozenset[str]:
    if kinds is None:
        return frozenset(schema.CALL_KINDS)
    if isinstance(kinds, str) or not isinstance(kinds, Iterable):
        raise TypeError(f"kinds must be a collection of {', '.join(schema.CALL_KINDS)} or None, got {kinds!r}")
    chosen = frozenset(kinds)
    unknown = sorted(chosen - set(schema.CALL_KINDS))
    if unknown:
        raise ValueError(f"kinds: unknown {unknown}; allowed: {', '.join(schema.CALL_KINDS)}")
    return chosen


def _check_phase(phase: Any) -> None:
    if phase is not None and phase not in schema.PHASES:
        raise ValueError(f"phase must be {', '.join(map(repr, schema.PHASES))} or None, got {phase!r}")


def collective_counts(source: Any, normalized: bool = False) -> dict[str, int]:
    """Collective counts of a mode (exact) or read back from spans (by framework name, or normalised op)."""
    if not isinstance(normalized, bool):
        raise TypeError(f"normalized must be True or False, got {normalized!r}")
    counter = getattr(source, "get_comm_counts", None)
    if callable(counter):
        return dict(counter(normalized=normalized))
    return count_collectives(_spans(source), normalized)


def assert_collective_counts(
    source: Any, expected: Mapping[str, int], *, normalized: bool = False, exact: bool = True
) -> None:
    """Assert the collective counts; the failure lists every name whose count differs.

    `expected` maps names to counts (`{"all_reduce": 2}` with `normalized=True`).  With
    `exact=False`, names not in `expected` may appear with any count.
    """
    __tracebackhide__ = True  # pytest shows the caller's line, not this helper's
    if not isinstance(expected, Mapping) or not all(
        isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 0 for k, v in expected.items()
    ):
        raise TypeError(f"expected must map collective names (str) to counts (int >= 0), got {expected!r}")
    actual = collective_counts(source, normalized=normalized)
    names = sorted(set(expected) | (set(actual) if exact else set()))
    wrong = [(n, expected.get(n, 0), actual.get(n, 0)) for n in names if expected.get(n, 0) != actual.get(n, 0)]
    if wrong:
        width = max(len(n) for n, _, _ in wrong)
        lines = [f"  {n:<{width}}  expected {e}, got {a}" for n, e, a in wrong]
        kind = "normalised op" if normalized else "framework name"
        recorded = dict(sorted(actual.items()))
        body = "\n".join(lines)
        raise AssertionError(f"collective counts (by {kind}) differ:\n{body}\nall recorded: {recorded}")


def _label(record: CallRecord) -> str:
    if record.kind == schema.KIND_MODULE and record.phase != schema.PHASE_FORWARD:
        # the span's name says its phase too ("fc1 backward", schema.md): the tree says it once, in brackets
        return f"{record.name.removesuffix(' ' + record.phase)} [{record.phase}]"
    return record.name


def _outline_lines(records: Iterable[CallRecord], kinds: frozenset[str], phase: str | None, depth: int) -> list[str]:
    lines: list[str] = []
    for record in records:
        keep = record.kind in kinds and (phase is None or record.phase == phase)
        if keep:
            lines.append("  " * depth + _label(record))
        lines.extend(_outline_lines(record.children, kinds, phase, depth + 1 if keep else depth))
    return lines


def span_outline(source: Any, *, kinds: Iterable[str] | None = None, phase: str | None = None) -> str:
    """The span tree as an indented outline of span names (two spaces a level).

    The names are the spans': the root module by its class (`MLP`), every other module by its
    full path from the root (`layers.0.attention.wq`, not `wq`), a DTensor op by its name
    (`linear`), a redistribute as `redistribute`, a collective by its normalised op
    (`all_reduce`).  Backward module spans read `fc1 [backward]`.  `kinds` keeps only some call kinds
    (module, op, collective, redistribute); `phase` only forward or backward spans.  A
    dropped node's children move up to its level.
    """
    chosen = _check_kinds(kinds)
    _check_phase(phase)
    return "\n".join(_outline_lines(build_call_tree(_spans(source)), chosen, phase, 0))


def assert_span_tree(
    source: Any, expected: str, *, kinds: Iterable[str] | None = None, phase: str | None = None
) -> None:
    """Assert the span tree's shape, written as an indented outline (see `span_outline`).

    The failure shows a diff of the expected and the actual outline.
    """
    __tracebackhide__ = True  # pytest shows the caller's line, not this helper's
    if not isinstance(expected, str):
        raise TypeError(f"expected must be an indented outline (str), got {type(expected).__name__}")
    want = "\n".join(line.rstrip() for line in textwrap.dedent(expected).strip("\n").splitlines() if line.strip())
    got = span_outline(source, kinds=kinds, phase=phase)
    if want != got:
        diff = "\n".join(
            difflib.unified_diff(want.splitlines(), got.splitlines(), "expected", "actual", lineterm="", n=2)
        )
        raise AssertionError(f"span tree differs:\n{diff}\nactual tree:\n{got or '(empty)'}")


def assert_no_callback_errors(mode: Any) -> None:
    """Assert that hp_otel's own hooks never failed in this mode's windows."""
    __tracebackhide__ = True  # pytest shows the caller's line, not this helper's
    getter = getattr(mode, "get_callback_error_counts", None)
    if not callable(getter):
        raise TypeError(f"mode must be a CommDebugMode, got {type(mode).__name__}")
    errors = getter()
    if errors:
        raise AssertionError(f"hp_otel callbacks failed (where: count): {errors}; see the 'hp_otel' logger")


def spans_named(source: Any, name: str) -> Sequence[ReadableSpan]:
    """The finished spans with this name, in the order they ended."""
    return [span for span in _spans(source) if span.name == name]


def metric_points(reader: Any, name: str) -> list[Any]:
    """The data points of metric `name` (e.g. `hp_otel.collective.calls`) that a metric reader collects now.

    `reader` is an SDK `InMemoryMetricReader` (the plugin's `hp_metric_reader`, or
    `CommDebugMode.get_metric_reader()` with the default providers).
    """
    if not hasattr(reader, "get_metrics_data"):
        raise TypeError(f"reader must be an InMemoryMetricReader, got {type(reader).__name__}")
    data = reader.get_metrics_data()
    if data is None:
        return []
    return [
        point
        for resource_metrics in data.resource_metrics
        for scope_metrics in resource_metrics.scope_metrics
        for metric in scope_metrics.metrics
        if metric.name == name
        for point in metric.data.data_points
    ]
