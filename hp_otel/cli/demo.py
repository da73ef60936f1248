"""`hp-otel demo`: a real 2-process CPU (gloo) tensor-parallel step under CommDebugMode:
the TP MLP (`--model mlp`) or a 2-layer TP + sequence-parallel transformer (`--model transformer`).

Each rank runs forward+backward inside `CommDebugMode(module=model)` and writes its
JSON dump and its spans (OTLP/JSON); rank 0 prints the counts and the tables.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import multiprocessing
import os
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, TextIO

from hp_otel.cli.arguments import DEFAULT_NOISE_LEVEL, NOISE_LEVEL_HELP, noise_level, port, positive, seconds
from hp_otel.cli.progress import Progress, quiet, to_stderr
from hp_otel.common.safe_text import printable
from hp_otel.workloads.process_groups import free_port, init_gloo


@dataclass(frozen=True)
class DemoConfig:
    out_dir: Path
    model: str = "mlp"  # mlp | transformer
    world_size: int = 2
    noise_level: int = DEFAULT_NOISE_LEVEL
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


def _rank_main(rank: int, config: DemoConfig, progress_started: float | None = None, errors: Any = None) -> None:
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
        try:
            telemetry = hp_otel.configure(
                endpoint=config.otlp_endpoint,
                protocol=config.otlp_protocol,
                prometheus_port=config.prometheus_port,
                prometheus_host="127.0.0.1",
                run_id=config.run_id or None,
                metric_export_interval_ms=1000,
            )
        except (OSError, ValueError) as exc:  # a busy port, a bad endpoint: named by the error
            _fail(str(exc), errors)
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
        try:
            mode.generate_json_dump(config.out_dir / f"comm_rank{rank}.json", noise_level=3)
            mode.write_spans(config.out_dir / f"spans_rank{rank}.json")
        except OSError as exc:  # a full disk, a read-only folder
            _fail(f"--out {str(config.out_dir)!r}: cannot write this run's files ({_why(exc)})", errors)
        if rank == 0:
            try:
                _report(mode, config, sys.stdout)
            except BrokenPipeError:
                raise
            except OSError as exc:
                _fail(f"cannot write to stdout ({_why(exc)})", errors)
        dist.barrier()
        if config.linger_s:
            say(f"keeping /metrics up for {config.linger_s:g} s (--linger)")
            time.sleep(config.linger_s)
    finally:
        if telemetry is not None:
            hp_otel.shutdown()
        dist.destroy_process_group()


EXIT_FAILED = 2  # a rank that cannot go on says why in one line and exits with this


def _fail(line: str, errors: Any) -> NoReturn:
    """End this rank, its line handed to the parent (`errors`), which says the first one on stderr
    and returns EXIT_FAILED: one line, however many ranks fail the same way, and no traceback."""
    if errors is not None:
        errors.put(line)
    with contextlib.suppress(OSError, ValueError):  # stdout's unwritten buffer would fail again at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    raise SystemExit(EXIT_FAILED)


def _why(exc: OSError) -> str:
    return os.strerror(exc.errno) if exc.errno else str(exc)


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


# What the table shows at each noise level, for its heading.
TABLE_SHOWS = {
    0: "collectives",
    1: "DTensor ops, collectives",
    2: "modules (forward, then backward), DTensor ops, collectives",
    3: "modules (forward, then backward), DTensor ops, redistributes, collectives with bytes and bandwidth",
}

# The words the level-3 table uses, said once under it (docs/overlap.md and docs/bandwidth.md say more).
TERMS = (
    "exposed: the part of the communication time this rank waited for it (the step was held up)",
    "overlapped: the rest of it, when this rank ran something else (computation, Python)",
    "busbw/algbw: bytes per second of the collective's time on this rank, which includes waiting for the "
    "other rank to arrive: here, 2 CPU processes over gloo, mostly waiting, so kB/s, not a link's speed",
)


def _report(mode: object, config: DemoConfig, out: TextIO) -> None:
    from hp_otel import CommDebugMode
    from hp_otel.sources.pytorch.dtensor import HOOK_ENV, collective_hook

    assert isinstance(mode, CommDebugMode)
    print(what_ran(config), file=out)
    print(
        f"collectives on rank 0: {mode.get_comm_counts(normalized=True)} (torch's names: {mode.get_comm_counts()})",
        file=out,
    )
    print("by module (forward: every enclosing module; backward: the module whose forward made the node):", file=out)
    for fqn, phases in mode.get_comm_module_counts(normalized=True).items():
        shown = (f"{phase} {dict(sorted(counts.items()))}" for phase, counts in phases.items())
        print(f"  {fqn}: " + "; ".join(shown), file=out)
    print(f"sharding: {mode.get_sharding_info()}", file=out)
    print(f"\nrank 0's table, noise level {config.noise_level} of 0-3: {TABLE_SHOWS[config.noise_level]}", file=out)
    print(mode.generate_comm_debug_tracing_table(noise_level=config.noise_level), file=out)
    if config.noise_level == 3:
        print("\nterms:\n" + "\n".join(f"  {term}" for term in TERMS), file=out)
    print(f"\ncollectives seen through torch's {collective_hook()} hook ({HOOK_ENV}=dispatch|kernels)", file=out)
    spans = f"{config.out_dir}/spans_rank*.json"
    print(f"wrote {config.out_dir}/comm_rank<r>.json (JSON dumps) and {spans} (spans, OTLP/JSON), one a rank", file=out)
    print(
        f"next: hp-otel plot {spans} -o {config.out_dir}/timeline.html  (both ranks on one time axis; "
        f"open it in a browser), or hp-otel ranks {spans} (the ranks compared)",
        file=out,
    )
    out.flush()


def run_demo(config: DemoConfig, progress: Progress = quiet, errors: Any = None) -> None:
    """Run the demo's ranks; a rank that fails with a line for the user (`_fail`) puts it in
    `errors` (a spawn-context queue) and exits EXIT_FAILED."""
    progress(f"starting {config.world_size} CPU ranks (torch.multiprocessing, gloo)")
    import torch.multiprocessing as mp

    config.out_dir.mkdir(parents=True, exist_ok=True)
    if not config.port:
        config = dataclasses.replace(config, port=free_port())
    if not config.run_id:  # one id for all ranks of this run: their step traces share it
        config = dataclasses.replace(config, run_id=os.environ.get("HP_OTEL_RUN_ID") or f"demo-{uuid.uuid4().hex[:12]}")
    started = progress.started if isinstance(progress, to_stderr) else None  # rank 0 reports on the same clock
    mp.spawn(_rank_main, args=(config, started, errors), nprocs=config.world_size, join=True)
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
    demo.add_argument(
        "--noise-level", type=noise_level, default=DEFAULT_NOISE_LEVEL, metavar="0-3", help=NOISE_LEVEL_HELP
    )
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
    """`hp-otel demo`: the run with the options given; exit status 0, or 2 with one line on stderr."""
    from torch.multiprocessing import ProcessExitedException

    world_size = DemoConfig.world_size
    if args.prometheus_port and args.prometheus_port + world_size - 1 > 65535:
        print(
            f"hp-otel demo: --prometheus-port {args.prometheus_port}: rank {world_size - 1} would serve on "
            f"{args.prometheus_port + world_size - 1}, above 65535; use at most {65536 - world_size}, or 0",
            file=sys.stderr,
        )
        return EXIT_FAILED
    try:
        args.out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(f"hp-otel demo: --out {str(args.out)!r}: cannot make the folder ({_why(exc)})", file=sys.stderr)
        return EXIT_FAILED
    errors = multiprocessing.get_context("spawn").SimpleQueue()
    # a rank's failure ends the others: torch logs each SIGTERM it sends, noise next to the one line said
    logging.getLogger("torch.multiprocessing.spawn").setLevel(logging.ERROR)
    try:
        _run(args, errors)
    except ProcessExitedException as exc:
        if exc.exit_code != EXIT_FAILED or errors.empty():
            raise
        print(printable(f"hp-otel demo: {errors.get()}"), file=sys.stderr)
        return EXIT_FAILED
    return 0


def _run(args: argparse.Namespace, errors: Any) -> None:
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
        errors=errors,
    )
