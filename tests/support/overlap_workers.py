"""Per-rank bodies of the controlled-overlap tests: an async collective, a known compute before its
wait, and a peer that arrives late, with the worker's own clock as the referee (no sleep on the
measured rank: its compute is matmuls until the time is up)."""

from __future__ import annotations

import json
import os
import time
import warnings

import torch
import torch.distributed as dist

LATE_S = 0.30  # rank 1 joins each collective this late: rank 0's collective is in flight that long
COMPUTE_S = 0.15  # rank 0 computes this long between issue and wait
# The referee's times are upper bounds: a waiting thread wakes a little after the work completed
# (tens of ms on a loaded 2-core machine), and the completion is the backend thread's timestamp.
TOLERANCE_NS = 40_000_000


def _compute(seconds: float) -> None:
    a = torch.randn(96, 96)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        a = torch.tanh(a @ a)


def _window(rank: int, issue, provider) -> tuple[dict, dict, object]:  # type: ignore[no-untyped-def]
    from hp_otel import CommDebugMode

    with CommDebugMode(meter_provider=provider) as mode:
        if rank == 1:
            time.sleep(LATE_S)  # the late peer (not the measured rank)
        t_issue = time.time_ns()
        wait = issue()
        t_issued = time.time_ns()
        if rank == 0:
            _compute(COMPUTE_S)
        t_wait = time.time_ns()
        wait()
        t_done = time.time_ns()
    # the referee: the rank's own clock; the collective completed when its blocking wait returned
    if t_done - t_wait < 1_000_000 and t_issued - t_issue > LATE_S * 0.5e9:  # a synchronous call: done on return
        comm = exposed = t_issued - t_issue
    else:
        comm = t_done - t_issue
        exposed = (t_issued - t_issue) + (t_done - t_wait)
    referee = {
        "comm_ns": comm,
        "exposed_ns": exposed,
        "overlap_fraction": (comm - exposed) / comm,
        "compute_ns": t_wait - t_issued,
    }
    ours = mode.get_comm_exposure().total.to_json()
    assert mode.get_callback_error_counts() == {}, mode.get_callback_error_counts()
    return ours, referee, mode


def overlap_worker(rank: int, world_size: int, port: int, out_dir: str) -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from hp_otel.spans import schema
    from hp_otel.testing import metric_points
    from hp_otel.workloads.process_groups import init_gloo

    init_gloo(rank, world_size, port)
    try:
        t = torch.ones(1 << 16)
        results = {}
        reader = InMemoryMetricReader()
        provider = MeterProvider(metric_readers=[reader])

        def eager_async():  # type: ignore[no-untyped-def]
            return dist.all_reduce(t, async_op=True).wait

        def functional():  # type: ignore[no-untyped-def]
            out = torch.ops._c10d_functional.all_reduce(t, "sum", dist.group.WORLD.group_name)
            return lambda: torch.ops._c10d_functional.wait_tensor(out)

        def sync():  # type: ignore[no-untyped-def]
            dist.all_reduce(t)
            return lambda: None

        from hp_otel import CommDebugMode

        with CommDebugMode(meter_provider=MeterProvider()):  # the first window sets up: not a measured one
            dist.all_reduce(t)
        exposed_s = comm_s = 0.0
        for name, issue in (("eager_async", eager_async), ("functional", functional), ("sync", sync)):
            dist.barrier()  # both ranks start the window together: rank 1 is late by LATE_S only
            ours, referee, mode = _window(rank, issue, provider)
            results[name] = {"ours": ours, "referee": referee}
            comm_s += ours["comm_ns"] / 1e9
            exposed_s += ours["exposed_ns"] / 1e9
            for key in ("comm_ns", "exposed_ns"):
                diff = abs(ours[key] - referee[key])
                assert diff <= TOLERANCE_NS, f"rank {rank} {name} {key}: ours {ours[key]} referee {referee[key]}"
            if name == "eager_async":
                mode.write_spans(os.path.join(out_dir, f"spans_rank{rank}.json"))
                with warnings.catch_warnings():  # level 3 without a module: module-less output, said once
                    warnings.simplefilter("ignore", UserWarning)
                    table = mode.generate_comm_debug_tracing_table(noise_level=3)
                assert "communication: comm" in table, table
        # the metrics: the windows' figures added up, per (phase, module)
        points = metric_points(reader, schema.METRIC_COMM_TIME)
        in_flight = sum(p.value for p in points)
        exposed = sum(p.value for p in points if p.attributes[schema.COLLECTIVE_STATE] == schema.STATE_EXPOSED)
        assert abs(in_flight - comm_s) < 1e-6 and abs(exposed - exposed_s) < 1e-6
        with open(os.path.join(out_dir, f"overlap_rank{rank}.json"), "w", encoding="utf-8") as handle:
            json.dump(results, handle)
        dist.barrier()
    finally:
        dist.destroy_process_group()
