"""OpenTelemetry plumbing: the zero-configuration providers and hp_otel's instruments.

CommDebugMode works with no configuration: it then uses one process-wide SDK
TracerProvider (no processors: the mode hands spans to its own local store) and one
SDK MeterProvider read by an InMemoryMetricReader.  Both are made on first use, so
importing hp_otel costs nothing.  A caller's providers replace them.
"""

from __future__ import annotations

import os
import socket
import threading
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.metrics import CallbackOptions, Counter, Histogram, Meter, MeterProvider, Observation
from opentelemetry.sdk.metrics import MeterProvider as SdkMeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
from opentelemetry.trace import Tracer, TracerProvider

from hp_otel import schema as s
from hp_otel.version import __version__

_lock = threading.Lock()
_default_tracer_provider: SdkTracerProvider | None = None
_default_meter_provider: SdkMeterProvider | None = None
_default_metric_reader: InMemoryMetricReader | None = None


def _int_env(*names: str) -> int | None:
    for name in names:
        value = os.environ.get(name)
        if value is not None and value.strip().lstrip("-").isdigit():
            return int(value)
    return None


def build_resource(extra: dict[str, Any] | None = None) -> Resource:
    """Resource with host, pid and the rank layout that torchrun/msrun put in the environment.

    `Resource.create` also applies OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES.
    """
    from hp_otel.config import run_id_from_env

    attrs: dict[str, Any] = {"host.name": socket.gethostname(), "process.pid": os.getpid()}
    for key, names in (
        (s.RESOURCE_RANK, ("RANK", "RANK_ID", "MS_NODE_ID")),
        (s.RESOURCE_LOCAL_RANK, ("LOCAL_RANK", "DEVICE_ID")),
        (s.RESOURCE_WORLD_SIZE, ("WORLD_SIZE", "RANK_SIZE", "MS_WORKER_NUM")),
    ):
        value = _int_env(*names)
        if value is not None:
            attrs[key] = value
    run_id = run_id_from_env()
    if run_id:
        attrs[s.RESOURCE_RUN_ID] = run_id
    if extra:
        attrs.update(extra)
    if not os.environ.get("OTEL_SERVICE_NAME"):
        attrs.setdefault("service.name", "hp_otel")
    return Resource.create(attrs)


# Providers installed by `hp_otel.configure()` (export.py); they replace the in-memory defaults.
_configured_tracer_provider: TracerProvider | None = None
_configured_meter_provider: MeterProvider | None = None


def set_default_providers(tracer_provider: TracerProvider | None, meter_provider: MeterProvider | None) -> None:
    """Make these the providers CommDebugMode uses when given none (None: back to the in-memory defaults)."""
    global _configured_tracer_provider, _configured_meter_provider
    with _lock:
        _configured_tracer_provider, _configured_meter_provider = tracer_provider, meter_provider


def is_internal_tracer_provider(provider: Any) -> bool:
    """True for hp_otel's processor-less default provider (its spans go nowhere but the local store)."""
    return provider is not None and provider is _default_tracer_provider


def default_tracer_provider() -> TracerProvider:
    global _default_tracer_provider
    if _configured_tracer_provider is not None:
        return _configured_tracer_provider
    with _lock:
        if _default_tracer_provider is None:
            _default_tracer_provider = SdkTracerProvider(resource=build_resource())
        return _default_tracer_provider


def default_meter_provider() -> tuple[MeterProvider, InMemoryMetricReader | None]:
    global _default_meter_provider, _default_metric_reader
    if _configured_meter_provider is not None:
        return _configured_meter_provider, None
    with _lock:
        if _default_meter_provider is None:
            _default_metric_reader = InMemoryMetricReader()
            _default_meter_provider = SdkMeterProvider(
                metric_readers=[_default_metric_reader], resource=build_resource()
            )
        assert _default_metric_reader is not None
        return _default_meter_provider, _default_metric_reader


_tracers: weakref.WeakKeyDictionary[Any, Tracer] = weakref.WeakKeyDictionary()
_instruments: weakref.WeakKeyDictionary[Any, Instruments] = weakref.WeakKeyDictionary()


def _cache_key(provider: Any) -> Any:
    return _Global if provider is None else provider


class _Global:
    """Weak-referenceable stand-in key for the global provider."""


