"""The call tree read back from finished spans: what every renderer walks.

Renderers know spans only through this tree and `hp_otel.codec`, so a table can be
rebuilt from spans saved to a file or pulled from a trace backend.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import StatusCode

from hp_otel import codec
from hp_otel import schema as s
from hp_otel.infos import CollectiveInfo, ParameterInfo, TensorInfo


@dataclass(slots=True)
class CallRecord:
    """One node of the call tree, read back from a finished span."""

    kind: str
    name: str
    attributes: Mapping[str, Any]
    start_ns: int
    end_ns: int
    error: str | None = None
    children: list[CallRecord] = field(default_factory=list)

    @property
    def phase(self) -> str:
        return str(self.attributes.get(s.PHASE, s.PHASE_FORWARD))

    @property
    def fqn(self) -> str:
        return str(self.attributes.get(s.MODULE_FQN, ""))

    @property
    def module_type(self) -> str:
        return str(self.attributes.get(s.MODULE_TYPE, ""))

    @property
    def op_name(self) -> str:
        return str(self.attributes.get(s.OP_NAME, self.name))

    @property
    def inputs(self) -> list[TensorInfo]:
        return codec.decode_tensor_infos(self.attributes, "input")

    @property
    def outputs(self) -> list[TensorInfo]:
        return codec.decode_tensor_infos(self.attributes, "output")

    @property
    def collective(self) -> CollectiveInfo:
        return codec.decode_collective(self.attributes, self.name)

    @property
    def parameters(self) -> list[ParameterInfo]:
        return codec.decode_parameters(self.attributes)

    @property
    def duration_ns(self) -> int:
        return max(self.end_ns - self.start_ns, 0)

    def walk(self) -> Iterable[CallRecord]:
        yield self
        for child in self.children:
            yield from child.walk()


def span_attributes(span: ReadableSpan) -> Mapping[str, Any]:
    """The span's attributes as a plain dict where the SDK keeps one (read-only use).

    `span.attributes` wraps them in a new mapping proxy over a lock-guarded mapping on
    every access; reading 100 000 spans that way costs more than rendering them.
    """
    raw = getattr(span, "_attributes", None)
    inner = getattr(raw, "_dict", None)  # the SDK's BoundedAttributes
    if isinstance(inner, dict):
        return inner
    if isinstance(raw, dict):  # a ReadableSpan built from a file
        return raw
    return span.attributes or {}


def _record_from_span(span: ReadableSpan, attrs: Mapping[str, Any]) -> CallRecord:
    status = span.status
    error = (status.description or "error") if status is not None and status.status_code is StatusCode.ERROR else None
    return CallRecord(
        kind=str(attrs.get(s.CALL_KIND, "")),
        name=span.name,
        attributes=attrs,
        start_ns=span.start_time or 0,
        end_ns=span.end_time or 0,
        error=error,
    )


def build_call_tree(spans: Iterable[ReadableSpan]) -> list[CallRecord]:
    """Rebuild the call tree from spans in any order (exporters deliver children first).

    Spans that are not hp_otel calls are skipped; a span whose parent is missing (not
    hp_otel's, dropped by the retention cap, or never exported) becomes a root.
    Siblings are ordered by start time.
    """
    nodes: dict[int, CallRecord] = {}
    links: list[tuple[CallRecord, int | None]] = []
    kinds = s.CALL_KINDS
    for span in spans:
        attrs = span_attributes(span)
        context = span.context
        if attrs.get(s.CALL_KIND) not in kinds or context is None:
            continue
        record = nodes[context.span_id] = _record_from_span(span, attrs)
        parent = span.parent
        links.append((record, parent.span_id if parent is not None else None))
    roots: list[CallRecord] = []
    get = nodes.get
    for record, parent_id in links:
        parent = get(parent_id) if parent_id is not None else None
        (parent.children if parent is not None and parent is not record else roots).append(record)
    key = _start_time  # stable sort keeps export order on ties
    for node in nodes.values():
        if len(node.children) > 1:
            node.children.sort(key=key)
    roots.sort(key=key)
    return roots


def _start_time(record: CallRecord) -> int:
    return record.start_ns


def count_collectives(spans: Iterable[ReadableSpan], normalized: bool = False) -> dict[str, int]:
    """Collective counts read back from spans, by framework name or normalised op (exact while none was dropped)."""
    key = s.COLLECTIVE_OP if normalized else s.COLLECTIVE_NAME
    counts: dict[str, int] = {}
    for span in spans:
        attrs = span_attributes(span)
        if attrs.get(s.CALL_KIND) == s.KIND_COLLECTIVE:
            name = str(attrs.get(key, span.name))
            counts[name] = counts.get(name, 0) + 1
    return counts
