"""Issue 20 item 3: a window over many steps keeps no per-step state that grows.

Every list, dict and set the recorder, the module tracker (its node boundaries included),
the staleness gauges and the deferred histograms hold is measured after each of 160 steps
in one window (the recorder's sweep of awaited collectives made to run every 32 launches,
not 256, so that it runs in the first half too): none is larger in the second half than in
the first.  The node boundaries (`NodeOwners`) are trimmed as
their steps' graphs go away, and the module attribution over the whole window is still the
referee's, also when several forwards run ahead of their backwards (their graphs alive
across the trims).
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch
from referee import Referee

from hp_otel import CommDebugMode
from hp_otel.record import collective_metrics, window_exposure
from hp_otel.sources.pytorch import modules

STEPS = 160


def _sizes(obj: Any, prefix: str, out: dict[str, int], depth: int = 0) -> None:
    """len() of every container attribute of `obj` (and of hp_otel objects it holds, one level down)."""
    try:
        attrs = dict(vars(obj))
    except TypeError:  # __slots__
        attrs = {k: getattr(obj, k) for k in getattr(type(obj), "__slots__", ()) if hasattr(obj, k)}
    for name, value in attrs.items():
        if isinstance(value, (list, dict, set, tuple)):
            out[f"{prefix}.{name}"] = len(value)
        elif depth < 1 and value is not None and type(value).__module__.startswith("hp_otel"):
            _sizes(value, f"{prefix}.{name}", out, depth + 1)


def _owners(model: torch.nn.Module) -> modules.NodeOwners:
    tracker = modules._hook_sets[model][None].tracker
    assert tracker is not None
    return tracker._owners_by_thread[threading.get_ident()]


def _state(mode: CommDebugMode, model: torch.nn.Module) -> dict[str, int]:
    recorder = mode._recorder
    tracker = modules._hook_sets[model][None].tracker
    out: dict[str, int] = {}
    _sizes(recorder, "recorder", out)
    _sizes(tracker, "tracker", out)
    for name in ("durations", "busbw", "liveness", "exposure"):
        _sizes(getattr(recorder._instruments, name), name, out)
    owners = _owners(model)
    out["node boundaries"] = len(owners.bounds)
    out["node units"] = len(owners._units)
    return out


def _assert_bounded(sizes: list[dict[str, int]]) -> None:
    half = len(sizes) // 2
    grown = {
        key: (max(s.get(key, 0) for s in sizes[:half]), max(s.get(key, 0) for s in sizes[half:])) for key in sizes[-1]
    }
    assert {k: v for k, v in grown.items() if v[1] > v[0]} == {}


@pytest.mark.parametrize("record_spans", [False, True])
def test_a_window_over_many_steps_keeps_its_state_bounded(tp_mlp, record_spans: bool, monkeypatch) -> None:
    model, _x = tp_mlp
    monkeypatch.setattr(collective_metrics, "_AWAITING_SWEEP", 32)
    sizes = []
    referee = Referee(model)
    with referee, CommDebugMode(module=model, record_spans=record_spans) as mode:
        for _ in range(STEPS):
            loss = model(torch.randn(4, 16, requires_grad=True)).sum()  # kept until the next step, as loops do
            loss.backward()
            sizes.append(_state(mode, model))
    if record_spans:  # spans and their events are what a traced window keeps: capped by max_spans, not here;
        # its collectives still awaiting their exposure rows are capped per window (window_exposure)
        kept = ("span_feed.pending", "exposure_tracker.finished", "exposure_tracker.awaited")
        for s in sizes:
            for key in [k for k in s if k.endswith(kept)]:
                del s[key]
    _assert_bounded(sizes)
    # untrimmed, the boundaries grew by 6 a step (960 here): now a few steps' worth
    assert max(s["node boundaries"] for s in sizes) < 20 * 6
    assert mode.get_total_counts() == 2 * STEPS
    assert mode.get_comm_module_counts() == referee.module_counts_dict()  # the attribution, across every trim
    assert mode.get_callback_error_counts() == {}


def test_forwards_ahead_of_their_backwards_keep_their_boundaries(tp_mlp) -> None:
    """Microbatches (pipelining, accumulation): four forwards, then their four backwards, over many
    steps; each backward's collectives still count for its modules after the trims in between."""
    model, _x = tp_mlp
    referee = Referee(model)
    boundaries = []
    with referee, CommDebugMode(module=model, record_spans=False) as mode:
        for _ in range(STEPS // 4):
            losses = [model(torch.randn(4, 16, requires_grad=True)).sum() for _ in range(4)]
            for loss in reversed(losses):
                loss.backward()
            del losses, loss
            boundaries.append(len(_owners(model).bounds))
    assert max(boundaries[len(boundaries) // 2 :]) <= max(boundaries[: len(boundaries) // 2])
    assert mode.get_total_counts() == 2 * STEPS
    assert mode.get_comm_module_counts() == referee.module_counts_dict()
    assert mode.get_callback_error_counts() == {}


def test_trimming_keeps_each_live_graph_and_folds_dead_ones(tp_mlp) -> None:
    """Measured on the table itself: a graph kept alive over 40 later steps keeps its boundaries
    (its backward, run last, counts for its modules); those of the steps run meanwhile are folded."""
    model, _x = tp_mlp
    referee = Referee(model)
    with referee, CommDebugMode(module=model, record_spans=False) as mode:
        kept = model(torch.randn(4, 16, requires_grad=True)).sum()
        for _ in range(40):
            model(torch.randn(4, 16, requires_grad=True)).sum().backward()
        owners = _owners(model)
        assert len(owners.bounds) < 20 * 6
        live = [u for u in owners._units if u[1] is not None and u[1]() is not None]
        assert len(live) == 1 and owners.owner(live[0][0]) is not None  # the kept graph's, still owned
        kept.backward()
    assert mode.get_comm_module_counts() == referee.module_counts_dict()
    assert mode.get_comm_module_counts()["fc1"]["backward"]


def test_a_window_that_drops_spans_holds_a_bounded_number_of_collective_events(fake_world, fake_group_timed) -> None:
    """Issue 33 item 10: `max_spans=1000` must bound a long window's memory. The awaited
    collectives' events (each ≈0.84 KB with its info) were all kept for the exposure figures
    until the window's end (up to 65,536); the ones their wait completed become 40-byte rows."""
    import gc

    import torch.distributed as dist

    from hp_otel.record import events as ev

    def live_collective_events() -> int:
        gc.collect()
        return sum(type(o) is ev.Collective for o in gc.get_objects())

    group = dist.group.WORLD.group_name
    seen = []
    with CommDebugMode(max_spans=1000) as mode:
        for _ in range(2):
            for _ in range(8000):
                out = torch.ops._c10d_functional.all_reduce(torch.ones(2), "sum", group)
                torch.ops._c10d_functional.wait_tensor(out)
            seen.append(live_collective_events())
    assert mode.get_total_counts() == 16000 and mode.get_dropped_record_count() > 0
    assert seen[1] <= window_exposure._EXPOSURE_BATCH and seen[1] <= seen[0] + 100, seen
    assert mode.get_comm_exposure().total.collectives == 16000  # every collective still in the figures
