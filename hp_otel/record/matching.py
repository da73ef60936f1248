"""Naming the same collective on every rank: the window it counts in, and a shared link.

Every collective span carries `hp_otel.collective.seq`, its index among the collectives this
rank issued on that process group (name and ranks) since the window began, and
`hp_otel.collective.window`, what that window is: `step 3` inside `hp_otel.step(3)` (the
instrumentor's steps too), else `window N`, the N-th CommDebugMode window this process
opened — ranks running the same program open them in the same order.

From (window, group id, seq) every rank derives the same ids without talking to the
others, the way `hp_otel.always_on.steps` derives a step's trace id: the span carries the
span id as `hp_otel.collective.match.id`, so a trace backend finds the spans of one collective on
every rank by searching it.

A link must point at a span someone exports.  In a step's window every rank's spans are in
the step's trace, so the group's first member (its group rank 0) gives its own collective
span the derived span id, and every other member links to it: the link opens that rank's
span of the same collective.  A window outside a step is one trace of each rank's own
(`Window.root_trace_id`), which no other rank can name: its spans carry the match id and no link.
"""

from __future__ import annotations

import contextvars
import copy
import functools
import hashlib
import itertools
import threading
from dataclasses import dataclass
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
from opentelemetry.trace import Link, SpanContext, TraceFlags

from hp_otel.common import launcher_env

_window_numbers = itertools.count()
_lock = threading.Lock()
# step trace id -> step, for the latest steps begun in this process (steps.py registers them)
_step_traces: dict[int, int | str] = {}
_STEP_TRACES_KEPT = 64


def register_step(trace_id: int, step: int | str) -> None:
    """`hp_otel.always_on.steps` says: windows whose parent is in this trace count within that step."""
    with _lock:
        if len(_step_traces) >= _STEP_TRACES_KEPT:
            _step_traces.pop(next(iter(_step_traces)))
        _step_traces[trace_id] = step


@dataclass(frozen=True)
class Window:
    """What the sequence numbers of one recording window count within."""

    label: str  # "step 3" / "window 0": the span attribute
    step_trace_id: int = 0  # a step's window: the step's trace id; else 0 (derived from the number)

    @functools.cached_property
    def key(self) -> str:
        """What the match ids derive from: the same on every rank for the same window.

        Worked out on first use (a window that builds no spans never needs it)."""
        if self.step_trace_id:
            return f"{self.step_trace_id:032x}"
        return f"{launcher_env.run_id() or ''}/{self.label}"

    @functools.cached_property
    def trace_id(self) -> int:
        """The links' trace id: the step's trace, or one derived from the key."""
        if self.step_trace_id:
            return self.step_trace_id
        return int.from_bytes(hashlib.sha256(f"hp_otel/window/{self.key}".encode()).digest()[:16], "big") or 1

    @functools.cached_property
    def root_trace_id(self) -> int:
        """The trace of this window's spans when no span encloses it (no step): chosen once, at random,
        so every root span of the window (each top-level call, backward root and collective outside
        every call) is in one trace; a trace of this rank's own, as no other rank can name it."""
        return self.step_trace_id or RandomIdGenerator().generate_trace_id()

    def match_ids(self, group_id: str, seq: int) -> tuple[int, int]:
        """(trace id, span id) every rank derives for collective `seq` of the group `group_id` (its name
        and members, `spans/groups.py`) in this window."""
        digest = hashlib.sha256(f"hp_otel/collective/{self.key}/{group_id}/{seq}".encode()).digest()
        return self.trace_id, int.from_bytes(digest[:8], "big") or 1


class _DerivedSpanIds(IdGenerator):
    """Random ids, except the span id a collective's span is given while `forced` holds one, and the
    trace id a window's root span is given while `forced_trace` holds one (its window's trace)."""

    def __init__(self) -> None:
        self.forced: contextvars.ContextVar[int | None] = contextvars.ContextVar("hp_otel_span_id", default=None)
        self.forced_trace: contextvars.ContextVar[int | None] = contextvars.ContextVar("hp_otel_trace_id", default=None)
        self._random = RandomIdGenerator()

    def generate_trace_id(self) -> int:
        forced = self.forced_trace.get()
        return forced if forced is not None else self._random.generate_trace_id()

    def generate_span_id(self) -> int:
        forced = self.forced.get()
        return forced if forced is not None else self._random.generate_span_id()


DERIVED_IDS = _DerivedSpanIds()


def tracer_with_derived_ids(tracer: Any) -> Any:
    """A copy of the SDK tracer `tracer` (same provider, scope, sampler and processors) whose span ids
    `DERIVED_IDS.forced` can choose (and root spans' trace ids `DERIVED_IDS.forced_trace`); None for a
    tracer that is not the SDK's.  A copy, so the
    tracer and its provider are left as they were."""
    if not hasattr(tracer, "id_generator"):
        return None
    twin = copy.copy(tracer)
    twin.id_generator = DERIVED_IDS
    return twin


def link_target(window: Window, group_id: str, members: Any, seq: int, rank: int) -> tuple[str, int | None, Any]:
    """(match id, the span id this rank's span must have, the link it carries) of collective `seq`.

    In a step's window: the group's first member's span is the target (its span id derived), every
    other member's links to it.  Elsewhere: the match id alone."""
    trace_id, span_id = window.match_ids(group_id, seq)
    match_id = f"{span_id:016x}"
    if not window.step_trace_id or not members:
        return match_id, None, None
    if members[0] == rank:
        return match_id, span_id, None
    context = SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))
    return match_id, None, Link(context)


def window_for(parent_ctx: Any) -> Window:
    """The window that starts now under `parent_ctx`: a step's when its parent is in a step's trace."""
    number = next(_window_numbers)
    parent = trace.get_current_span(parent_ctx).get_span_context()
    step = _step_traces.get(parent.trace_id) if parent.is_valid else None
    if step is not None:
        return Window(f"step {step}", parent.trace_id)
    return Window(f"window {number}")
