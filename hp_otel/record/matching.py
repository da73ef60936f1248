"""Naming the same collective on every rank: the window it counts in, and a shared link.

Every collective span carries `hp.collective.seq`, its index among the collectives this
rank issued on that process group (name and ranks) since the window began, and
`hp.collective.window`, what that window is: `step 3` inside `hp_otel.step(3)` (the
instrumentor's steps too), else `window N`, the N-th CommDebugMode window this process
opened — ranks running the same program open them in the same order.

From (window, group, ranks, seq) every rank derives the same ids without talking to the
others, the way `hp_otel.always_on.steps` derives a step's trace id: the span carries them as
`hp.collective.match_id` and as an OpenTelemetry link, so a trace backend finds the
spans of one collective on every rank by searching either.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import threading
from dataclasses import dataclass
from typing import Any

from opentelemetry import trace
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

    def match_ids(self, group: str, ranks: tuple[int, ...], seq: int) -> tuple[int, int]:
        """(trace id, span id) every rank derives for collective `seq` of this group in this window."""
        digest = hashlib.sha256(f"hp_otel/collective/{self.key}/{group}/{ranks}/{seq}".encode()).digest()
        return self.trace_id, int.from_bytes(digest[:8], "big") or 1

    def link(self, group: str, ranks: tuple[int, ...], seq: int) -> tuple[str, Link]:
        """The match id (hex) and the span link to the derived span context."""
        trace_id, span_id = self.match_ids(group, ranks, seq)
        context = SpanContext(trace_id, span_id, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))
        return f"{span_id:016x}", Link(context)


def window_for(parent_ctx: Any) -> Window:
    """The window that starts now under `parent_ctx`: a step's when its parent is in a step's trace."""
    number = next(_window_numbers)
    parent = trace.get_current_span(parent_ctx).get_span_context()
    step = _step_traces.get(parent.trace_id) if parent.is_valid else None
    if step is not None:
        return Window(f"step {step}", parent.trace_id)
    return Window(f"window {number}")
