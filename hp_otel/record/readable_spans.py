"""A window's spans made as finished `ReadableSpan`s, without the SDK's per-span path.

The SDK's `tracer.start_span()` + `end()` locks, bounds and copies every span twice over
(docs/how-it-works/costs.md has the figures); a deferred window knows each span whole by the
time it builds it, so it makes the `ReadableSpan` that `Span.end()` would hand on and gives it
to the same place `end()` does: the tracer's `span_processor` (the provider's processors), then
the local store.  What the window gives up against live spans: no processor's `on_start` runs
(a span is never open), and the sampler is asked once per window, for its root, instead of
once per span.

`SpanOutlet` holds what every span of a window shares (the tracer's resource, scope, limits,
id generator, processors and the window's sampling decision); `DraftSpan` is the one mutable
record a span is while it is open: the builder and the user's hooks write on it (it has the
`opentelemetry.trace.Span` methods a hook calls), and it becomes a `ReadableSpan` when it ends.
"""

from __future__ import annotations

import random
import time
import traceback
from collections.abc import Sequence
from types import MappingProxyType
from typing import Any

from opentelemetry import trace
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanLimits
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.util import BoundedList
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.trace.span import DEFAULT_TRACE_STATE

from hp_otel.common import _otel_compat
from hp_otel.record.span_store import STATUS_UNSET
from hp_otel.spans.codec import SharedAttributes

# What the sampler is asked about: the window as a whole (its root decision holds for every span of it).
WINDOW_SAMPLE_NAME = "hp_otel window"
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_SAMPLED_RANDOM = TraceFlags(TraceFlags.SAMPLED | TraceFlags.RANDOM_TRACE_ID)
_RANDOM_TRACE_ID = TraceFlags.RANDOM_TRACE_ID
_fields = _otel_compat.span_context_fields
_SPAN_IS_ITS_FIELDS = _otel_compat.READABLE_SPAN_IS_ITS_FIELDS
_new_object = object.__new__
_INTERNAL = SpanKind.INTERNAL
_UNSET = STATUS_UNSET  # the local store knows it by identity: no status to encode
_new_span_context = _otel_compat.new_span_context


_SDK_SPAN_ID_DRAW = RandomIdGenerator.generate_span_id  # as imported: a patched one is called instead


def _draws_as_the_sdk(generator: Any) -> bool:
    return RandomIdGenerator.generate_span_id is _SDK_SPAN_ID_DRAW and "generate_span_id" not in vars(generator)


class SpanOutlet:
    """What the spans of one window share, read once from an SDK tracer: None from `of` for a tracer
    that is not the SDK's (its spans then take the tracer's own path)."""

    __slots__ = (
        "enabled",
        "id_generator",
        "info",
        "limits",
        "origin",
        "plain",
        "processor",
        "random_bits",
        "resource",
        "sampled",
        "sampler_attributes",
        "scope",
        "trace_state",
    )

    def __init__(self, tracer: Any) -> None:
        self.processor = tracer.span_processor  # where the SDK's `Span.end()` hands a span on
        self.id_generator = tracer.id_generator
        # `RandomIdGenerator.generate_span_id` is `random.getrandbits(64)` until nonzero: drawn here directly
        random_ids = type(self.id_generator) is RandomIdGenerator and _draws_as_the_sdk(self.id_generator)
        self.random_bits = random.getrandbits if random_ids else None
        self.resource = getattr(tracer, "resource", None) or Resource.get_empty()
        self.scope = _otel_compat.instrumentation_scope(tracer)
        self.info = getattr(tracer, "instrumentation_info", None)
        self.limits = _otel_compat.span_limits(tracer) or SpanLimits()
        self.origin = (self.resource, self.scope, self.info)  # what the local store keeps once per tracer
        self.enabled = _otel_compat.tracer_enabled(tracer)
        self.sampled = True
        self.sampler_attributes: dict[str, Any] = {}
        self.trace_state = DEFAULT_TRACE_STATE
        # Nothing the window adds to or cuts from a span's fields as written (no sampler attributes, no
        # length limit): then the counts limits alone decide whether a span's fields stand as they are.
        self.plain = self.limits.max_attribute_length is None

    @classmethod
    def of(cls, tracer: Any) -> SpanOutlet | None:
        needed = ("span_processor", "id_generator", "sampler")
        if not all(hasattr(tracer, name) for name in needed):
            return None
        return cls(tracer)

    def decide(self, tracer: Any, parent_ctx: Any, trace_id: int) -> None:
        """Ask the tracer's sampler once, for the window's root: every span of the window follows it."""
        if not self.enabled:
            self.sampled = False
            return
        result = tracer.sampler.should_sample(parent_ctx, trace_id, WINDOW_SAMPLE_NAME, SpanKind.INTERNAL, None, ())
        self.sampled = result.decision.is_sampled()
        self.sampler_attributes = dict(result.attributes or {})
        self.plain = self.limits.max_attribute_length is None and not self.sampler_attributes
        self.trace_state = result.trace_state or DEFAULT_TRACE_STATE

    def context(self, parent: SpanContext | None, trace_id: int, span_id: int | None) -> SpanContext:
        """A new span's context: its parent's trace (or `trace_id` for a root), the given span id or a new one."""
        if parent is not None:
            return self.child_context(parent, span_id)
        if span_id is None:
            span_id = self.id_generator.generate_span_id()
        # a root: in the window's trace, as the SDK path's forced trace id makes it
        return _new_span_context(trace_id, span_id, False, _SAMPLED, self.trace_state)

    def child_context(self, parent: SpanContext, span_id: int | None) -> SpanContext:
        """A child's context: its parent's trace, flags and state; the given span id or a new one."""
        if span_id is None:  # the SDK's random generator's draw, without its call (0 is invalid: drawn again)
            span_id = (self.random_bits and self.random_bits(64)) or self.id_generator.generate_span_id()
        parent_trace, _, _, parent_flags, parent_state = _fields(parent)
        flags = _SAMPLED_RANDOM if parent_flags & _RANDOM_TRACE_ID else _SAMPLED
        return _new_span_context(parent_trace, span_id, False, flags, parent_state)


