"""`hp-otel demo`: a real 2-process CPU (gloo) tensor-parallel step under CommDebugMode:
the TP MLP (`--model mlp`) or a 2-layer TP + sequence-parallel transformer (`--model transformer`).

Each rank runs forward+backward inside `CommDebugMode(module=model)` and writes its
JSON dump and its spans (OTLP/JSON); rank 0 prints the counts and the tables.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from hp_otel.cli.arguments import NOISE_LEVEL_HELP, noise_level, port, positive, seconds
from hp_otel.cli.progress import Progress, quiet, to_stderr
from hp_otel.workloads.process_groups import free_port, init_gloo


@dataclass(frozen=True)
class DemoConfig:
    out_dir: Path
    model: str = "mlp"  # mlp | transformer
    world_size: int = 2
    noise_level: int = 2
    port: int = 0
    otlp_endpoint: str | None = None  # export spans and metrics over OTLP (hp_otel.configure)
    otlp_protocol: str | None = None  # grpc | http/protobuf (default: OTEL_EXPORTER_OTLP_PROTOCOL, else http)
    prometheus_port: int | None = None  # base port: rank r serves /metrics on base + r
    otlp_traces_only: bool = False  # OTLP spans only (a traces-only backend): as OTEL_METRICS_EXPORTER=none
    steps: int = 1
    linger_s: float = 0.0  # keep /metrics up this long after the last step (for a scraper)
    step_pause_s: float = 0.0  # sleep between steps, so a scraper sees the counters grow (rate() panels)
    run_id: str = ""

    @property
    def exporting(self) -> bool:
        return self.otlp_endpoint is not None or self.prometheus_port is not None


def _rank_main(rank: int, config: DemoConfig, progress_started: float | None = None) -> None:
    import torch
    import torch.distributed as dist

    import hp_otel
    from hp_otel import CommDebugMode
    from hp_otel.workloads.tp_mlp import build_tp_mlp, train_step

    say = to_stderr("demo", progress_started) if progress_started is not None and rank == 0 else quiet
    init_gloo(rank, config.world_size, config.port)
    say(f"{config.world_size} ranks joined the gloo group; running {config.steps} step(s)")
    telemetry = None
    if config.otlp_traces_only:  # this rank's own environment: the same path as the user's setting
        os.environ["OTEL_METRICS_EXPORTER"] = "none"
    if config.exporting:
        telemetry = hp_otel.configure(
            endpoint=config.otlp_endpoint,
            protocol=config.otlp_protocol,
            prometheus_port=config.prometheus_port,
            prometheus_host="127.0.0.1",
            run_id=config.run_id or None,
            metric_export_interval_ms=1000,
        )
    try:
        if config.model == "transformer":
            from hp_otel.workloads.tp_transformer import build_tp_transformer, demo_tokens

            model, x = build_tp_transformer(config.world_size), demo_tokens()
        else:
            model, x = build_tp_mlp(config.world_size), torch.randn(4, 16, requires_grad=True)
        for step in range(config.steps):
            with hp_otel.step(step), CommDebugMode(module=model) as mode:
                train_step(model, x)
            if config.steps > 1:
                say(f"step {step + 1}/{config.steps} done")
            if config.step_pause_s and step + 1 < config.steps:
                time.sleep(config.step_pause_s)
        if telemetry is not None:
            _report_export(rank, telemetry, config)
        mode.generate_json_dump(config.out_dir / f"comm_rank{rank}.json", noise_level=3)
        mode.write_spans(config.out_dir / f"spans_rank{rank}.json")
        if rank == 0:
            _report(mode, config, sys.stdout)
        dist.barrier()
        if config.linger_s:
            say(f"keeping /metrics up for {config.linger_s:g} s (--linger)")
            time.sleep(config.linger_s)
    finally:
        if telemetry is not None:
            hp_otel.shutdown()
        dist.destroy_process_group()


def _report_export(rank: int, telemetry: object, config: DemoConfig) -> None:
    from hp_otel.export.telemetry import Telemetry

    assert isinstance(telemetry, Telemetry)
    parts = [f"rank {rank}: run id {telemetry.config.run_id}"]
    if telemetry.traces_endpoint:
        parts.append(f"spans -> {telemetry.traces_endpoint} ({telemetry.config.traces_protocol})")
    if telemetry.prometheus_port is not None:
        parts.append(f"metrics at http://127.0.0.1:{telemetry.prometheus_port}/metrics")
    print("; ".join(parts), flush=True)


# What each --model is and how it is split, for the demo's first line (the plans are in workloads/tp_*.py).
WHAT_RAN = {
    "mlp": "a 2-layer MLP, tensor parallel (fc1 ColwiseParallel, fc2 RowwiseParallel)",
    "transformer": "a 2-layer transformer, tensor + sequence parallel (attention and feed-forward "
    "ColwiseParallel -> RowwiseParallel, norms SequenceParallel)",
}


def what_ran(config: DemoConfig) -> str:
    """The demo's first line: the model, its plan, the ranks, the steps (not hp_otel's internals)."""
    steps = f"{config.steps} training step{'s' if config.steps > 1 else ''} (forward + backward)"
    return f"ran {WHAT_RAN[config.model]} on {config.world_size} CPU ranks (gloo), {steps}"


def _report(mode: object, config: DemoConfig, out: TextIO) -> None:
    from hp_otel import CommDebugMode
    from hp_otel.sources.pytorch.dtensor import HOOK_ENV, collective_hook

    assert isinstance(mode, CommDebugMode)
    print(what_ran(config), file=out)
    print(f"collective counts (rank 0): {mode.get_comm_counts()}", file=out)
    print(f"by op: {mode.get_comm_counts(normalized=True)}", file=out)
    print("by module (forward: every enclosing module; backward: the module whose forward made the node):", file=out)
    for fqn, phases in mode.get_comm_module_counts().items():
        print(f"  {fqn}: " + "; ".join(f"{phase} {dict(sorted(c.items()))}" for phase, c in phases.items()), file=out)
    print(f"sharding: {mode.get_sharding_info()}", file=out)
    print(f"\ntracing table, noise_level={config.noise_level}:", file=out)
    print(mode.generate_comm_debug_tracing_table(noise_level=config.noise_level), file=out)
    print("\ntracing table, noise_level=3 (redistributes and backward):", file=out)
    print(mode.generate_comm_debug_tracing_table(noise_level=3), file=out)
    print(
        f"\nwrote {config.out_dir}/comm_rank<r>.json (JSON dump) and {config.out_dir}/spans_rank<r>.json (OTLP/JSON)",
        file=out,
    )
    print(f"(collectives seen through torch's {collective_hook()} hook; {HOOK_ENV}=dispatch|kernels)", file=out)
    out.flush()


def run_demo(config: DemoConfig, progress: Progress = quiet) -> None:
    progress(f"starting {config.world_size} CPU ranks (torch.multiprocessing, gloo)")
    import torch.multiprocessing as mp

    config.out_dir.mkdir(parents=True, exist_ok=True)
    if not config.port:
        config = dataclasses.replace(config, port=free_port())
    if not config.run_id:  # one id for all ranks of this run: their step traces share it
        config = dataclasses.replace(config, run_id=os.environ.get("HP_OTEL_RUN_ID") or f"demo-{uuid.uuid4().hex[:12]}")
    started = progress.started if isinstance(progress, to_stderr) else None  # rank 0 reports on the same clock
    mp.spawn(_rank_main, args=(config, started), nprocs=config.world_size, join=True)
    progress(f"done; files in {config.out_dir}/")


def add_arguments(demo: argparse.ArgumentParser) -> None:
    """`hp-otel demo`'s options."""
    from hp_otel.export.config import PROTOCOLS

    demo.add_argument(
        "--model",
        choices=("mlp", "transformer"),
        default="mlp",
        help="mlp: a 2-layer TP MLP; transformer: a 2-layer TP + sequence-parallel transformer",
    )
    demo.add_argument("--out", type=Path, default=Path("hp_otel_out"), help="folder for the JSON dumps and spans")
    demo.add_argument("--noise-level", type=noise_level, default=2, metavar="0-3", help=NOISE_LEVEL_HELP)
    demo.add_argument("--otlp-endpoint", metavar="URL", help="send spans and metrics over OTLP to this endpoint")
    demo.add_argument(
        "--otlp-protocol", choices=PROTOCOLS, help="OTLP protocol (default: OTEL_EXPORTER_OTLP_PROTOCOL, else http)"
    )
    demo.add_argument(
        "--otlp-traces-only",
        action="store_true",
        help="send only spans over OTLP, no metrics (a traces-only backend); the same as OTEL_METRICS_EXPORTER=none",
    )
    demo.add_argument(
        "--prometheus-port", type=port, metavar="N", help="serve /metrics on N + local rank (0: any free port)"
    )
    demo.add_argument(
        "--steps", type=positive, default=1, metavar="N", help="training steps, 1 or more, one trace each across ranks"
    )
    demo.add_argument(
        "--linger",
        type=seconds,
        default=0.0,
        metavar="S",
        help="keep /metrics up S seconds at the end (0: exit at once)",
    )
    demo.add_argument(
        "--step-pause",
        type=seconds,
        default=0.0,
        metavar="S",
        help="sleep S seconds between steps, so a scraper sees the counters grow (0: none)",
    )
    demo.add_argument("--run-id", default="", help="run id the step trace ids derive from (empty: a random one)")


def run(args: argparse.Namespace) -> int:
    """`hp-otel demo`: the run with the options given; exit status 0."""
    run_demo(
        DemoConfig(
            out_dir=args.out,
            model=args.model,
            noise_level=args.noise_level,
            otlp_endpoint=args.otlp_endpoint,
            otlp_protocol=args.otlp_protocol,
            otlp_traces_only=args.otlp_traces_only,
            prometheus_port=args.prometheus_port,
            steps=args.steps,
            linger_s=args.linger,
            step_pause_s=args.step_pause,
            run_id=args.run_id,
        ),
        progress=to_stderr("demo"),
    )
    return 0