def get_tracer(tracer_provider: TracerProvider | None) -> Tracer:
    """hp_otel's tracer on a provider, made once per provider."""
    key = _cache_key(tracer_provider)
    with _lock:
        tracer = _tracers.get(key)
        if tracer is None:
            tracer = _tracers[key] = trace.get_tracer(s.INSTRUMENTATION_NAME, __version__, tracer_provider)
        return tracer


class CollectiveTotals:
    """Cumulative calls and bytes per metric attribute set, read by the observable counters.

    The recorder adds to plain dicts on the hot path (no SDK call per collective);
    the SDK reads them only when a metric reader collects.
    """

    def __init__(self) -> None:
        self.calls: dict[tuple[Any, ...], int] = {}
        self.bytes: dict[tuple[Any, ...], int] = {}
        self._attrs: dict[tuple[Any, ...], dict[str, Any]] = {}
        # Where a fault inside the callbacks is counted (the recorder of the latest window);
        # the SDK would otherwise swallow it with a log line and drop both counters.
        self._fault_sink: weakref.WeakMethod[Callable[[str, BaseException], None]] | None = None

    def add(self, key: tuple[Any, ...], calls: int, nbytes: int) -> None:
        self.calls[key] = self.calls.get(key, 0) + calls
        self.bytes[key] = self.bytes.get(key, 0) + nbytes

    def set_fault_sink(self, on_fault: Callable[[str, BaseException], None]) -> None:
        """Count callback faults with this (bound) method; held weakly, so no mode is kept alive."""
        self._fault_sink = weakref.WeakMethod(on_fault)  # type: ignore[arg-type]

    def attributes(self, key: tuple[Any, ...]) -> dict[str, Any]:
        attrs = self._attrs.get(key)
        if attrs is None:
            attrs = self._attrs[key] = dict(zip(s.METRIC_ATTRIBUTE_KEYS, key, strict=True))
        return attrs

    def observe_calls(self, options: CallbackOptions) -> Iterable[Observation]:
        return self._observe(self.calls)

    def observe_bytes(self, options: CallbackOptions) -> Iterable[Observation]:
        return self._observe(self.bytes)

    def _observe(self, totals: dict[tuple[Any, ...], int]) -> list[Observation]:
        """Observations of every key that can be described; a failing key is skipped and counted."""
        out = []
        for key, value in list(totals.items()):
            try:
                out.append(Observation(value, self.attributes(key)))
            except Exception as exc:
                sink = self._fault_sink() if self._fault_sink is not None else None
                if sink is not None:
                    sink("metric_observe", exc)
        return out


@dataclass(frozen=True)
class Instruments:
    """hp_otel's metric instruments on one meter."""

    totals: CollectiveTotals
    duration: Histogram
    callback_errors: Counter

    @classmethod
    def create(cls, meter: Meter) -> Instruments:
        totals = CollectiveTotals()
        meter.create_observable_counter(
            s.METRIC_CALLS,
            callbacks=[totals.observe_calls],
            unit=s.METRIC_CALLS_UNIT,
            description="Collective calls issued.",
        )
        meter.create_observable_counter(
            s.METRIC_BYTES,
            callbacks=[totals.observe_bytes],
            unit=s.METRIC_BYTES_UNIT,
            description="Bytes handed to collectives (input size).",
        )
        return cls(
            totals=totals,
            duration=meter.create_histogram(
                s.METRIC_DURATION,
                unit=s.METRIC_DURATION_UNIT,
                description="Wall time of the collective call (launch time for async collectives).",
                explicit_bucket_boundaries_advisory=list(s.DURATION_BUCKETS_S),
            ),
            callback_errors=meter.create_counter(
                s.METRIC_CALLBACK_ERRORS,
                unit=s.METRIC_CALLBACK_ERRORS_UNIT,
                description="Faults inside hp_otel's own callbacks, isolated from the traced code.",
            ),
        )


def get_instruments(meter_provider: MeterProvider | None) -> Instruments:
    """Instruments for a provider, made once per provider (creating them is not free)."""
    key = _cache_key(meter_provider)
    with _lock:
        instruments = _instruments.get(key)
        if instruments is None:
            meter = metrics.get_meter(s.INSTRUMENTATION_NAME, __version__, meter_provider)
            instruments = _instruments[key] = Instruments.create(meter)
        return instruments