class DraftSpan(trace.Span):
    """One open span of a deferred window: written by the builder and the user's hooks, made a
    `ReadableSpan` by `readable()` once it ends.  Its `Span` methods behave as the SDK span's (a
    write after the end is ignored, status OK is final); values a hook wrote are checked as the
    SDK checks them, when the span is made readable."""

    __slots__ = (
        "_attrs",
        "_events",
        "_limits",
        "_links",
        "_name",
        "_shared",
        "_status",
        "checked",
        "ctx",
        "end_time",
        "parent",
        "start",
    )

    def __init__(
        self,
        name: str,
        ctx: SpanContext,
        parent: SpanContext | None,
        attrs: dict[str, Any],
        start: int,
        links: Any,
        limits: SpanLimits,
    ) -> None:
        self._name = name
        self._limits = limits
        self.ctx = ctx
        self.parent = parent
        self._attrs = attrs
        self._shared = type(attrs) is SharedAttributes  # a cache others read: copied before the first write
        self.start = start
        # The SDK keeps a link's attributes as a (possibly empty) mapping, never None
        self._links: list[Any] | None = [_with_attributes(link) for link in links] if links else None
        self._events: list[Event] | None = None
        self._status = _UNSET
        self.end_time: int | None = None
        self.checked = False  # a hook wrote on it: its attributes are cleaned and bounded when made readable

    # --- the Span API ------------------------------------------------------------
    def get_span_context(self) -> SpanContext:
        return self.ctx

    def is_recording(self) -> bool:
        return self.end_time is None

    def set_attribute(self, key: str, value: Any) -> None:
        if self.end_time is None:
            self._own_attrs()[key] = value

    def set_attributes(self, attributes: Any) -> None:
        if self.end_time is None:
            self._own_attrs().update(attributes)

    def shared_attributes(self) -> SharedAttributes | None:
        """Its attributes while they are still the shared encoding it was given (nothing wrote on them)."""
        return self._attrs if self._shared and self.end_time is None else None  # type: ignore[return-value]

    def share_attributes(self, attrs: SharedAttributes) -> None:
        """Take another shared encoding for its still-shared attributes (a superset the builder made)."""
        assert self._shared, "a span's own attributes are written on, not replaced"
        self._attrs = attrs

    def _own_attrs(self) -> dict[str, Any]:
        if self._shared:
            self._attrs = dict(self._attrs)
            self._shared = False
        return self._attrs

    def add_event(self, name: str, attributes: Any = None, timestamp: int | None = None) -> None:
        if self.end_time is not None:
            return
        limits = self._limits  # bounded as the SDK bounds an event's attributes
        bounded = BoundedAttributes(
            limits.max_event_attributes, attributes, immutable=True, max_value_len=limits.max_attribute_length
        )
        event = Event(name, bounded, timestamp if timestamp is not None else time.time_ns())
        if self._events is None:
            self._events = [event]
        else:
            self._events.append(event)

    def add_link(self, context: SpanContext, attributes: Any = None) -> None:
        if self.end_time is not None or not (context and (context.is_valid or attributes or context.trace_state)):
            return  # what the SDK's span takes as a link
        limits = self._limits
        bounded = BoundedAttributes(
            limits.max_link_attributes, attributes, immutable=True, max_value_len=limits.max_attribute_length
        )
        if self._links is None:
            self._links = []
        self._links.append(Link(context, bounded))

    def update_name(self, name: str) -> None:
        if self.end_time is None:
            self._name = name

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        if self.end_time is not None or self._status.status_code is StatusCode.OK:
            return
        if not isinstance(status, Status):
            status = Status(status, description)
        if status.status_code is not StatusCode.UNSET:
            self._status = status

    def record_exception(
        self, exception: BaseException, attributes: Any = None, timestamp: int | None = None, escaped: bool = False
    ) -> None:
        kind = type(exception)
        module, qualname = kind.__module__, kind.__qualname__
        described: dict[str, Any] = {
            "exception.type": f"{module}.{qualname}" if module and module != "builtins" else qualname,
            "exception.message": str(exception),
            "exception.stacktrace": "".join(traceback.format_exception(kind, exception, exception.__traceback__)),
            "exception.escaped": str(escaped),
        }
        if attributes:
            described.update(attributes)
        self.add_event("exception", described, timestamp)

    def end(self, end_time: int | None = None) -> None:
        """A hook ending the span: it ends there (later writes are ignored, as on the SDK span)."""
        if self.end_time is None:
            self.end_time = end_time if end_time is not None else time.time_ns()

    # --- what a hook may read, as on the SDK span ---------------------------------
    @property
    def name(self) -> str:
        return self._name

    @property
    def attributes(self) -> MappingProxyType[str, Any]:
        return MappingProxyType(self._attrs)

    @property
    def events(self) -> Sequence[Event]:
        return tuple(self._events or ())

    @property
    def links(self) -> Sequence[Any]:
        return tuple(self._links or ())

    @property
    def status(self) -> Status:
        return self._status

    @property
    def context(self) -> SpanContext:
        return self.ctx

    @property
    def kind(self) -> SpanKind:
        return SpanKind.INTERNAL

    @property
    def start_time(self) -> int:
        return self.start

    # --- finished ------------------------------------------------------------------
    def keep_in(self, store: Any, outlet: SpanOutlet, end_ns: int) -> bool:
        """Hand its fields to the local store, ended at `end_ns` unless a hook ended it, when they are what
        the readable span would hold as they are (nothing to clean or bound): no span is made then.
        False if they are not, or the store cannot keep them as a record (then it takes the readable span)."""
        if self.checked or not outlet.plain:
            return False
        limits = outlet.limits
        most = limits.max_span_attributes
        if (
            (most is not None and len(self._attrs) > most)
            or (self._events and limits.max_events is not None and len(self._events) > limits.max_events)
            or (self._links and limits.max_links is not None and len(self._links) > limits.max_links)
        ):
            return False
        if self.end_time is None:
            self.end_time = end_ns
        return store.keep(
            self._name,
            self.ctx,
            self.parent,
            self._status,
            self.start,
            self.end_time,
            self._attrs,
            self._events,
            self._links,
            outlet.origin,
            self._attrs.split if self._shared else None,  # type: ignore[attr-defined]
        )

    # --- made readable -------------------------------------------------------------
    def readable(self, outlet: SpanOutlet, end_ns: int) -> ReadableSpan:
        """The finished span as the SDK's `end()` would hand it on (ended at `end_ns` unless a hook ended it)."""
        if self.end_time is None:
            self.end_time = end_ns
        limits = outlet.limits
        attrs: Any = self._attrs
        if outlet.sampler_attributes:
            attrs = self._own_attrs()
            attrs.update(outlet.sampler_attributes)
        most = limits.max_span_attributes
        if self.checked or (most is not None and len(attrs) > most) or limits.max_attribute_length is not None:
            attrs = BoundedAttributes(most, attrs, immutable=True, max_value_len=limits.max_attribute_length)
        events: Any = self._events or ()
        if events and limits.max_events is not None and len(events) > limits.max_events:
            events = BoundedList.from_seq(limits.max_events, events)
        links: Any = self._links or ()
        if links and limits.max_links is not None and len(links) > limits.max_links:
            links = BoundedList.from_seq(limits.max_links, links)
        if not _SPAN_IS_ITS_FIELDS:  # pragma: no cover - an SDK whose ReadableSpan keeps other fields
            return ReadableSpan(
                self._name, self.ctx, self.parent, outlet.resource, attrs, events, links,
                _INTERNAL, outlet.info, self._status, self.start, self.end_time, outlet.scope,
            )  # fmt: skip
        span = _new_object(ReadableSpan)  # its fields set as ReadableSpan.__init__ sets them, in its order
        span._name = self._name  # (_otel_compat.READABLE_SPAN_FIELDS): the class's shared-key layout, no dict
        span._context = self.ctx
        span._kind = _INTERNAL
        span._instrumentation_info = outlet.info
        span._instrumentation_scope = outlet.scope
        span._parent = self.parent
        span._start_time = self.start
        span._end_time = self.end_time
        span._attributes = attrs
        span._events = events
        span._links = links
        span._resource = outlet.resource
        span._status = self._status
        return span


def _with_attributes(link: Link) -> Link:
    return link if link.attributes is not None else Link(link.context, {})
