"""hp_otel's metric instruments: collective calls and bytes, durations, callback faults.

Calls and bytes are observable counters over exact in-process totals, so the training
step adds to a dict instead of calling the SDK per collective; the SDK reads the totals
only when a metric reader collects.
"""

from __future__ import annotations

import threading
from array import array
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.metrics import CallbackOptions, Counter, Histogram, Meter, MeterProvider, Observation

from hp_otel.common.per_provider import PerProvider
from hp_otel.record.exposure_metrics import ExposureTotals
from hp_otel.record.faults import FaultSink, weak_method
from hp_otel.record.liveness import Liveness
from hp_otel.spans import codec, schema
from hp_otel.spans.codec import MetricKey
from hp_otel.version import __version__

_instruments: PerProvider[Instruments] = PerProvider()


class CollectiveTotals:
    """Cumulative calls and bytes per metric attribute set, read by the observable counters.

    The recorder adds to plain dicts on the hot path (no SDK call per collective);
    the SDK reads them only when a metric reader collects.
    """

    def __init__(self) -> None:
        self.calls: dict[MetricKey, int] = {}
        self.bytes: dict[MetricKey, int] = {}
        self._attrs: dict[MetricKey, dict[str, Any]] = {}
        # Where a fault inside the callbacks is counted (the recorder of the latest window);
        # the SDK would otherwise swallow it with a log line and drop both counters.
        self._fault_sink: Callable[[], FaultSink | None] | None = None

    def add(self, key: MetricKey, calls: int, nbytes: int) -> None:
        self.calls[key] = self.calls.get(key, 0) + calls
        self.bytes[key] = self.bytes.get(key, 0) + nbytes

    def set_fault_sink(self, on_fault: Callable[[str, BaseException], None]) -> None:
        """Count callback faults with this (bound) method; held weakly, so no mode is kept alive."""
        self._fault_sink = weak_method(on_fault)

    def attributes(self, key: MetricKey) -> dict[str, Any]:
        attrs = self._attrs.get(key)
        if attrs is None:
            attrs = self._attrs[key] = codec.metric_attributes(key)
        return attrs

    def observe_calls(self, options: CallbackOptions) -> Iterable[Observation]:
        return self._observe(self.calls)

    def observe_bytes(self, options: CallbackOptions) -> Iterable[Observation]:
        return self._observe(self.bytes)

    def _observe(self, totals: dict[MetricKey, int]) -> list[Observation]:
        """Observations of every key that can be described; a failing key is skipped and counted."""
        out = []
        for key, value in list(totals.items()):
            try:
                out.append(Observation(value, self.attributes(key)))
            except Exception as exc:
                self.fault("metric_observe", exc)
        return out

    def fault(self, where: str, exc: BaseException) -> None:
        """Count a fault of a metric callback with the latest window's recorder."""
        sink = self._fault_sink() if self._fault_sink is not None else None
        if sink is not None:
            sink(where, exc)


class DeferredDurations:
    """Collective durations handed to the histogram when a metric reader collects.

    The SDK's `Histogram.record` is dear (it cleans and hashes the attributes each time:
    docs/how-it-works/costs.md); a window that ends hands its durations over here instead, and the calls
    counter's callback — which every collection runs before it reads the instruments —
    records them.  Without collections (a provider with no reader: traces only) they are
    recorded once `max_pending` values or `max_labels` (attributes, step) pairs wait, so memory
    stays bounded.  Of the context each was measured in only the span's ids are kept (what an
    exemplar reads): not the step's span itself, which a step a window would otherwise keep
    alive until then.
    """

    def __init__(
        self, histogram: Histogram, max_pending: int = 8192, scale: float = 1e-9, max_labels: int = 256
    ) -> None:
        self._histogram = histogram
        self._scale = scale  # what one value added is in the histogram's unit (ns -> s by default)
        self._max_pending = max_pending
        self._max_labels = max_labels
        # Every waiting value in one float array, and per `add` the index past its last value and its
        # (attributes, context) as an index into `_labels`: no tuple and float per value, which, waiting
        # for the next collection, stayed scattered among a long window's freed blocks (see WindowRows).
        self._values = array("d")
        self._ends = array("I")
        self._label_of_add = array("I")
        self._labels: list[tuple[dict[str, Any], Any]] = []
        # (id(attributes), the span's ids) -> index: `_labels` keeps the attributes alive
        self._label_index: dict[tuple[int, int, int], int] = {}
        self._lock = threading.Lock()

    def add(self, attributes: dict[str, Any], durations_ns: Iterable[float], context: Any = None) -> None:
        with self._lock:  # a periodic reader flushes from its own thread
            values = self._values
            n = len(values)
            try:
                values.extend(durations_ns)
            except BaseException:
                del values[n:]  # nothing of a failed add is recorded
                raise
            if len(values) > n:
                span = trace.get_current_span(context).get_span_context()
                key = (id(attributes), span.trace_id, span.span_id)
                label = self._label_index.get(key)
                if label is None:
                    label = self._label_index[key] = len(self._labels)
                    light = trace.set_span_in_context(trace.NonRecordingSpan(span)) if span.is_valid else None
                    self._labels.append((attributes, light))
                self._ends.append(len(values))
                self._label_of_add.append(label)
            full = len(values) >= self._max_pending or len(self._labels) >= self._max_labels
        if full:
            self.flush()

    def flush(self) -> None:
        """Record every waiting duration (in the context it was measured in: exemplars link to its trace)."""
        with self._lock:
            values, ends, label_of_add, labels = self._values, self._ends, self._label_of_add, self._labels
            self._values, self._ends, self._label_of_add = array("d"), array("I"), array("I")
            self._labels, self._label_index = [], {}
        record = self._histogram.record
        scale = self._scale
        start = 0
        for end, label in zip(ends, label_of_add, strict=True):
            attributes, context = labels[label]
            for i in range(start, end):
                record(values[i] * scale, attributes, context=context)
            start = end


