"""Async collectives end at their completion, not at their launch."""

from __future__ import annotations

import json

import completion_workers
import pytest
import torch
import torch.multiprocessing as mp

from hp_otel import CommDebugMode
from hp_otel.spans import schema
from hp_otel.workloads.process_groups import free_port
from hp_otel.workloads.tp_mlp import train_step


def _collectives(mode: CommDebugMode) -> list:
    return [s for s in mode.get_finished_spans() if s.attributes[schema.CALL_KIND] == schema.KIND_COLLECTIVE]


def test_functional_collectives_end_at_their_wait(tp_mlp) -> None:
    model, x = tp_mlp
    with CommDebugMode(module=model) as mode:
        train_step(model, x)
    spans = _collectives(mode)
    assert [s.attributes[schema.COLLECTIVE_COMPLETION] for s in spans] == ["wait", "wait"]
    assert mode.get_callback_error_counts() == {}


def test_functional_collective_never_waited_says_launch(fake_world) -> None:
    import torch.distributed as dist

    with CommDebugMode() as mode:
        torch.ops._c10d_functional.all_reduce(torch.ones(4), "sum", dist.group.WORLD.group_name)
    (span,) = _collectives(mode)
    assert span.attributes[schema.COLLECTIVE_COMPLETION] == "launch"


def test_live_span_ends_at_the_wait(fake_world) -> None:
    import torch.distributed as dist
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    t = torch.ones(4)
    with CommDebugMode(tracer_provider=provider, live_spans=True) as mode:
        out = torch.ops._c10d_functional.all_reduce(t, "sum", dist.group.WORLD.group_name)
        assert exporter.get_finished_spans() == ()  # launched, not complete: still open
        torch.ops._c10d_functional.wait_tensor(out)
        (span,) = exporter.get_finished_spans()  # ended at its wait, inside the window
    assert span.attributes[schema.COLLECTIVE_COMPLETION] == "wait"
    assert mode.get_callback_error_counts() == {}


@pytest.mark.multiprocess  # two gloo processes
def test_late_rank_completion_not_launch(tmp_path) -> None:
    mp.spawn(completion_workers.late_rank_worker, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)
    rank0 = json.loads((tmp_path / "rank0.json").read_text())
    assert rank0.pop("faults") == {}
    delay = completion_workers.DELAY_S
    expected = {"_c10d_functional.all_reduce": "wait", "c10d.allreduce_": "work", "c10d.broadcast_": "work"}
    assert {name: r["completion"] for name, r in rank0.items()} == expected
    for name, r in rank0.items():
        assert r["span_s"] >= 0.5 * delay, (name, r)  # rank 0 waited for rank 1 (slack: a loaded machine)
        assert r["histogram_s"] == pytest.approx(r["span_s"], rel=1e-6), (name, r)
    # the async launches returned long before rank 1 arrived: the span is not the launch
    assert rank0["_c10d_functional.all_reduce"]["launch_s"] < 0.4 * delay
    assert rank0["c10d.allreduce_"]["launch_s"] < 0.4 * delay
    print("rank 0:", json.dumps(rank0, indent=1))


def test_watchdog_probe_is_done_when_dtensor_reads_the_result(tp_mlp) -> None:
    """DTensor waits for its collectives by reading their AsyncCollectiveTensor (out of any
    mode's sight): the in-flight probe must see that wait too, not only a direct wait_tensor."""
    model, x = tp_mlp
    with CommDebugMode(module=model) as mode:
        mode._recorder.wants_completion = True  # what the hang watchdog switches on
        train_step(model, x)
        mode._recorder.forget_completed()
        assert mode._recorder.in_flight() == []  # both all_reduces were waited for
    assert [s.attributes[schema.COLLECTIVE_COMPLETION] for s in _collectives(mode)] == ["wait", "wait"]
