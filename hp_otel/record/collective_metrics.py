"""A window's collective metrics: calls and bytes at once, durations and bus bandwidths deferred.

The recorder hands each collective here once it is counted.  Calls and bytes go straight to the
totals the observable counters read.  Durations and bus bandwidths are held for the window's end
(`DeferredDurations`: the step pays for an append, not for a histogram record), or recorded at
once with live spans; a long window hands them on once `_MAX_PENDING_VALUES` wait.  An async
collective's duration is known only when it completes: it waits in `_awaiting`, settled when
it has completed (every `_awaiting_limit` launches, so a long window keeps only the ones still
awaited) or at the window's end.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hp_otel.record import events as ev
from hp_otel.record.attribution import Attribution
from hp_otel.record.faults import FaultSink, weak_sink
from hp_otel.record.instruments import Instruments
from hp_otel.record.metric_labels import ModuleLabel
from hp_otel.spans import schema
from hp_otel.spans.bandwidth import Bandwidth, bandwidth
from hp_otel.spans.codec import MetricKey
from hp_otel.spans.infos import CollectiveInfo

# Async collectives awaiting completion inside one window: those completed meanwhile are settled
# (their durations handed on) once this many wait, and at most _MAX_AWAITING still-awaited ones
# are kept (work nobody waits for: the oldest then count with their launch time, as at window end).
_AWAITING_SWEEP = 256
_MAX_AWAITING = 4096
_MAX_PENDING_VALUES = 8192  # durations held for the window's end: beyond, handed on at once (with the bandwidths)


def call_bandwidth(info: CollectiveInfo, duration_ns: int) -> Bandwidth | None:
    """One completed call's bandwidth (None for a barrier, no bytes, or a fake process group's call:
    it returned at once)."""
    if info.fake_group:
        return None
    return bandwidth(info.op, info.bytes, info.group_size, duration_ns)


def bandwidth_of(event: ev.Collective, duration_ns: int) -> Bandwidth | None:
    """`event`'s bandwidth over `duration_ns`, computed once: the metrics and the span share it."""
    if event.bw_ns != duration_ns:
        event.bw = call_bandwidth(event.info, duration_ns)
        event.bw_ns = duration_ns
    return event.bw


class CollectiveMetrics:
    """The metric side of one recorder (across its windows: the instruments are the provider's)."""

    def __init__(
        self,
        instruments: Instruments,
        live: bool,
        module_label: ModuleLabel,
        on_fault: FaultSink,
    ) -> None:
        self._instruments = instruments
        self._totals = instruments.totals
        self._liveness = instruments.liveness
        self._live = live
        self.module_label = module_label  # the metrics' hp_otel.module.fqn (metric_labels: its depth)
        self._on_fault = weak_sink(on_fault)
        self._pending_durations: dict[MetricKey, list[int]] = {}
        self._pending_busbw: dict[MetricKey, list[float]] = {}  # bus bandwidths (bytes/s), handed over at window end
        self._pending_values = 0  # durations waiting in _pending_durations
        self._awaiting: list[tuple[ev.Collective | ev.Launch, MetricKey]] = []
        self._awaiting_limit = _AWAITING_SWEEP
        self._window_context: Any = None  # the step's span: durations' exemplars link to it

    def start(self, window_context: Any) -> None:
        self._window_context = window_context
        self._awaiting = []
        self._awaiting_limit = _AWAITING_SWEEP

    def stop(self) -> None:
        """The window ended: awaited collectives count with their completion where seen, else their
        launch; everything held is handed on."""
        awaiting, self._awaiting = self._awaiting, []
        for event, key in awaiting:
            self._settle(event, key)
        self.flush()

    def measure(
        self,
        info: CollectiveInfo,
        place: Attribution,
        duration_ns: int | None,
        error: BaseException | None,
        bw: Bandwidth | None,
    ) -> MetricKey:
        """Calls and bytes now; the duration (and `bw`, its bandwidth) now (live) or at window end —
        None: not known yet."""
        label = self.module_label
        fqn = place.fqn
        key = MetricKey.of(info, place.phase, fqn if label.depth is None else label(fqn), error)  # failed: own series
        self._totals.add(key, 1, info.bytes)  # read by the observable counters
        if duration_ns is None:
            return key
        if bw is not None:
            self._pending_busbw.setdefault(key, []).append(bw.busbw)
        if self._live:
            self._record_durations(key, (duration_ns,))
        else:
            self._pending_durations.setdefault(key, []).append(duration_ns)
            self._pending_values += 1
            if self._pending_values >= _MAX_PENDING_VALUES:  # a long window: hand them on now
                self.flush()
        return key

    def awaiting(self, event: ev.Collective | ev.Launch, key: MetricKey) -> None:
        """`event` was launched: its duration is handed on once it completes."""
        awaiting = self._awaiting
        awaiting.append((event, key))
        if len(awaiting) >= self._awaiting_limit:
            self._settle_completed()

    def _settle(self, event: ev.Collective | ev.Launch, key: MetricKey) -> None:
        """Hand an awaited collective's duration to the metrics: to its completion where seen, else its launch."""
        duration_ns = event.end_ns - event.start_ns
        self._pending_durations.setdefault(key, []).append(duration_ns)
        self._pending_values += 1
        try:
            if event.completion == schema.COMPLETION_LAUNCH:  # its completion will not be seen now
                self._liveness.forget(event)
            else:
                # a `Launch` (counts only) has no span to share its bandwidth with
                bw = (
                    call_bandwidth(event.info, duration_ns)
                    if type(event) is ev.Launch
                    else bandwidth_of(event, duration_ns)
                )
                if bw is not None:
                    self._pending_busbw.setdefault(key, []).append(bw.busbw)
        except Exception as exc:
            self._on_fault("metrics", exc)

    def _settle_completed(self) -> None:
        """Settle the awaited collectives that completed meanwhile; keep those still awaited (at most
        `_MAX_AWAITING`: beyond, the oldest are settled with their launch time, as at window end)."""
        still: list[tuple[ev.Collective | ev.Launch, MetricKey]] = []
        for event, key in self._awaiting:
            if event.completion == schema.COMPLETION_LAUNCH:
                still.append((event, key))
            else:
                self._settle(event, key)
        if len(still) > _MAX_AWAITING:
            for event, key in still[:-_MAX_AWAITING]:
                self._settle(event, key)
            still = still[-_MAX_AWAITING:]
        self._awaiting = still
        self._awaiting_limit = max(_AWAITING_SWEEP, 2 * len(still))  # amortised: each entry swept O(1) times
        if self._pending_values >= _MAX_PENDING_VALUES:
            self.flush()

    def flush(self) -> None:
        """Hand the window's durations to the histogram's next collection (see `DeferredDurations`)."""
        pending, self._pending_durations = self._pending_durations, {}
        self._pending_values = 0
        deferred = self._instruments.durations
        attributes = self._totals.attributes
        for key, durations in pending.items():
            try:
                deferred.add(attributes(key), durations, self._window_context)
            except Exception as exc:
                self._on_fault("metrics", exc)
        busbw, self._pending_busbw = self._pending_busbw, {}
        for key, values in busbw.items():
            try:
                self._instruments.busbw.add(attributes(key), values, self._window_context)
            except Exception as exc:
                self._on_fault("metrics", exc)

    def _record_durations(self, key: MetricKey, durations: Sequence[int], context: Any = None) -> None:
        """Record durations; recorded in a sampled span's context, the SDK attaches exemplars of its trace."""
        attrs = self._totals.attributes(key)
        record = self._instruments.duration.record
        for duration_ns in durations:
            record(duration_ns / 1e9, attrs, context=context)
