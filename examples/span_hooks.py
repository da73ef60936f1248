"""Your own attributes on hp_otel's spans: a collective hook (one gloo process; prints `all_reduce 4.0 {}`)."""

import os

import torch
import torch.distributed as dist
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from hp_otel import CommDebugMode

os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29517")
dist.init_process_group("gloo", rank=0, world_size=1)
exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))


def tag_collective(span, info):  # info: hp_otel.spans.infos.CollectiveInfo
    span.set_attribute("team.job", "llama-70b-pretrain")
    span.set_attribute("team.megabytes", info.bytes / 2**20)


with CommDebugMode(tracer_provider=provider, collective_hook=tag_collective) as mode:
    dist.all_reduce(torch.ones(1024, 1024))
(span,) = exporter.get_finished_spans()
print(span.name, dict(span.attributes)["team.megabytes"], mode.get_callback_error_counts())
dist.destroy_process_group()
