"""Per-rank body of the completion test: rank 1 arrives late to every collective.

Rank 0 launches at once; its collectives can only complete when rank 1 joins, DELAY_S
later.  A span that ends at the launch would last microseconds; one that ends at the
completion lasts about DELAY_S.  Each rank writes what it measured to `out_dir`.
"""

from __future__ import annotations

import json
import os
import time

import torch
import torch.distributed as dist

DELAY_S = 0.5


def late_rank_worker(rank: int, world_size: int, port: int, out_dir: str) -> None:
    import torch.distributed._functional_collectives as funcol
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from hp_otel import CommDebugMode
    from hp_otel.spans import schema
    from hp_otel.testing import metric_points
    from hp_otel.workloads.process_groups import init_gloo

    init_gloo(rank, world_size, port)
    try:
        t = torch.ones(256)
        launch: dict[str, float] = {}
        reader = InMemoryMetricReader()
        calls = (
            ("_c10d_functional.all_reduce", lambda: funcol.all_reduce(t, "sum", dist.group.WORLD)),
            ("c10d.allreduce_", lambda: dist.all_reduce(t, async_op=True)),
            ("c10d.broadcast_", lambda: dist.broadcast(t, src=0)),  # sync: the wrapper waits
        )
        for _, call in calls:  # warm up: first calls import and set up for seconds
            handle = call()
            if handle is not None:
                handle.wait()
        dist.barrier()
        with CommDebugMode(meter_provider=MeterProvider(metric_readers=[reader])) as mode:
            for name, call in calls:
                if rank == 1:
                    time.sleep(DELAY_S)
                t0 = time.perf_counter()
                handle = call()
                launch[name] = time.perf_counter() - t0  # what the call itself took
                if isinstance(handle, torch.Tensor):
                    handle.wait()  # AsyncCollectiveTensor: wait_tensor
                elif handle is not None:
                    handle.wait()
        spans = {
            s.attributes[schema.COLLECTIVE_NAME]: s
            for s in mode.get_finished_spans()
            if s.attributes[schema.CALL_KIND] == schema.KIND_COLLECTIVE
        }
        durations = {p.attributes[schema.COLLECTIVE_NAME]: p.sum for p in metric_points(reader, schema.METRIC_DURATION)}
        result = {
            name: {
                "launch_s": launch[name],
                "span_s": (span.end_time - span.start_time) / 1e9,
                "histogram_s": durations.get(name),
                "completion": span.attributes.get(schema.COLLECTIVE_COMPLETION),
            }
            for name, span in spans.items()
        }
        result["faults"] = mode.get_callback_error_counts()
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(result, f)
        dist.barrier()
    finally:
        dist.destroy_process_group()
