"""The window recorder: observer events in, exact counts, metrics and spans out.

What it records is fixed when it is made (`settings`), so it picks its path then: a counts-only
window (`counts_path`) or a traced one (`traced_path`, which keeps each event for its span in a
`SpanFeed` and each collective for the exposure figures in a `WindowExposure`). The observer calls
sources make are that path's methods, bound here once: no event asks which path it is on, and no
call goes through a wrapper. The recorder itself holds the window's lifecycle and what is read from
it (counts, faults, spans, exposure, the collectives in flight: `InFlight`).

Spans are built from the events by `SpanBuilder` (through the `SpanFeed`): deferred by default, at
window end for your provider and when first read for hp_otel's own, as `ReadableSpan`s handed to
the processors' `on_end` (`record/readable_spans.py`: no SDK span per event, the sampler asked once
per window); or live (`live_spans=True`), through the SDK as events happen.

Nothing here raises into the traced code: a fault is counted, logged once per kind,
and recording goes on.
"""

from __future__ import annotations

import logging

from opentelemetry import context as otel_context
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import Tracer

from hp_otel.record import matching
from hp_otel.record.collective_metrics import CollectiveMetrics
from hp_otel.record.counts_path import CountsPath
from hp_otel.record.in_flight import InFlight
from hp_otel.record.instruments import Instruments
from hp_otel.record.settings import RecorderSettings
from hp_otel.record.span_feed import SpanFeed
from hp_otel.record.span_store import LocalSpanStore
from hp_otel.record.traced_path import TracedPath
from hp_otel.record.window_exposure import WindowExposure
from hp_otel.record.window_path import WindowPath
from hp_otel.spans import schema
from hp_otel.spans.exposure import ExposureReport

logger = logging.getLogger("hp_otel")


