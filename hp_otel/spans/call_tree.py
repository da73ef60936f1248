"""The call tree read back from finished spans: what every renderer walks.

Renderers know spans only through this tree and `hp_otel.spans.codec`, so a table can be
rebuilt from spans saved to a file or pulled from a trace backend.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import StatusCode

from hp_otel.common._otel_compat import span_attribute_dict as _attribute_dict
from hp_otel.spans import codec, schema
from hp_otel.spans.groups import Group, GroupTable
from hp_otel.spans.infos import CollectiveInfo, ParameterInfo, TensorInfo


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
    groups: GroupTable | None = None  # collectives: the groups the spans read with this one describe

    @property
    def group(self) -> Group:
        """A collective's process group (name, members, mesh dimension), from the groups its spans describe."""
        return (self.groups or GroupTable()).group_of(self.attributes)

    @property
    def phase(self) -> str:
        return str(self.attributes.get(schema.PHASE, schema.PHASE_FORWARD))

    @property
    def fqn(self) -> str:
        return str(self.attributes.get(schema.MODULE_FQN, ""))

    @property
    def module_type(self) -> str:
        return str(self.attributes.get(schema.MODULE_TYPE, ""))

    @property
    def op_name(self) -> str:
        return str(self.attributes.get(schema.OP_NAME, self.name))

    @property
    def inputs(self) -> list[TensorInfo]:
        return codec.decode_tensor_infos(self.attributes, "input")

    @property
    def outputs(self) -> list[TensorInfo]:
        return codec.decode_tensor_infos(self.attributes, "output")

    @property
    def collective(self) -> CollectiveInfo:
        return codec.decode_collective(self.attributes, self.name, self.groups)

    @property
    def parameters(self) -> list[ParameterInfo]:
        return codec.decode_parameters(self.attributes)

    @property
    def duration_ns(self) -> int:
        return max(self.end_ns - self.start_ns, 0)

    def walk(self) -> Iterable[CallRecord]:
        """This record and everything below it, depth first (iterative: a tree may be deeper than Python's stack)."""
        stack = [self]
        while stack:
            record = stack.pop()
            yield record
            stack.extend(reversed(record.children))


def span_attributes(span: ReadableSpan) -> Mapping[str, Any]:
    """The span's attributes as a plain dict where the SDK keeps one (read-only use).

    `span.attributes` wraps them in a new mapping proxy over a lock-guarded mapping on
    every access; reading 100 000 spans that way costs more than rendering them.
    """
    attrs = _attribute_dict(span)
    if attrs is not None:
        return attrs
    return span.attributes or {}


def _record_from_span(span: ReadableSpan, attrs: Mapping[str, Any]) -> CallRecord:
    status = span.status
    error = (status.description or "error") if status is not None and status.status_code is StatusCode.ERROR else None
    return CallRecord(
        kind=str(attrs.get(schema.CALL_KIND, "")),
        name=span.name,
        attributes=attrs,
        start_ns=span.start_time or 0,
        end_ns=span.end_time or 0,
        error=error,
    )


def build_call_tree(spans: Iterable[ReadableSpan], problems: list[str] | None = None) -> list[CallRecord]:
    """Rebuild the call tree from spans in any order (exporters deliver children first).

    Spans that are not hp_otel calls are skipped; a span whose parent is missing (not
    hp_otel's, dropped by the retention cap, or never exported) becomes a root.
    Siblings are ordered by start time. Every span read stays in the tree, also from a
    damaged file: spans that share a span id are all kept (children go to the first),
    and spans whose parents form a cycle become roots; each such finding is appended
    to `problems` (when given) as one line, so a table can say why it looks odd.
    """
    nodes: dict[int, CallRecord] = {}
    links: list[tuple[CallRecord, int | None]] = []
    kinds = schema.CALL_KINDS
    duplicates = 0
    table = GroupTable()  # each group is described on one of its spans: every collective record resolves by it
    for span in spans:
        attrs = span_attributes(span)
        context = span.context
        if attrs.get(schema.CALL_KIND) not in kinds or context is None:
            continue
        record = _record_from_span(span, attrs)
        if record.kind == schema.KIND_COLLECTIVE:
            table.note(attrs)
            record.groups = table
        if context.span_id in nodes:
            duplicates += 1
        else:
            nodes[context.span_id] = record
        parent = span.parent
        links.append((record, parent.span_id if parent is not None else None))
    roots: list[CallRecord] = []
    get = nodes.get
    for record, parent_id in links:
        parent = get(parent_id) if parent_id is not None else None
        (parent.children if parent is not None and parent is not record else roots).append(record)
    cycles = _break_cycles(roots, links)
    key = _start_time  # stable sort keeps export order on ties
    for record, _ in links:
        if len(record.children) > 1:
            record.children.sort(key=key)
    roots.sort(key=key)
    if problems is not None:
        if duplicates:
            problems.append(f"{duplicates} span(s) reuse another span's id; all are shown, children under the first")
        if cycles:
            problems.append(f"{cycles} parent cycle(s) (a span its own ancestor) cut; the span cut is shown as a root")
    return roots


