"""Exposed-communication metrics: per (phase, module), the seconds collectives were in flight and
the seconds of that the window's thread waited: one counter, `hp_otel.collective.time`, by
`hp_otel.collective.state` (`exposed`, and `overlapped` for the rest).

Observable counters over cumulative totals, like calls and bytes: a window that ends adds its
figures to a dict (`add_window`), the SDK reads them when a reader collects.  The overlap fraction
over any range is `rate(time{state=overlapped}) / rate(time)` (docs/overlap.md).
"""

from __future__ import annotations

import threading
from array import array
from collections.abc import Callable, Iterable, Iterator

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from hp_otel.spans import schema
from hp_otel.spans.exposure import CommSpan, ExposureReport, summarise

# One collective as the window's end snapshots it: (start_ns, end_ns, is_async, completion, call_ns,
# waited_ns, phase, module).
WindowRow = tuple[int, int, bool, str, int, int, str, str]
_MAX_PENDING_WINDOWS = 256  # without a reader collecting, windows are summed in the step past this
_MAX_PENDING_ROWS = 1 << 17  # ... or once this many collectives wait (5 MiB of rows)
_CELLS = 5  # int64 cells a row


class WindowRows:
    """One window's collectives for its exposure figures, in one int64 array.

    Five cells a collective (start, end, issuing call, wait, and an index into the table of the
    distinct (is_async, completion, phase, module)): 40 bytes in one buffer, no Python object per
    collective.  A tuple and its ints per collective (≈200 bytes) were allocated, at the window's
    end, into the holes the window's freed spans left throughout the allocator's arenas, and kept
    those arenas from going back to the system after `clear()` (docs/reliability.md).  A row whose
    values an int64 cannot hold is kept as a tuple, so every row reads back as it was added.
    """

    __slots__ = ("_cells", "_kind_of", "_kinds", "_others")

    def __init__(self) -> None:
        self._cells = array("q")
        self._kinds: list[tuple[bool, str, str, str]] = []
        self._kind_of: dict[tuple[bool, str, str, str], int] | None = None  # while adding; seal() drops it
        self._others: list[WindowRow] | None = None  # rows the int64 cells cannot hold

    def __len__(self) -> int:
        return len(self._cells) // _CELLS + (len(self._others) if self._others else 0)

    def add(self, start_ns: int, end_ns: int, is_async: bool, completion: str, call_ns: int, waited_ns: int,
            phase: str, module: str) -> None:  # fmt: skip
        cells = self._cells
        n = len(cells)
        try:
            kind_of = self._kind_of
            if kind_of is None:
                kind_of = self._kind_of = {kind: i for i, kind in enumerate(self._kinds)}
            kind = (is_async, completion, phase, module)
            index = kind_of.get(kind)
            if index is None:
                index = kind_of[kind] = len(self._kinds)
                self._kinds.append(kind)
            cells.append(start_ns)
            cells.append(end_ns)
            cells.append(call_ns)
            cells.append(waited_ns)
            cells.append(index)
        except (OverflowError, TypeError):  # beyond int64, not an int, an unhashable name: as it came
            del cells[n:]
            if self._others is None:
                self._others = []
            self._others.append((start_ns, end_ns, is_async, completion, call_ns, waited_ns, phase, module))

    def seal(self) -> None:
        """The window ended: drop what only adding needs."""
        self._kind_of = None

    def __iter__(self) -> Iterator[WindowRow]:
        kinds = self._kinds
        cells = iter(self._cells)
        for start, end, call, waited, index in zip(cells, cells, cells, cells, cells, strict=True):
            is_async, completion, phase, module = kinds[index]
            yield (start, end, is_async, completion, call, waited, phase, module)
        if self._others:
            yield from self._others

    @property
    def nbytes(self) -> int:
        """Bytes the cells hold (their buffer's capacity; the kind table and any tuple rows aside)."""
        return self._cells.buffer_info()[1] * self._cells.itemsize


def report_of(rows: Iterable[WindowRow]) -> ExposureReport:
    """The exposure of one window's snapshot (spans/exposure.py)."""
    return summarise(
        CommSpan.of(start, end, is_async=is_async, completion=completion, call_ns=call, waited_ns=waited,
                    phase=phase, module=module)
        for start, end, is_async, completion, call, waited, phase, module in rows
    )  # fmt: skip


class ExposureTotals:
    """Cumulative seconds per (phase, module label); read by two observable counters.

    A window that ends hands its snapshot over (`defer`); the arithmetic runs when a reader
    collects (or once `_MAX_PENDING_WINDOWS` windows or `_MAX_PENDING_ROWS` collectives wait: memory
    stays bounded without a reader), off the training step's path.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: list[tuple[WindowRows, Callable[[str], str | None] | None]] = []
        self._pending_rows = 0
        self.comm_ns: dict[tuple[str, str | None], int] = {}
        self.exposed_ns: dict[tuple[str, str | None], int] = {}

    def defer(self, rows: WindowRows, module_label: Callable[[str], str | None] | None = None) -> None:
        """Hand over a window's rows; `module_label` maps each module to its series' `hp_otel.module.fqn`
        (the window's `metric_module_depth`; None from it: no module attribute), as the other metrics."""
        with self._lock:
            self._pending.append((rows, module_label))
            self._pending_rows += len(rows)
            full = len(self._pending) >= _MAX_PENDING_WINDOWS or self._pending_rows >= _MAX_PENDING_ROWS
        if full:
            self.flush()

    def flush(self) -> None:
        """Add every window handed over since the last collection."""
        with self._lock:
            pending, self._pending = self._pending, []
            self._pending_rows = 0
        for rows, module_label in pending:
            report = report_of(rows)
            with self._lock:
                for (phase, module), e in report.by_module.items():
                    key = (phase, module_label(module) if module_label is not None else module)
                    self.comm_ns[key] = self.comm_ns.get(key, 0) + e.comm_ns
                    self.exposed_ns[key] = self.exposed_ns.get(key, 0) + e.exposed_ns

    def observe_time(self, options: CallbackOptions) -> Iterable[Observation]:
        """Per (phase, module): the exposed seconds and the overlapped rest, each its state's point."""
        self.flush()
        with self._lock:
            items = [(key, ns, self.exposed_ns.get(key, 0)) for key, ns in self.comm_ns.items()]
        out = []
        for (phase, module), comm_ns, exposed_ns in items:
            base = {schema.PHASE: phase} if module is None else {schema.PHASE: phase, schema.MODULE_FQN: module}
            out.append(Observation(exposed_ns / 1e9, {**base, schema.COLLECTIVE_STATE: schema.STATE_EXPOSED}))
            overlapped = max(comm_ns - exposed_ns, 0) / 1e9
            out.append(Observation(overlapped, {**base, schema.COLLECTIVE_STATE: schema.STATE_OVERLAPPED}))
        return out

    def register(self, meter: Meter) -> None:
        meter.create_observable_counter(
            schema.METRIC_COMM_TIME,
            callbacks=[self.observe_time],
            unit=schema.METRIC_COMM_TIME_UNIT,
            description="Time collectives were in flight (union of [issue, completion] per window), by state: "
            "exposed (the window's thread waited for communication) or overlapped.",
        )
