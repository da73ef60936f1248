"""The window's exposure rows (record/exposure_metrics.WindowRows): one int64 array that reads back as
the per-collective tuples it replaces, gives the same figures, and stays bounded per window."""

from __future__ import annotations

import random

import pytest

from hp_otel import CommDebugMode
from hp_otel.record import exposure_metrics, window_exposure
from hp_otel.record.exposure_metrics import ExposureTotals, WindowRows, report_of
from hp_otel.spans import exposure, schema
from hp_otel.spans.infos import CollectiveInfo, ModuleInfo

pytestmark = pytest.mark.torch_free  # needs no torch: not rerun on torch 2.14.1 (tests/support/markers.py)

_COMPLETIONS = (schema.COMPLETION_CALL, schema.COMPLETION_LAUNCH, schema.COMPLETION_WAIT, schema.COMPLETION_WORK)


def _random_rows(rng: random.Random, n: int) -> list[exposure_metrics.WindowRow]:
    rows = []
    for _ in range(n):
        start = rng.randrange(0, 10**6)
        end = start + rng.randrange(-50, 5_000)  # some reversed: CommSpan.of clamps them
        phase, module = rng.choice(("forward", "backward")), rng.choice(("", "l0", "l1.mlp"))
        rows.append((start, end, rng.random() < 0.6, rng.choice(_COMPLETIONS), rng.randrange(0, 3_000),
                     rng.randrange(0, 3_000), phase, module))  # fmt: skip
    return rows


def test_rows_read_back_as_added_and_give_the_per_tuple_figures() -> None:
    rng = random.Random(23)
    for _ in range(20):
        rows = _random_rows(rng, rng.randrange(1, 400))
        rows.append((2**63, 2**64, True, schema.COMPLETION_WORK, 5, 1, "forward", "big"))  # past int64: kept as a tuple
        rows.append((10, 20.5, False, schema.COMPLETION_CALL, 0, 0, "forward", "float"))  # not an int: as it came
        rng.shuffle(rows)
        store = WindowRows()
        for row in rows:
            store.add(*row)
        assert len(store) == len(rows)
        assert sorted(store, key=repr) == sorted(rows, key=repr)
        # the old per-tuple computation (a list of these tuples) and the array: the same figures
        assert (
            report_of(store)
            == report_of(rows)
            == exposure.summarise(
                exposure.CommSpan.of(a, b, is_async=c, completion=d, call_ns=e, waited_ns=f, phase=g, module=h)
                for a, b, c, d, e, f, g, h in rows
            )
        )


_ASYNC = CollectiveInfo("c10d.all_reduce_", "all_reduce", 2, "tp", (0, 1), (4,), (4,), "f32", 16, "sum", True)
_SYNC = CollectiveInfo("_c10d_functional.all_reduce", "all_reduce", 2, "tp", (0, 1), (4,), (4,), "f32", 16, "sum")


def _random_window(mode: CommDebugMode, rng: random.Random, collectives: int) -> None:
    """Sync and async collectives in two modules, async ones completed and waited for at random points."""
    observer, clock, awaited = mode.observer, 1_000_000, []
    for i in range(collectives):
        module = ModuleInfo(f"l{i % 2}", f"l{i % 2}", "Linear")
        observer.on_module_enter(module, "forward")
        start, clock = clock, clock + rng.randrange(1, 2_000)
        if rng.random() < 0.5:
            token = observer.on_collective(_ASYNC, start, clock, awaits_completion=True)
            awaited.append((token, start + rng.randrange(1, 20_000)))
        else:
            observer.on_collective(_SYNC, start, clock)
        observer.on_module_exit(module.fqn, "forward")
        if awaited and rng.random() < 0.4:
            token, done = awaited.pop(rng.randrange(len(awaited)))
            wait_from = max(clock, done - rng.randrange(0, 10_000))
            observer.on_collective_wait(token, wait_from, max(done, wait_from))
            observer.on_collective_complete(token, max(done, wait_from), schema.COMPLETION_WAIT)
    for token, done in awaited:
        observer.on_collective_complete(token, done, schema.COMPLETION_WORK)


def test_window_exposure_equals_what_its_spans_say(monkeypatch) -> None:
    """The rows written in batches during the window (and the awaited ones at its end) give the figures
    the finished spans' own attributes give (spans/exposure.by_window, an independent path)."""
    monkeypatch.setattr(window_exposure, "_EXPOSURE_BATCH", 7)
    for seed in range(5):
        rng = random.Random(seed)
        with CommDebugMode() as mode:
            _random_window(mode, rng, rng.randrange(20, 300))
        (from_spans,) = exposure.by_window(mode.get_finished_spans()).values()
        assert from_spans.total.collectives == mode.get_total_counts()
        assert mode.get_comm_exposure() == from_spans


def test_per_window_exposure_storage_is_bounded(monkeypatch) -> None:
    """At most `_MAX_WINDOW_COLLECTIVES` rows a window, in one array (no object per collective); at most
    `_EXPOSURE_BATCH` finished collectives wait as events; windows waiting for a reader are bounded too."""
    monkeypatch.setattr(window_exposure, "_MAX_WINDOW_COLLECTIVES", 300)
    monkeypatch.setattr(window_exposure, "_EXPOSURE_BATCH", 32)
    monkeypatch.setattr(exposure_metrics, "_MAX_PENDING_ROWS", 500)
    waiting = 0
    with CommDebugMode(max_spans=10) as mode:
        observer = mode.observer
        for i in range(2_000):
            observer.on_collective(_SYNC, 1_000 * i, 1_000 * i + 500)
            waiting = max(waiting, len(mode._recorder.exposure_tracker.finished))
    rows = mode._recorder.exposure_tracker.stopped_rows
    assert waiting < 32 and len(rows) == 300 and not rows._others
    assert rows.nbytes < 2 * 40 * 300  # 40 bytes a collective (the array over-allocates a little)
    assert mode.get_comm_exposure().total.collectives == 300
    assert mode.get_comm_exposure().total.comm_ns == 300 * 500

    totals = ExposureTotals()
    totals.defer(rows)
    assert len(totals._pending) == 1 and totals.comm_ns == {}  # waits for a reader
    totals.defer(rows)  # 600 rows wait now: summed at once, memory stays bounded without a reader
    assert totals._pending == [] and totals.comm_ns == {("forward", ""): 2 * 300 * 500}
