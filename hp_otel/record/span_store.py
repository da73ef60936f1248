"""The local span store: an in-memory span exporter with a retention cap.

The recorder hands every finished span to it directly (no span processor on the hot
path); tables and JSON are rendered from what it holds.  Past the cap it keeps the
first spans and counts the rest as dropped, so a long window costs bounded memory
while the collective counters stay exact.  Its own list and lock (the SDK's
InMemorySpanExporter keeps them private), with the same interface.

A kept span is stored as one compact record: a tuple of plain values (ids, times, the
attribute names — one tuple shared by every span with the same names — and values; the
spans of one shared encoding, `codec.SharedAttributes`, share its names and values tuples),
not the SDK span with its lock, bounded dict, lists and contexts.  CPython's cyclic
garbage collector stops tracking a tuple of plain values, so 10⁵ kept spans add nothing
to the work of each of its full collections (the SDK span is a couple of dozen tracked
objects), and a record is several times smaller (docs/how-it-works/costs.md has the
figures).  `get_finished_spans()` rebuilds
`ReadableSpan`s from the records, equal field by field to the spans the SDK ended
(`StoredSpan`: the same class hierarchy, compared by content); a shared encoding's spans are
given that encoding as their attributes (read-only behind `ReadableSpan.attributes`' proxy).  A deferred window's span
reaches it as its fields (`keep`, from `readable_spans.DraftSpan`): the same record, no span
object made in between.  A span with anything a
record cannot say exactly (counts of dropped attributes, events or links; a context that
is not a `SpanContext`) is kept as it came.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.trace.span import DEFAULT_TRACE_STATE, TraceState

from hp_otel.common import _otel_compat
from hp_otel.spans import codec

_KINDS = {kind.value: kind for kind in SpanKind}
_CODES = {code.value: code for code in StatusCode}
_FLAGS = {0: TraceFlags(0), 1: TraceFlags(1)}
STATUS_UNSET = Status(StatusCode.UNSET)  # the status of a span nothing set one on (`keep` knows it by identity)
_new_span_context = _otel_compat.new_span_context
_fields = _otel_compat.span_context_fields
_SPAN_IS_ITS_FIELDS = _otel_compat.READABLE_SPAN_IS_ITS_FIELDS
_new_object = object.__new__
_INTERNAL = SpanKind.INTERNAL.value
_MAX_KEY_SETS = 4096  # distinct attribute-name tuples shared between records (a bound on the table)


class _NotCompact(Exception):
    """The span holds something a record would not give back exactly: it is kept as it is."""


def _flags(value: int) -> TraceFlags:
    flags = _FLAGS.get(value)
    return flags if flags is not None else TraceFlags(value)


def _state_items(state: TraceState) -> tuple[tuple[str, str], ...] | None:
    return None if state is DEFAULT_TRACE_STATE or not state else tuple(state.items())


def _state(context: SpanContext) -> tuple[tuple[str, str], ...] | None:
    return _state_items(context.trace_state)


def _trace_state(items: tuple[tuple[str, str], ...] | None) -> TraceState:
    return DEFAULT_TRACE_STATE if items is None else TraceState(list(items))


def _context(trace_id: int, span_id: int, flags: int, remote: bool, state: Any) -> SpanContext:
    trace_flags = _FLAGS[flags] if flags in _FLAGS else TraceFlags(flags)
    trace_state = DEFAULT_TRACE_STATE if state is None else _trace_state(state)
    return _new_span_context(trace_id, span_id, remote, trace_flags, trace_state)


def _check_dropped(dropped: int) -> None:
    if dropped:
        raise _NotCompact


class StoredSpan(ReadableSpan):
    """A `ReadableSpan` rebuilt from a stored record: equal to another rebuilt from the same record."""

    def __eq__(self, other: object) -> bool:
        if type(other) is not StoredSpan:
            return NotImplemented
        return (
            self._hp_record == other._hp_record  # type: ignore[attr-defined]
            and self._resource is other._resource
            and self._instrumentation_scope is other._instrumentation_scope
        )

    def __hash__(self) -> int:
        return hash(self._hp_record[1:3])  # type: ignore[attr-defined]  # (trace id, span id)


class LocalSpanStore(SpanExporter):
    """Keeps at most `max_spans` finished spans, as compact records; counts the ones it turns away."""

    def __init__(self, max_spans: int) -> None:
        self.max_spans = max_spans
        self.dropped_spans = 0
        # True once `max_spans` are kept: every later span is dropped (an attribute, not a property: the
        # span builder asks before each event)
        self.full = max_spans <= 0
        self._spans: list[Any] = []  # records (tuples), or a span kept as it came
        self._lock = threading.Lock()
        self._stopped = False
        # What every span of a tracer shares (resource, scope): kept once, a record holds its index.
        self._origins: list[tuple[Any, Any, Any]] = []
        self._origin_index: dict[tuple[int, int, int], int] = {}
        self._key_sets: dict[tuple[str, ...], tuple[str, ...]] = {}
        self._last_origin: Any = None  # the origin `keep` was last given (one per window), and its index
        self._last_origin_index = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._stopped:
            return SpanExportResult.FAILURE
        with self._lock:
            room = max(self.max_spans - len(self._spans), 0)
            kept = spans if room >= len(spans) else spans[:room]
            self.dropped_spans += len(spans) - len(kept)
            compact = self._compact
            self._spans.extend([compact(span) for span in kept])
            self.full = len(self._spans) >= self.max_spans
        return SpanExportResult.SUCCESS

    def keep(
        self,
        name: str,
        context: SpanContext,
        parent: SpanContext | None,
        status: Status,
        start: int,
        end: int,
        attributes: dict[str, Any],
        events: Sequence[Event] | None,
        links: Sequence[Link] | None,
        origin: tuple[Any, Any, Any],
        split: tuple[tuple[str, ...], tuple[Any, ...]] | None = None,
    ) -> bool:
        """A finished span given by its fields (what `readable_spans.DraftSpan` holds): its record made
        at once, the same `export` makes of its `ReadableSpan`, without making that span first.
        `origin`: (resource, instrumentation scope, instrumentation info); `split`: the attributes as
        (keys, values) tuples when they are a shared encoding (`codec.SharedAttributes`): its records share them.
        False for a span a record would not give back exactly (counts of dropped event or link
        attributes): not kept."""
        if self._stopped:
            return True
        if split is not None:
            keys, values = split
        else:
            keys = tuple(attributes)  # `_attributes`, inline: this runs once a span
            values = tuple(attributes.values())
            known = self._key_sets.get(keys)
            if known is not None:
                keys = known
            elif len(self._key_sets) < _MAX_KEY_SETS:
                self._key_sets[keys] = keys
        trace_id, span_id, _, flags, state = _fields(context)
        if status is STATUS_UNSET:
            code, description = 0, None
        else:
            code, description = status.status_code.value, status.description
        try:
            kept_events = tuple([self._event(event) for event in events]) if events else ()
            kept_links = tuple([self._link(link) for link in links]) if links else ()
        except _NotCompact:
            return False
        if parent is None:
            p_trace = p_span = p_flags = p_remote = p_state = None
        else:
            p_trace, p_span, p_remote, p_flags, p_state = _fields(parent)
            p_flags = int(p_flags)
            p_state = None if p_state is DEFAULT_TRACE_STATE else _state_items(p_state)
        with self._lock:  # the origin table and the spans change together (`clear` resets both)
            if len(self._spans) >= self.max_spans:
                self.dropped_spans += 1
                return True
            if origin is not self._last_origin:
                self._last_origin, self._last_origin_index = origin, self._origin_of(*origin)
            record = (
                name,
                trace_id,
                span_id,
                int(flags),
                False,
                None if state is DEFAULT_TRACE_STATE else _state_items(state),
                p_trace,
                p_span,
                p_flags,
                p_remote,
                p_state,
                _INTERNAL,
                code,
                description,
                start,
                end,
                keys,
                values,
                kept_events,
                kept_links,
                self._last_origin_index,
            )
            self._spans.append(record)
            if len(self._spans) >= self.max_spans:
                self.full = True
        return True

    def __len__(self) -> int:
        """How many spans are kept (no span is rebuilt to say so)."""
        return len(self._spans)

    def count_dropped(self, spans: int) -> None:
        """Spans not even built because they would have been dropped (see `SpanBuilder`)."""
        with self._lock:
            self.dropped_spans += spans

    def get_finished_spans(self) -> tuple[ReadableSpan, ...]:
        """The kept spans in the order they ended, rebuilt as `ReadableSpan`s (new spans each call; the
        spans of one shared encoding, `codec.SharedAttributes`, read that one mapping)."""
        with self._lock:
            records = list(self._spans)
            origins = list(self._origins)
        return _rebuild_all(records, origins)

    def clear(self) -> None:
        with self._lock:
            self._spans = []  # a new list: the old one's memory goes (clear() keeps its capacity)
            self.dropped_spans = 0
            self.full = self.max_spans <= 0
            self._origins = []
            self._origin_index = {}
            self._key_sets = {}
            self._last_origin = None

    def shutdown(self) -> None:
        """Later exports fail, as the SDK's in-memory exporter's do."""
        self._stopped = True

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True

    # --- records ----------------------------------------------------------------
    def _compact(self, span: ReadableSpan) -> Any:
        """The span as a tuple of plain values (untracked by the garbage collector), or the span itself."""
        try:
            return self._record(span)
        except Exception:  # _NotCompact, or a span of another shape: kept exactly as it came
            return span

    def _record(self, span: ReadableSpan) -> tuple[Any, ...]:
        context, parent = span.get_span_context(), span.parent
        if type(context) is not SpanContext or (parent is not None and type(parent) is not SpanContext):
            raise _NotCompact
        _check_dropped(span.dropped_attributes + span.dropped_events + span.dropped_links)
        status = span.status
        attributes = _otel_compat.span_attribute_dict(span)  # the SDK's dict: no Python-level mapping walk
        keys, values = self._attributes(span.attributes if attributes is None else attributes)
        events = tuple(self._event(event) for event in span.events)
        links = tuple(self._link(link) for link in span.links)
        return (
            span.name,
            context.trace_id,
            context.span_id,
            int(context.trace_flags),
            context.is_remote,
            _state(context),
            None if parent is None else parent.trace_id,
            None if parent is None else parent.span_id,
            None if parent is None else int(parent.trace_flags),
            None if parent is None else parent.is_remote,
            None if parent is None else _state(parent),
            span.kind.value,
            status.status_code.value,
            status.description,
            span.start_time,
            span.end_time,
            keys,
            values,
            events,
            links,
            self._origin(span),
        )

    def _attributes(self, attributes: Any) -> tuple[tuple[str, ...], tuple[Any, ...]]:
        if not attributes:
            return (), ()
        keys = tuple(attributes)
        values = tuple(attributes.values())
        shared = self._key_sets.get(keys)
        if shared is None:
            shared = keys
            if len(self._key_sets) < _MAX_KEY_SETS:
                self._key_sets[keys] = keys
        return shared, values

    def _event(self, event: Any) -> tuple[Any, ...]:
        if type(event) is not Event:
            raise _NotCompact
        _check_dropped(event.dropped_attributes)
        return (event.name, event.timestamp, *self._attributes(event.attributes))

    def _link(self, link: Any) -> tuple[Any, ...]:
        context = link.context
        if type(link) is not Link or type(context) is not SpanContext:
            raise _NotCompact
        _check_dropped(link.dropped_attributes)
        return (
            context.trace_id,
            context.span_id,
            int(context.trace_flags),
            context.is_remote,
            _state(context),
            *self._attributes(link.attributes),
        )

    def _origin(self, span: ReadableSpan) -> int:
        return self._origin_of(span.resource, span.instrumentation_scope, getattr(span, "_instrumentation_info", None))

    def _origin_of(self, resource: Any, scope: Any, info: Any) -> int:
        key = (id(resource), id(scope), id(info))
        index = self._origin_index.get(key)
        if index is None:
            index = self._origin_index[key] = len(self._origins)
            self._origins.append((resource, scope, info))  # held: the ids stay theirs
        return index


def _attrs(keys: tuple[str, ...], values: tuple[Any, ...]) -> dict[str, Any]:
    return dict(zip(keys, values, strict=True))


def _rebuild_all(records: list[Any], origins: list[tuple[Any, Any, Any]]) -> tuple[ReadableSpan, ...]:
    """The spans the records were made from, in their order (a `StoredSpan` a record, a span kept as it
    came as itself): one loop, one Python call a span (its attributes).  A span context is made
    once and shared between a span and its children (one object fewer a span): a child's parent,
    kept by span id, is reused when its trace id, flags and remoteness are the span's and neither has
    a trace state.  Fields are set one by one, as `ReadableSpan.__init__` sets them (the instance's
    values in the class's shared-key layout: no dict made)."""
    if not _SPAN_IS_ITS_FIELDS:  # pragma: no cover - an SDK whose ReadableSpan keeps other fields
        return tuple(_rebuild_by_init(record, origins) if type(record) is tuple else record for record in records)
    spans: list[ReadableSpan] = []
    append = spans.append
    contexts: dict[int, tuple[SpanContext, Any, Any, Any]] = {}  # by span id: (context, trace id, flags, remote)
    pop_context, get_context = contexts.pop, contexts.get
    new, cls, kinds, unset = _new_object, StoredSpan, _KINDS, STATUS_UNSET
    new_context, flag_objects, default_state = _new_span_context, _FLAGS, DEFAULT_TRACE_STATE
    shared_attributes = codec.shared_attributes
    for record in records:
        if type(record) is not tuple:
            append(record)
            continue
        (name, trace_id, span_id, flags, remote, state, p_trace, p_span, p_flags, p_remote, p_state,
         kind, code, description, start, end, keys, values, events, links, origin) = record  # fmt: skip
        made = pop_context(span_id, None)  # made by a child that ended first
        if made is not None and made[1] == trace_id and made[2] == flags and made[3] is remote and state is None:
            context = made[0]
        elif state is None and flags in flag_objects:
            context = new_context(trace_id, span_id, remote, flag_objects[flags], default_state)
        else:
            context = _context(trace_id, span_id, flags, remote, state)
        if p_span is None:
            parent = None
        else:
            made = get_context(p_span)  # made by a sibling
            if (
                made is not None
                and made[1] == p_trace
                and made[2] == p_flags
                and made[3] is p_remote
                and p_state is None
            ):
                parent = made[0]
            elif p_state is None and p_flags in flag_objects:
                parent = new_context(p_trace, p_span, p_remote, flag_objects[p_flags], default_state)
                contexts[p_span] = (parent, p_trace, p_flags, p_remote)
            else:
                parent = _context(p_trace, p_span, p_flags, p_remote, p_state)
        resource, scope, info = origins[origin]
        span = new(cls)  # its fields set as ReadableSpan.__init__ sets them, in its order
        span._name = name
        span._context = context
        span._kind = kinds[kind]
        span._instrumentation_info = info
        span._instrumentation_scope = scope
        span._parent = parent
        span._start_time = start
        span._end_time = end
        # a shared encoding's split (a module's, an op's, a redistribute's): that encoding, read-only
        # behind the proxy `ReadableSpan.attributes` gives; else a dict of the record's own
        span._attributes = shared_attributes(keys, values) or dict(zip(keys, values, strict=False))
        span._events = _events(events) if events else ()
        span._links = _links(links) if links else ()
        span._resource = resource
        span._status = unset if code == 0 and description is None else Status(_CODES[code], description)
        span._hp_record = record  # what equality compares (the same tuple, no copy)
        append(span)
    return tuple(spans)


def _events(events: tuple[tuple[Any, ...], ...]) -> tuple[Event, ...]:
    return tuple([Event(e[0], _attrs(e[2], e[3]), e[1]) for e in events])


def _links(links: tuple[tuple[Any, ...], ...]) -> tuple[Link, ...]:
    return tuple([Link(_context(*k[:5]), _attrs(k[5], k[6])) for k in links])


def _rebuild_by_init(record: tuple[Any, ...], origins: list[tuple[Any, Any, Any]]) -> StoredSpan:  # pragma: no cover
    """A record's span through `ReadableSpan.__init__`, where the SDK's span keeps other fields."""
    (name, trace_id, span_id, flags, remote, state, p_trace, p_span, p_flags, p_remote, p_state,
     kind, code, description, start, end, keys, values, events, links, origin) = record  # fmt: skip
    resource, scope, info = origins[origin]
    context = _context(trace_id, span_id, flags, remote, state)
    parent = None if p_span is None else _context(p_trace, p_span, p_flags, p_remote, p_state)
    status = STATUS_UNSET if code == 0 and description is None else Status(_CODES[code], description)
    attributes = dict(zip(keys, values, strict=False))
    span = StoredSpan(name, context, parent, resource, attributes, _events(events), _links(links), _KINDS[kind], info,
                      status, start, end, scope)  # fmt: skip
    span._hp_record = record  # type: ignore[attr-defined]
    return span