def _break_cycles(roots: list[CallRecord], links: list[tuple[CallRecord, int | None]]) -> int:
    """Make roots of the records no root reaches (their parents form a cycle); returns how many were cut."""
    reached: set[int] = set()
    stack = list(roots)
    while stack:
        record = stack.pop()
        if id(record) not in reached:
            reached.add(id(record))
            stack.extend(record.children)
    if len(reached) == len(links):
        return 0
    parent_of = {id(child): record for record, _ in links for child in record.children}
    cut = 0
    for record, _ in links:
        if id(record) in reached:
            continue
        # Walk up to the cycle and cut there, so the records hanging below it keep their places.
        seen: set[int] = set()
        node = record
        while id(node) not in seen and id(node) in parent_of and id(parent_of[id(node)]) not in reached:
            seen.add(id(node))
            node = parent_of[id(node)]
        parent = parent_of.get(id(node))
        if parent is not None:
            parent.children.remove(node)
            del parent_of[id(node)]
        roots.append(node)
        cut += 1
        stack = [node]
        while stack:
            below = stack.pop()
            if id(below) not in reached:
                reached.add(id(below))
                stack.extend(below.children)
    return cut


def _decode(record: CallRecord) -> None:
    """Decode what a renderer will read from this record (its kind's attributes)."""
    if record.kind == schema.KIND_COLLECTIVE:
        record.collective  # noqa: B018 - decoding is the check
    elif record.kind == schema.KIND_OP:
        record.inputs  # noqa: B018
        record.outputs  # noqa: B018
    elif record.kind == schema.KIND_MODULE:
        record.parameters  # noqa: B018
    else:
        codec.decode_redistribute(record.attributes)


def check_attribute_types(roots: Iterable[CallRecord]) -> None:
    """Raise ValueError (one line, naming the span and the attribute) if a record cannot be decoded.

    For spans read from a file, which anyone can write: renderers then never meet a
    wrong type half-way through a table.
    """
    for root in roots:
        for record in root.walk():
            try:
                _decode(record)
            except (TypeError, ValueError, AttributeError) as exc:
                key = _culprit(record)
                which = f"attribute {key!r} = {record.attributes[key]!r:.60}" if key else "an attribute"
                raise ValueError(f"span {record.name!r} ({record.kind}): {which} has the wrong type ({exc})") from None


def _culprit(record: CallRecord) -> str | None:
    """The first attribute without which the record decodes."""
    for key in record.attributes:
        trial = CallRecord(record.kind, record.name, {k: v for k, v in record.attributes.items() if k != key}, 0, 0)
        try:
            _decode(trial)
        except (TypeError, ValueError, AttributeError):
            continue
        return key
    return None


def _start_time(record: CallRecord) -> int:
    return record.start_ns


def count_collectives(spans: Iterable[ReadableSpan], normalized: bool = False) -> dict[str, int]:
    """Collective counts read back from spans, by framework name or normalised op (exact while none was dropped)."""
    key = schema.COLLECTIVE_OP if normalized else schema.COLLECTIVE_NAME
    counts: dict[str, int] = {}
    for span in spans:
        attrs = span_attributes(span)
        if attrs.get(schema.CALL_KIND) == schema.KIND_COLLECTIVE:
            name = str(attrs.get(key, span.name))
            counts[name] = counts.get(name, 0) + 1
    return counts
