"""Per-rank body of the step loop's collectives file test: each rank runs STEPS steps marked with
`hp_otel.step()` under the always-on instrumentor (a ratio sampler, `collectives_dir=`), each step a
few real gloo collectives on the world and on a pair group, rank 3 late to every world all_reduce.

Beside the instrumentor's collectives file it writes what an independent referee saw: per step,
the collective ops a TorchDispatchMode (`referee.Referee`, nothing shared with hp_otel) counted,
the ops the step itself issued, and whether the step was kept (its `rank_step` span exported);
and, as the comparison, a spans file of the exported collective spans of the steps the ring holds.
"""

from __future__ import annotations

import json
import os
import time

import torch
import torch.distributed as dist

STEPS = 16
RATIO = 0.5
KEEP = 3
LATE_RANK, LATE_S = 3, 0.03


def ring_worker(rank: int, world_size: int, port: int, out_dir: str) -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
    from referee import Referee

    import hp_otel
    from hp_otel.always_on.instrumentation import active_session
    from hp_otel.always_on.instrumentor import HpOtelInstrumentor
    from hp_otel.spans import schema
    from hp_otel.spans.otlp_json import write_spans
    from hp_otel.workloads.process_groups import init_gloo

    init_gloo(rank, world_size, port)
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    pair = pairs[rank // 2]
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(RATIO)), shutdown_on_exit=False)
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    folder = os.path.join(out_dir, "collectives")
    instrumentor = HpOtelInstrumentor()
    instrumentor.instrument(
        tracer_provider=tracer_provider, meter_provider=meter_provider, collectives_dir=folder, collectives_steps=KEEP
    )
    sizes = []
    referee_steps: dict[str, dict[str, int]] = {}
    issued: dict[str, list[list[object]]] = {}
    try:
        for n in range(STEPS):
            with hp_otel.step(n), Referee() as referee:
                t = torch.full((8,), float(rank))
                gathered = torch.empty(2 * 4 + n % 2 * 2)  # the pair's all_gather grows on odd steps
                if rank == LATE_RANK:
                    time.sleep(LATE_S)
                dist.all_reduce(t)
                dist.all_gather_into_tensor(gathered, torch.ones(4 + n % 2), group=pair)
                dist.all_reduce(t, group=pair)
            referee_steps[str(n)] = dict(referee.counts)
            issued[str(n)] = [["all_reduce", [8]], ["all_gather", [4 + n % 2]], ["all_reduce", [8]]]
            path = os.path.join(folder, f"collectives-rank{rank}.json")
            sizes.append(os.path.getsize(path) if os.path.exists(path) else 0)
        faults = active_session().collectives.faults  # type: ignore[union-attr]
    finally:
        instrumentor.uninstrument()
    spans = exporter.get_finished_spans()
    kept = sorted(int(s.attributes[schema.STEP]) for s in spans if schema.is_rank_step_span(s.name, s.attributes))
    windows = {f"step {n}" for n in kept[-KEEP:]}
    collectives = [s for s in spans if s.attributes.get(schema.COLLECTIVE_WINDOW) in windows]
    write_spans(os.path.join(out_dir, f"spans_rank{rank}.json"), collectives)
    result = {"kept": kept, "referee": referee_steps, "issued": issued, "sizes": sizes, "faults": faults}
    with open(os.path.join(out_dir, f"ring_rank{rank}.json"), "w", encoding="utf-8") as handle:
        json.dump(result, handle)
    dist.barrier()
    dist.destroy_process_group()