@dataclass(frozen=True)
class Instruments:
    """hp_otel's metric instruments on one meter."""

    totals: CollectiveTotals
    duration: Histogram
    callback_errors: Counter
    durations: DeferredDurations
    busbw: DeferredDurations  # bus bandwidths (bytes/s), handed over like the durations
    liveness: Liveness
    exposure: ExposureTotals = None  # type: ignore[assignment]  # set by create(); exposed communication

    @classmethod
    def create(cls, meter: Meter) -> Instruments:
        totals = CollectiveTotals()
        histogram = meter.create_histogram(
            schema.METRIC_DURATION,
            unit=schema.METRIC_DURATION_UNIT,
            description="Time from a collective's issue to its completion (the call's return for a synchronous "
            "one; the wait_tensor or Work completion for an async one).",
            explicit_bucket_boundaries_advisory=list(schema.DURATION_BUCKETS_S),
        )
        durations = DeferredDurations(histogram)
        busbw = DeferredDurations(
            meter.create_histogram(
                schema.METRIC_BUSBW,
                unit=schema.METRIC_BUSBW_UNIT,
                description="Bus bandwidth of completed collectives (NCCL-tests' busbw, host time).",
                explicit_bucket_boundaries_advisory=list(schema.BUSBW_BUCKETS),
            ),
            scale=1.0,
        )
        liveness = Liveness()
        liveness.register(meter, totals.fault)

        def observe_calls(options: CallbackOptions) -> Iterable[Observation]:
            try:  # a collection starts: the durations of ended windows go in first
                durations.flush()
                busbw.flush()
            except Exception as exc:
                totals.fault("metric_durations", exc)
            return totals.observe_calls(options)

        meter.create_observable_counter(
            schema.METRIC_CALLS,
            callbacks=[observe_calls],
            unit=schema.METRIC_CALLS_UNIT,
            description="Collective calls issued.",
        )
        meter.create_observable_counter(
            schema.METRIC_BYTES,
            callbacks=[totals.observe_bytes],
            unit=schema.METRIC_BYTES_UNIT,
            description="Bytes handed to collectives (input size).",
        )
        exposure = ExposureTotals()
        exposure.register(meter)
        return cls(
            exposure=exposure,
            totals=totals,
            duration=histogram,
            durations=durations,
            busbw=busbw,
            liveness=liveness,
            callback_errors=meter.create_counter(
                schema.METRIC_CALLBACK_ERRORS,
                unit=schema.METRIC_CALLBACK_ERRORS_UNIT,
                description="Faults inside hp_otel's own callbacks, isolated from the traced code.",
            ),
        )


def get_instruments(meter_provider: MeterProvider | None) -> Instruments:
    """Instruments for a provider, made once per provider (creating them is not free)."""
    return _instruments.get(
        meter_provider,
        lambda: Instruments.create(
            metrics.get_meter(schema.INSTRUMENTATION_NAME, __version__, meter_provider, schema_url=schema.SCHEMA_URL)
        ),
    )
