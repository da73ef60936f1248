"""What a window recorder records, decided once when it is made (`CommDebugMode` checks the user's input)."""

from __future__ import annotations

from dataclasses import dataclass, field

from hp_otel.record.call_stack import CallStack
from hp_otel.record.metric_labels import ModuleLabel
from hp_otel.record.user_hooks import NO_HOOKS, UserHooks

# Deferred spans are built once this many events wait, so unbuilt events stay bounded too:
# at most this, and at most about two events per span `max_spans` keeps (an enter and an exit).
_MAX_PENDING_EVENTS = 20_000
_MIN_PENDING_EVENTS = 256


@dataclass(frozen=True, slots=True)
class RecorderSettings:
    live: bool  # spans built by the SDK as events happen (live_spans=True), else deferred ReadableSpans
    max_spans: int  # spans the local store keeps; later ones are counted as dropped
    spans_enabled: bool = True  # False: counts and metrics only (an unsampled step)
    ops_enabled: bool = True  # False: sources leave out op tracing (counts, modules and collectives only)
    hooks: UserHooks = NO_HOOKS  # the user's span hooks, run by the span builder as each span ends
    store_only: bool = False  # the local store is the spans' only consumer: past max_spans, not built
    call_stack: CallStack | None = None  # the user's frames issuing each collective (None: none walked)
    module_label: ModuleLabel = field(default_factory=lambda: ModuleLabel(None))  # the metrics' module depth
    module_depth: int | None = None  # how deep module sources hook (None: every module)

    @property
    def max_pending(self) -> int:
        """Unbuilt events a deferred window holds before it builds the oldest (bounded by `max_spans`)."""
        return min(_MAX_PENDING_EVENTS, max(_MIN_PENDING_EVENTS, 2 * self.max_spans))