class WindowRecorder:
    """Records one window (a `CommDebugMode` block): implements `hp_otel.record.observer.Observer`."""

    def __init__(self, tracer: Tracer, instruments: Instruments, settings: RecorderSettings) -> None:
        self.settings = settings
        self._instruments = instruments
        self.store = LocalSpanStore(settings.max_spans)
        # What sources read when they attach (one plain attribute each).
        self.spans_enabled = settings.spans_enabled  # False: counts and metrics only (an unsampled step)
        self.ops_enabled = settings.ops_enabled  # False: sources leave out op tracing
        self.module_depth = settings.module_depth  # how deep module sources hook (None: every module)
        self.accepting = False  # active and not suspended: the one flag sources read on every hook call
        self._active = False
        self._suspended = 0  # > 0 while a nested mode records instead of this one
        self.comm_counts: dict[str, int] = {}
        self.comm_ops: dict[str, str] = {}  # framework name -> normalised op
        self.module_counts: dict[str, dict[str, dict[str, int]]] = {}
        self.fault_counts: dict[str, int] = {}
        self.window: matching.Window | None = None
        self._liveness = instruments.liveness  # the staleness gauges' state (per provider, across windows)
        self.metrics = CollectiveMetrics(instruments, settings.live, settings.module_label, self.on_fault)
        self.in_flight_collectives = InFlight()  # what a hang watchdog writes
        self.span_feed = SpanFeed(tracer, self.store, settings, self.on_fault)
        self.exposure_tracker = WindowExposure(instruments, settings.module_label, self.on_fault)
        counts = (self.comm_counts, self.comm_ops, self.module_counts)
        path: WindowPath
        if settings.spans_enabled:
            path = TracedPath(settings, self.metrics, self._liveness, self.in_flight_collectives, counts,
                              self.on_fault, self.span_feed, self.exposure_tracker)  # fmt: skip
        else:
            path = CountsPath(settings, self.metrics, self._liveness, self.in_flight_collectives, counts, self.on_fault)
        self._path = path
        # The observer calls: the path's own methods (the recorder's class has none of them).
        self.on_module_enter = path.on_module_enter
        self.on_module_exit = path.on_module_exit
        self.on_backward_end = path.on_backward_end
        self.on_backward_modules = path.on_backward_modules
        self.set_node_attribution = path.set_node_attribution
        self.set_param_attribution = path.set_param_attribution
        self.on_op_enter = path.on_op_enter
        self.on_op_exit = path.on_op_exit
        self.on_redistribute_enter = path.on_redistribute_enter
        self.on_redistribute_exit = path.on_redistribute_exit
        self.on_collective_issue = path.on_collective_issue
        self.on_collective = path.on_collective
        self.on_collective_complete = path.on_collective_complete
        self.on_collective_wait = path.on_collective_wait
        self.in_flight = self.in_flight_collectives.in_flight  # issued, not completed, oldest first
        self.forget_completed = self.in_flight_collectives.forget_completed  # the watchdog's thread calls this

    # --- lifecycle -----------------------------------------------------------
    @property
    def active(self) -> bool:
        return self._active

    @active.setter
    def active(self, value: bool) -> None:
        self._active = value
        self.accepting = self._path.accepting = value and not self._suspended

    @property
    def suspended(self) -> int:
        return self._suspended

    @suspended.setter
    def suspended(self, value: int) -> None:
        self._suspended = value
        self.accepting = self._path.accepting = self._active and not value

    @property
    def wants_completion(self) -> bool:
        """True while a hang watchdog watches: sources attach a done-probe to returned collectives."""
        return self._path.wants_completion

    @wants_completion.setter
    def wants_completion(self, value: bool) -> None:
        self._path.wants_completion = value

    def start(self) -> None:
        """Begin a window: its spans nest under whatever span is current now."""
        parent_ctx = otel_context.get_current()
        self.window = matching.window_for(parent_ctx)
        # A counts-only window builds no span: its builder is made only if one is asked for (in_flight_spans)
        self.span_feed.start(parent_ctx, self.window, self.spans_enabled)  # first: builds the last window's
        self.metrics.start(parent_ctx)  # the step's span: durations' exemplars link to it
        self.in_flight_collectives.clear()
        self._instruments.totals.set_fault_sink(self.on_fault)  # faults in the metric callbacks count here
        self.exposure_tracker.start()
        self._path.start()
        self.active = True

    def stop(self, error: BaseException | None = None) -> None:
        """End the window: spans still open end now (with error status if the window raised)."""
        self.active = False
        self._path.stop(error)
        self.metrics.stop()
        self.exposure_tracker.stop()

    @property
    def exposure(self) -> ExposureReport:
        """The last stopped window's exposed communication (docs/overlap.md)."""
        return self.exposure_tracker.report()

    def reset(self) -> None:
        """Forget counts and unbuilt events (the OTel counters, being cumulative, keep theirs).

        Between windows also the span builder (its per-window caches) and the in-flight records.
        Refused from a span hook while that build runs: the build would go on with what it forgot."""
        self.span_feed.reset(self._active)
        if not self._active:
            self.in_flight_collectives.clear()
        self.comm_counts.clear()
        self.comm_ops.clear()
        self.module_counts.clear()

    def unbuilt_events(self) -> int:
        """Events recorded whose spans are not built yet (deferred spans)."""
        return len(self.span_feed.pending)

    def materialise(self) -> None:
        """Build the spans of every event recorded so far (from a span hook during a build: nothing more)."""
        self.span_feed.materialise()

    def in_flight_spans(self, now_ns: int) -> list[ReadableSpan]:
        """The in-flight collectives as finished spans marked in flight (for a file; nothing is exported)."""
        self.in_flight_collectives.forget_completed()
        return self.span_feed.in_flight_spans(self.in_flight_collectives, now_ns, self._active)

    # --- faults -------------------------------------------------------------------
    def on_fault(self, where: str, exc: BaseException) -> None:
        """Count a fault in our own code, log it once per kind, and keep going."""
        try:
            first = where not in self.fault_counts
            self.fault_counts[where] = self.fault_counts.get(where, 0) + 1
            if first:
                logger.warning(
                    "hp_otel: %s failed; tracing goes on and the traced code is unaffected "
                    "(later %s faults are counted, not logged)",
                    where,
                    where,
                    exc_info=exc,
                )
            self._instruments.callback_errors.add(1, {schema.CALLBACK_NAME: where})
        except Exception:  # pragma: no cover - logging itself failed; nothing more can be done safely
            pass
