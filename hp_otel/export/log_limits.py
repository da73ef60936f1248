"""One line per kind per interval from the OpenTelemetry SDK's and exporters' own logs.

Against a dead endpoint the OTLP exporters log every retry and every failed batch, and
the batch processor every full queue: tens of lines a minute that bury the training
log. While telemetry is configured, a filter on those loggers lets the first record of
each kind (logger, and message with its numbers left out) through per interval; the next one that passes
says how many were held back meanwhile. hp_otel's own counters (`Telemetry.failed_spans`,
`dropped_spans`) still count every event.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable

from hp_otel.common._otel_compat import PRIVATE_LOGGER_MODULES

# The modules of the SDK and exporters that log per export attempt (each does getLogger(__name__));
# the private ones are listed (and probed) in `_otel_compat`.
NOISY_LOGGERS = (
    "opentelemetry.exporter.otlp.proto.grpc.exporter",
    "opentelemetry.exporter.otlp.proto.grpc.metric_exporter",
    "opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
    "opentelemetry.exporter.otlp.proto.http.metric_exporter",
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "opentelemetry.exporter.otlp.common.http",
    "opentelemetry.sdk.trace.export",
    *PRIVATE_LOGGER_MODULES,
)
DEFAULT_INTERVAL_S = 60.0
# A kind is the message with its numbers left out: the OTLP exporters format theirs before logging
# ("retrying in 1.10s", "... 1.78s", a port, a batch size), so each retry's text differs.
_NUMBERS = re.compile(r"\d+(?:\.\d+)?")


class RateLimitFilter(logging.Filter):
    """Pass the first record of each kind (logger, message without its numbers) per `interval_s`; count the rest."""

    def __init__(self, interval_s: float = DEFAULT_INTERVAL_S, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.interval_s = interval_s
        self.clock = clock
        self._lock = threading.Lock()
        self._kinds: dict[tuple[str, str], tuple[float, int]] = {}  # kind -> (when it last passed, held back since)

    def filter(self, record: logging.LogRecord) -> bool:
        kind = (record.name, _NUMBERS.sub("#", str(record.msg)))
        now = self.clock()
        with self._lock:
            last, held = self._kinds.get(kind, (None, 0))
            if last is not None and now - last < self.interval_s:
                self._kinds[kind] = (last, held + 1)
                return False
            self._kinds[kind] = (now, 0)
        if held:
            record.msg = f"{record.msg} [hp_otel: {held} more like this in the last {self.interval_s:.0f} s not shown]"
        return True


_filter: RateLimitFilter | None = None


def limit_sdk_logs(interval_s: float = DEFAULT_INTERVAL_S) -> RateLimitFilter:
    """Install the filter on the noisy loggers (once; a later call changes its interval)."""
    global _filter
    if _filter is None:
        _filter = RateLimitFilter(interval_s)
        for name in NOISY_LOGGERS:
            logging.getLogger(name).addFilter(_filter)
    _filter.interval_s = interval_s
    return _filter


def unlimit_sdk_logs() -> None:
    """Remove the filter (hp_otel.shutdown())."""
    global _filter
    if _filter is not None:
        for name in NOISY_LOGGERS:
            logging.getLogger(name).removeFilter(_filter)
        _filter = None
