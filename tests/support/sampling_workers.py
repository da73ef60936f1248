"""Per-rank body of the same-sampling proof (issue 30 item 4): each rank marks STEPS steps with
`hp_otel.step()` under a ratio sampler, runs a real gloo all_reduce in a window inside each, and
writes what it exported: the steps its `rank_step` spans say were kept, each kept step's trace id,
the collective spans of each trace, and the collective calls its counter counted."""

from __future__ import annotations

import json
import os

import torch
import torch.distributed as dist

STEPS = 16
RATIO = 0.5


def sampling_worker(rank: int, world_size: int, port: int, out_dir: str) -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    import hp_otel
    from hp_otel import CommDebugMode
    from hp_otel.spans import schema
    from hp_otel.testing import metric_points
    from hp_otel.workloads.process_groups import init_gloo

    init_gloo(rank, world_size, port)
    try:
        exporter = InMemorySpanExporter()
        tracer_provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(RATIO)), shutdown_on_exit=False)
        tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
        reader = InMemoryMetricReader()
        meter_provider = MeterProvider(metric_readers=[reader])
        t = torch.ones(8)
        for n in range(STEPS):  # the run id comes from HP_OTEL_RUN_ID, as a launcher would set it
            with hp_otel.step(n, rank=rank, tracer_provider=tracer_provider):
                with CommDebugMode(tracer_provider=tracer_provider, meter_provider=meter_provider):
                    dist.all_reduce(t)
        spans = exporter.get_finished_spans()
        kept = {
            s.attributes[schema.STEP]: s.context.trace_id
            for s in spans
            if schema.is_rank_step_span(s.name, s.attributes)
        }
        collectives: dict[str, int] = {}
        for s in spans:
            if s.attributes.get(schema.COLLECTIVE_OP) is not None:
                key = format(s.context.trace_id, "032x")
                collectives[key] = collectives.get(key, 0) + 1
        result = {
            "kept": {str(n): format(trace_id, "032x") for n, trace_id in kept.items()},
            "trace_ids": sorted({format(s.context.trace_id, "032x") for s in spans}),
            "collective_spans": collectives,
            "calls_counted": sum(p.value for p in metric_points(reader, schema.METRIC_CALLS)),
        }
        with open(os.path.join(out_dir, f"sampling_rank{rank}.json"), "w", encoding="utf-8") as handle:
            json.dump(result, handle)
        dist.barrier()
    finally:
        dist.destroy_process_group()
