"""Per-rank body of the controlled-delay bandwidth test (2 gloo processes).

Rank 1 sleeps `DELAY_S` before each collective, so rank 0's call waits at least that
long.  Each rank times every call itself (the referee: `time.perf_counter_ns` around
the call, sharing nothing with hp_otel) and writes what hp_otel recorded next to it.
A second, counts-only window (an unsampled always-on step) checks the staleness gauges
while rank 0 waits in an all_reduce that rank 1 is late for.
"""

from __future__ import annotations

import json
import os
import threading
import time
import warnings

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from hp_otel.testing import metric_points

DELAY_S = 0.2
N = 1 << 16  # float32 elements: 256 KiB per tensor
ITEM = 4


def _calls(rank: int) -> list[tuple[str, object]]:
    x = torch.ones(N)
    wide = torch.ones(2 * N)
    return [
        ("all_reduce", lambda: dist.all_reduce(x)),
        ("all_gather", lambda: dist.all_gather_into_tensor(torch.empty(2 * N), x)),
        # functional, waited: the completion of gloo's eager reduce_scatter_tensor Work is not seen in torch 2.13
        ("reduce_scatter", lambda: funcol.reduce_scatter_tensor(wide, "sum", 0, dist.group.WORLD).wait()),
        ("all_to_all", lambda: dist.all_to_all_single(torch.empty(2 * N), wide)),
        ("broadcast", lambda: dist.broadcast(x, src=1)),  # the late rank is the root: rank 0 waits
    ]


def bandwidth_worker(rank: int, world_size: int, port: int, out_dir: str) -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from hp_otel import CommDebugMode
    from hp_otel.spans import schema
    from hp_otel.workloads.process_groups import init_gloo

    warnings.simplefilter("ignore", FutureWarning)  # all_gather_into_tensor's rename in torch 2.13
    init_gloo(rank, world_size, port)
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    referee: list[dict[str, object]] = []
    dist.barrier()  # connections made before anything is timed
    with CommDebugMode(meter_provider=provider) as mode:
        dist.all_reduce(torch.ones(N))  # warm-up: the first collective pays one-time costs (on the late rank too)
        dist.barrier()  # then both ranks start together (a barrier has no bandwidth)
        for op, call in _calls(rank):
            if rank == 1:
                time.sleep(DELAY_S)
            start = time.perf_counter_ns()
            call()  # type: ignore[operator]
            referee.append({"op": op, "duration_ns": time.perf_counter_ns() - start})
    collectives = sorted((sp for sp in mode.get_finished_spans()
                          if sp.attributes.get(schema.CALL_KIND) == "collective" and sp.name != "barrier"),
                         key=lambda sp: sp.start_time)  # fmt: skip
    warm_up, spans = collectives[0], collectives[1:]
    recorded = [
        {
            "op": sp.attributes[schema.COLLECTIVE_OP],
            "bytes": sp.attributes[schema.COLLECTIVE_BYTES],
            "group_size": sp.attributes[schema.COLLECTIVE_GROUP_SIZE],
            "duration_ns": sp.end_time - sp.start_time,
            "completion": sp.attributes.get(schema.COLLECTIVE_COMPLETION),
            "bw_bytes": sp.attributes.get(schema.COLLECTIVE_BW_BYTES),
            "algbw": sp.attributes.get(schema.COLLECTIVE_ALGBW),
            "busbw": sp.attributes.get(schema.COLLECTIVE_BUSBW),
        }
        for sp in spans
    ]
    points = metric_points(reader, schema.METRIC_BUSBW)
    metric = {  # less the warm-up's
        "count": sum(p.count for p in points) - 1,
        "sum": sum(p.sum for p in points) - warm_up.attributes[schema.COLLECTIVE_BUSBW],
    }
    mode.write_spans(os.path.join(out_dir, f"spans_rank{rank}.json"))
    table = mode.generate_comm_debug_tracing_table(noise_level=3)

    # --- the staleness gauges in a counts-only window: rank 0 waits in an all_reduce rank 1 is late for
    gauges: dict[str, object] = {}
    dist.barrier()
    with CommDebugMode(meter_provider=provider, record_spans=False):
        if rank == 0:
            watcher = threading.Thread(target=_watch, args=(reader, gauges))
            watcher.start()
        else:
            time.sleep(4 * DELAY_S)
        dist.all_reduce(torch.ones(N))
        if rank == 0:
            watcher.join()
    gauges["after"] = _gauges(reader)
    with open(os.path.join(out_dir, f"bandwidth_rank{rank}.json"), "w") as handle:
        json.dump(
            {"referee": referee, "recorded": recorded, "metric": metric, "table": table, "gauges": gauges}, handle
        )
    dist.barrier()
    dist.destroy_process_group()


def _gauges(reader: object) -> dict[str, object]:
    from hp_otel.spans import schema

    out: dict[str, object] = {}
    for name in (schema.METRIC_IN_FLIGHT, schema.METRIC_SINCE_COMPLETION, schema.METRIC_OLDEST_IN_FLIGHT):
        out[name] = [{"value": p.value, "attributes": dict(p.attributes)} for p in metric_points(reader, name)]
    return out


def _watch(reader: object, gauges: dict[str, object]) -> None:
    """While rank 0 waits in the all_reduce (rank 1 sleeps 4 x DELAY_S first): read the gauges at 2 x DELAY_S."""
    time.sleep(2 * DELAY_S)
    gauges["waiting"] = _gauges(reader)
