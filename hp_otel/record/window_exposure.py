"""A window's collectives kept for its exposed-communication figures (spans/exposure.py).

Finished collectives wait as events until `_EXPOSURE_BATCH` do, then become compact rows
(`WindowRows`); those awaiting a completion (which may still move their end and wait) wait until
the window stops, at most `_MAX_AWAITING` of them. The figures are computed when asked for or when
a metric reader collects: not on the step's path.
"""

from __future__ import annotations

from hp_otel.record import events as ev
from hp_otel.record.exposure_metrics import WindowRows, report_of
from hp_otel.record.faults import FaultSink, weak_sink
from hp_otel.record.instruments import Instruments
from hp_otel.record.metric_labels import ModuleLabel
from hp_otel.spans import schema
from hp_otel.spans.exposure import ExposureReport

_MAX_WINDOW_COLLECTIVES = 65536  # what the exposure figures of one window are computed from
_EXPOSURE_BATCH = 4096  # finished collectives held as events before their exposure rows are written
_MAX_AWAITING = 4096  # awaited collectives whose rows wait (beyond, the oldest are written as they are)


def _write_rows(rows: WindowRows, collectives: list[ev.Collective]) -> None:
    """Add these collectives' rows (their events can go: nothing moves them now)."""
    add = rows.add
    for e in collectives:
        place = e.place
        add(e.start_ns, e.end_ns, e.info.is_async, e.completion, e.returned_ns - e.start_ns, e.waited_ns,
            place.phase, place.fqn)  # fmt: skip


class WindowExposure:
    """The open window's collectives (`add`), and the last stopped window's rows and report (`report`)."""

    def __init__(self, instruments: Instruments, module_label: ModuleLabel, on_fault: FaultSink) -> None:
        self._instruments = instruments
        self._module_label = module_label
        self._on_fault = weak_sink(on_fault)  # no reference cycle back to the recorder
        self.rows = WindowRows()  # the open window's rows so far
        self.finished: list[ev.Collective] = []  # finished, not yet in `rows`
        self.awaited: list[ev.Collective] = []  # launched, awaiting completion
        self._awaited_limit = _EXPOSURE_BATCH  # awaited ones held before those done are folded into rows
        self.room = _MAX_WINDOW_COLLECTIVES  # collectives the window's rows may still take
        self.stopped_rows = WindowRows()  # the last stopped window's, for `report`
        self._report: ExposureReport | None = None

    def start(self) -> None:
        self.rows = WindowRows()
        self.finished = []
        self.awaited = []
        self._awaited_limit = _EXPOSURE_BATCH
        self.room = _MAX_WINDOW_COLLECTIVES

    def add(self, event: ev.Collective, awaits: bool) -> None:
        """One collective of the open window (a fake group's calls overlap nothing: left out)."""
        if self.room <= 0 or event.info.fake_group:
            return
        self.room -= 1
        if awaits:
            awaited = self.awaited
            awaited.append(event)
            if len(awaited) >= self._awaited_limit:
                self._fold_awaited()
        else:
            finished = self.finished
            finished.append(event)
            if len(finished) >= _EXPOSURE_BATCH:
                self.finished = []
                _write_rows(self.rows, finished)

    def _fold_awaited(self) -> None:
        """Write the rows of the awaited collectives nothing can move any more (completed by their
        `wait_tensor`, which reports its wait first); keep the others as events, at most
        `_MAX_AWAITING` (beyond, the oldest are written as they are, as the metrics' sweep does).
        So a long window holds a bounded number of events whatever `max_spans` drops."""
        still: list[ev.Collective] = []
        final: list[ev.Collective] = []
        for event in self.awaited:
            (final if event.completion == schema.COMPLETION_WAIT else still).append(event)
        if len(still) > _MAX_AWAITING:
            final.extend(still[:-_MAX_AWAITING])
            still = still[-_MAX_AWAITING:]
        _write_rows(self.rows, final)
        self.awaited = still
        self._awaited_limit = max(_EXPOSURE_BATCH, 2 * len(still))  # amortised: each event swept O(1) times

    def stop(self) -> None:
        """Snapshot the window's rows: its report is computed when asked for, its metrics when collected."""
        finished, self.finished = self.finished, []
        awaited, self.awaited = self.awaited, []
        rows, self.rows = self.rows, WindowRows()
        try:
            _write_rows(rows, finished)
            _write_rows(rows, awaited)
            rows.seal()
            if not rows:
                return
            self.stopped_rows, self._report = rows, None
            self._instruments.exposure.defer(rows, self._module_label)
        except Exception as exc:
            self._on_fault("exposure", exc)

    def report(self) -> ExposureReport:
        """The last stopped window's exposed communication (docs/overlap.md)."""
        if self._report is None:
            try:
                self._report = report_of(self.stopped_rows)
            except Exception as exc:
                self._on_fault("exposure", exc)
                self._report = ExposureReport()
        return self._report
