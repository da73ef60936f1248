"""`python -m benchmarks --telemetry`: what one rank sends, with the always-on instrumentor's defaults.

The llama step (`llama.py`) on real gloo ranks of a (dp x tp) CPU mesh, each rank recorded by
`HpOtelInstrumentor().instrument(module=model)` and nothing else set but what a deployment
sets: OTLP (http/protobuf, no compression) to a loopback receiver that counts the bytes of
every request per path, Prometheus `/metrics` on port + local rank, a ratio sampler (the same
steps sampled on every rank).  Each rank marks its steps with `hp_otel.step(n)`; after each it
flushes the span processor and the OTLP metric reader, so the bytes the receiver got in between are
that step's: the spans of a sampled step, none of an unsampled one, and one metrics export (the
SDK exports every `OTEL_METRIC_EXPORT_INTERVAL`, 60 s by default, not every step: a step costs
a fraction of one export).  At the end each rank scrapes its own `/metrics` and counts the series
(sample lines).  Run for two model depths, the series count must not grow with the depth: the
instrumentor keeps one module level in the metrics (`metric_module_depth`, default 1).
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from hp_otel.cli.progress import Progress, quiet
from hp_otel.common.input_files import read_json

TRACES, METRICS = "/v1/traces", "/v1/metrics"
RUN_ID = "telemetry-volume"  # fixed: the same steps are sampled in every run


class OtlpReceiver:
    """A loopback OTLP/HTTP receiver: answers 200 to every POST and counts its body bytes per path."""

    def __init__(self) -> None:
        counts: dict[str, list[int]] = {}
        lock = threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with lock:
                    counts.setdefault(self.path, []).append(len(body))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self._counts, self._lock = counts, lock
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def sent(self, path: str) -> tuple[int, int]:
        """(requests, body bytes) received on `path` so far."""
        with self._lock:
            sizes = list(self._counts.get(path, ()))
        return len(sizes), sum(sizes)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass
class StepVolume:
    step: int
    sampled: bool
    span_bytes: int
    span_requests: int
    metric_bytes: int  # one metrics export after the step (cumulative: every series each time)


@dataclass
class RankVolume:
    rank: int
    layers: int
    prometheus_series: int  # sample lines of the rank's /metrics
    hp_otel_series: int  # of those, hp_otel's metrics (the rest: the Prometheus client's process_* / python_*)
    series_by_metric: dict[str, int]
    steps: list[StepVolume] = field(default_factory=list)

    def sampled(self) -> list[StepVolume]:
        return [s for s in self.steps if s.sampled]

    def unsampled(self) -> list[StepVolume]:
        return [s for s in self.steps if not s.sampled]


def _series(text: str) -> tuple[int, dict[str, int]]:
    """Sample lines of a Prometheus text exposition, and per metric family (name without bucket/sum/count)."""
    by_metric: dict[str, int] = {}
    total = 0
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        total += 1
        name = line.split("{", 1)[0].split(" ", 1)[0]
        for suffix in ("_bucket", "_sum", "_count", "_total", "_created"):
            if name.endswith(suffix):
                name = name[: -len(suffix)]
                break
        by_metric[name] = by_metric.get(name, 0) + 1
    return total, by_metric


def rank_volume(rank: int, world_size: int, port: int, tp: int, layers: int, steps: int, ratio: float,
                prometheus_port: int, out_dir: str) -> None:  # fmt: skip
    """One gloo rank: the llama step under the instrumentor's defaults, what it sent per step (a spawn target)."""
    import torch
    import torch.distributed as dist

    receiver = OtlpReceiver()
    os.environ.update(
        OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url,
        OTEL_TRACES_EXPORTER="otlp",
        OTEL_METRICS_EXPORTER="otlp,prometheus",
        OTEL_EXPORTER_PROMETHEUS_PORT=str(prometheus_port),
        OTEL_METRIC_EXPORT_INTERVAL="3600000",  # exports when the step's end flushes, not on a timer meanwhile
        OTEL_TRACES_SAMPLER="parentbased_traceidratio",
        OTEL_TRACES_SAMPLER_ARG=str(ratio),
        HP_OTEL_RUN_ID=RUN_ID,
    )
    import hp_otel
    from benchmarks.models.llama import LlamaShape, build_llama_step
    from hp_otel.always_on.instrumentor import HpOtelInstrumentor
    from hp_otel.export.telemetry import configured
    from hp_otel.export.telemetry import shutdown as shutdown_export
    from hp_otel.workloads.process_groups import init_gloo

    torch.set_num_threads(1)
    init_gloo(rank, world_size, port)
    instrumentor = HpOtelInstrumentor()
    try:
        model, step = build_llama_step(world_size // tp, tp, LlamaShape(layers=layers))
        step()  # warm: DTensor's caches, before anything is recorded
        instrumentor.instrument(module=model)
        telemetry = configured()
        assert telemetry is not None, "the instrumentor configured no export"
        # the OTLP reader only: a Prometheus reader collected meanwhile would queue a copy of every
        # series for the next scrape (the exporter's collector keeps each collection until scraped)
        (otlp_reader,) = [r for r in telemetry.metric_readers if type(r).__name__ == "PeriodicExportingMetricReader"]
        volume = RankVolume(rank, layers, 0, 0, {})
        for n in range(steps):
            spans_before, metrics_before = receiver.sent(TRACES), receiver.sent(METRICS)
            with hp_otel.step(n) as marked:
                step()
            telemetry.tracer_provider.force_flush()
            otlp_reader.force_flush()
            spans_after, metrics_after = receiver.sent(TRACES), receiver.sent(METRICS)
            volume.steps.append(
                StepVolume(
                    n,
                    marked.sampled,
                    spans_after[1] - spans_before[1],
                    spans_after[0] - spans_before[0],
                    metrics_after[1] - metrics_before[1],
                )
            )
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        with urllib.request.urlopen(f"http://localhost:{prometheus_port + local_rank}/metrics", timeout=30) as page:
            total, by_metric = _series(page.read().decode())
        volume.prometheus_series = total
        volume.series_by_metric = {k: v for k, v in sorted(by_metric.items()) if k.startswith("hp_")}
        volume.hp_otel_series = sum(volume.series_by_metric.values())
        with open(os.path.join(out_dir, f"volume_rank{rank}.json"), "w", encoding="utf-8") as handle:
            json.dump(asdict(volume), handle)
        dist.barrier()
    finally:
        instrumentor.uninstrument()
        shutdown_export()
        dist.destroy_process_group()
        receiver.close()


def _load(path: str) -> RankVolume:
    raw = read_json(path, "rank volume")
    raw["steps"] = [StepVolume(**s) for s in raw["steps"]]
    return RankVolume(**raw)


def run_telemetry_bench(
    layers: Sequence[int] = (2, 8),
    dp: int = 2,
    tp: int = 2,
    steps: int = 8,
    ratio: float = 0.5,
    progress: Progress = quiet,
) -> list[list[RankVolume]]:
    """For each depth, every rank's volume (spawns dp x tp gloo ranks on this machine)."""
    import torch.multiprocessing as mp

    from hp_otel.workloads.process_groups import free_port

    out: list[list[RankVolume]] = []
    for depth in layers:
        progress(f"the llama step, {depth} layers, on {dp * tp} gloo ranks ({dp} x {tp}), {steps} steps")
        with tempfile.TemporaryDirectory(prefix="hp_otel_volume_") as folder:
            prometheus_port = free_port()
            args = (dp * tp, free_port(), tp, depth, steps, ratio, prometheus_port, folder)
            mp.spawn(rank_volume, args=args, nprocs=dp * tp, join=True)
            out.append([_load(os.path.join(folder, f"volume_rank{r}.json")) for r in range(dp * tp)])
    return out


def format_telemetry_bench(results: list[list[RankVolume]]) -> list[str]:
    lines = []
    for ranks in results:
        first = ranks[0]
        sampled, unsampled = first.sampled(), first.unsampled()
        span = [s.span_bytes for s in sampled]
        metric = [s.metric_bytes for s in first.steps]
        lines += [
            f"llama step, {first.layers} layers, rank 0 of {len(ranks)} gloo ranks, {len(first.steps)} steps "
            f"({len(sampled)} sampled):",
            f"  Prometheus: {first.prometheus_series} series ({first.hp_otel_series} hp_otel's: "
            + ", ".join(f"{k} {v}" for k, v in first.series_by_metric.items())
            + ")",
            f"  OTLP spans per sampled step: {min(span, default=0):,}-{max(span, default=0):,} bytes; "
            f"per unsampled step: {max((s.span_bytes for s in unsampled), default=0):,} bytes",
            f"  OTLP metrics per export: {min(metric):,}-{max(metric):,} bytes (exported every "
            "OTEL_METRIC_EXPORT_INTERVAL, 60 s by default)",
        ]
    return lines


def telemetry_bench_json(results: list[list[RankVolume]]) -> list[dict[str, Any]]:
    return [{"layers": ranks[0].layers, "ranks": [asdict(v) for v in ranks]} for ranks in results]
