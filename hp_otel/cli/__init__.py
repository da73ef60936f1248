"""The `hp-otel` command: see the collectives of a distributed-tensor training step.

demo: a real 2-process CPU run; render: a table from a saved spans file; ranks: compare the
ranks' files (divergence, hang, stragglers); diff: compare two runs' communication;
plot / chrome-trace: pictures; bench: what tracing costs.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

from hp_otel.cli import diff, pictures, ranks
from hp_otel.cli.arguments import NOISE_LEVEL_HELP, DefaultsFormatter, noise_level, port, positive
from hp_otel.cli.progress import to_stderr
from hp_otel.common.safe_text import printable
from hp_otel.version import __version__


class Command(NamedTuple):
    """One subcommand: a row of `COMMANDS` is all it takes to add one."""

    name: str
    help: str  # its line in `hp-otel --help`
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]  # the exit status
    description: str | None = None  # its `--help` text above the arguments (None: none)
    deprecated_aliases: tuple[str, ...] = ()  # old names: still work, with a note on stderr


# --- demo ---------------------------------------------------------------------------


def _demo_arguments(demo: argparse.ArgumentParser) -> None:
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
        "--linger", type=float, default=0.0, metavar="S", help="keep /metrics up S seconds at the end (0: exit at once)"
    )
    demo.add_argument("--run-id", default="", help="run id the step trace ids derive from (empty: a random one)")


def _demo(args: argparse.Namespace) -> int:
    from hp_otel.cli.demo import DemoConfig, run_demo

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
            run_id=args.run_id,
        ),
        progress=to_stderr("demo"),
    )
    return 0


# --- bench --------------------------------------------------------------------------


def _bench_arguments(bench: argparse.ArgumentParser) -> None:
    from hp_otel.cli.bench_instructions import DEFAULT_STEPS
    from hp_otel.cli.bench_variants import UNTRACED, VARIANT_NAMES
    from hp_otel.cli.bench_workloads import ALIASES, GROUPS, WORKLOADS

    per_workload = ", ".join(f"{name} {spec.rounds}x{spec.steps}" for name, spec in WORKLOADS.items())
    bench.add_argument(
        "--rounds",
        type=positive,
        metavar="N",
        help=f"interleaved rounds, 1 or more (median over rounds); default per workload, rounds x steps: {per_workload}"
        " (realistic runs fewer: its step is about 10-100x longer); --export-down: 15",
    )
    bench.add_argument(
        "--steps",
        type=positive,
        metavar="N",
        help="steps per variant per round, 1 or more (median); default per workload (see --rounds); --export-down: 20",
    )
    bench.add_argument(
        "--export-down",
        action="store_true",
        help="instead: cost of exporting to a refused or blackholed OTLP endpoint (HTTP and gRPC), against no export",
    )
    bench.add_argument(
        "--model",
        choices=(*WORKLOADS, *ALIASES, *GROUPS, "all"),
        default="mlp",
        help="the step to time; all: each in turn, one table each; "
        + "; ".join(
            f"{name}: {', '.join(members)}, with each variant's cost per event" for name, members in GROUPS.items()
        )
        + ". "
        + "; ".join(f"{name}: {spec.summary}" for name, spec in WORKLOADS.items())
        + "; former names: "
        + ", ".join(f"{old} = {new}" for old, new in ALIASES.items()),
    )
    bench.add_argument("--json", action="store_true", help="print the results as JSON instead of tables")
    bench.add_argument(
        "--scale",
        action="store_true",
        help="instead: memory per retained span, and table / JSON dump time per noise level for one long window",
    )
    bench.add_argument("--spans", type=positive, default=100_000, metavar="N", help="spans in the --scale window")
    bench.add_argument(
        "--pieces",
        action="store_true",
        help="instead: what each part of tracing costs the --model step, one part added at a time "
        "(kept hooks idle, window + counting, module hooks, spans, op mode, install per window)",
    )
    bench.add_argument(
        "--variant",
        action="append",
        choices=VARIANT_NAMES,
        metavar="NAME",
        help=f"time only this variant (repeat for more; {UNTRACED!r} always runs); default: all. Names: "
        + "; ".join(VARIANT_NAMES),
    )
    bench.add_argument(
        "--instructions",
        action="store_true",
        help="also count each variant's instructions per step under valgrind's callgrind (needs valgrind and a C "
        "compiler; each variant in its own process, ≈50x slower than native, about a minute or more each): "
        "they repeat within ±0.2 %% whatever the load, where wall clock drifts 0.5-2 %%",
    )
    bench.add_argument(
        "--counted-steps",
        type=positive,
        default=DEFAULT_STEPS,
        metavar="N",
        help="--instructions: steps counted per variant, after a dozen warm-up steps (few: they repeat exactly)",
    )
    bench.add_argument(
        "--jobs",
        type=positive,
        default=None,
        metavar="N",
        help="--instructions: callgrind processes at a time, default 1 (the counts do not depend on it; each takes "
        "≈1 GB); --ranks: processes making the files and reading them (default: the cores)",
    )
    bench.add_argument(
        "--ranks",
        type=positive,
        metavar="N",
        help="instead: time `hp-otel ranks` on N ranks' files of the llama step (8 layers, TP + sequence parallel, "
        "a (N / tp) x tp mesh) with a hang, a desync and a straggler planted, and say whether each was named",
    )
    bench.add_argument("--tp", type=positive, default=8, metavar="N", help="--ranks: the tensor-parallel degree")
    bench.add_argument(
        "--evidence",
        choices=("spans", "collectives"),
        default="spans",
        help="--ranks: the files made: spans files (write_spans) or collectives files (write_collectives)",
    )
    bench.add_argument(
        "--keep-files",
        metavar="DIR",
        help="--ranks: write the ranks' files to DIR and keep them (default: a temporary folder, removed)",
    )


def _bench_ranks(args: argparse.Namespace) -> int:
    import json

    from hp_otel.cli.bench_ranks import format_ranks_bench, ranks_bench_json, run_ranks_bench

    try:
        result = run_ranks_bench(
            args.ranks, args.tp, args.jobs, args.keep_files, to_stderr("bench --ranks"), args.evidence
        )
    except ValueError as exc:
        print(f"hp-otel bench: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(ranks_bench_json(result), indent=2) if args.json else "\n".join(format_ranks_bench(result)))
    return 0 if all(result.found.values()) else 1


def _bench(args: argparse.Namespace) -> int:
    if args.instructions and (args.export_down or args.scale or args.pieces):
        print(
            "hp-otel bench: --instructions counts the variants' steps; not with --export-down, --scale or --pieces",
            file=sys.stderr,
        )
        return 2
    if args.ranks is not None:
        return _bench_ranks(args)
    if args.export_down:
        from hp_otel.cli.bench_export import main as bench_export

        print("\n".join(bench_export(args.rounds or 15, args.steps or 20, to_stderr("bench --export-down"))))
        return 0
    if args.scale:
        from hp_otel.cli.bench_scale import format_scale_results, run_scale_bench

        print("\n".join(format_scale_results(run_scale_bench(spans=args.spans, progress=to_stderr("bench --scale")))))
        return 0
    if args.pieces:
        from hp_otel.cli.bench_pieces import main as bench_pieces

        print(bench_pieces(args.model, args.rounds, args.steps, to_stderr("bench --pieces")))
        return 0
    import json

    from hp_otel.cli.bench import format_results, per_event_tables, results_json, run_bench
    from hp_otel.cli.bench_instructions import ToolMissing
    from hp_otel.cli.bench_workloads import workload_names

    names = workload_names(args.model)
    try:
        results = run_bench(
            names,
            rounds=args.rounds,
            steps=args.steps,
            only=args.variant,
            progress=to_stderr("bench"),
            instruction_steps=args.counted_steps if args.instructions else None,
            jobs=args.jobs or 1,
        )
    except ToolMissing as exc:
        print(printable(f"hp-otel bench: {exc}"), file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(results_json(results), indent=2))
    else:
        print("\n\n".join("\n".join(format_results(result)) for result in results))
        events = list(per_event_tables(results))
        if events:
            print("\n" + "\n".join(events).rstrip())
    return 0


# --- render -------------------------------------------------------------------------


def _render_arguments(render: argparse.ArgumentParser) -> None:
    render.add_argument("file", type=Path, help="an OTLP/JSON spans file")
    render.add_argument("--noise-level", type=noise_level, default=1, metavar="0-3", help=NOISE_LEVEL_HELP)
    render.add_argument(
        "--max-bytes",
        type=positive,
        default=None,
        metavar="N",
        help="refuse files larger than N bytes (default: HP_OTEL_RENDER_MAX_BYTES, else 256 MiB)",
    )


def _render(args: argparse.Namespace) -> int:
    from hp_otel.render.table import render_table
    from hp_otel.spans.call_tree import build_call_tree, check_attribute_types, count_collectives
    from hp_otel.spans.otlp_json import SpanFileError, read_spans

    try:
        spans = read_spans(args.file, max_bytes=args.max_bytes)
        check_attribute_types(build_call_tree(spans))
    except (SpanFileError, ValueError) as exc:
        message = (
            f"hp-otel render: {args.file}: {exc}" if not isinstance(exc, SpanFileError) else f"hp-otel render: {exc}"
        )
        print(printable(message), file=sys.stderr)
        return 2
    print(printable(f"collective counts: {count_collectives(spans)}"))
    print(render_table(spans, args.noise_level))
    return 0


# --- the registry -------------------------------------------------------------------

COMMANDS: tuple[Command, ...] = (
    Command(
        "demo",
        "2-process CPU tensor-parallel step (MLP or transformer) under CommDebugMode (15-45 s on 2 cores)",
        _demo_arguments,
        _demo,
        description="A real 2-process CPU (gloo) tensor-parallel forward+backward under CommDebugMode "
        "(a TP MLP, or a 2-layer TP + sequence-parallel transformer): prints rank 0's counts and tables, "
        "writes every rank's JSON dump and spans into --out.",
    ),
    Command(
        "bench",
        "what tracing costs a step, against untraced and torch's own tools (1-2 min a workload)",
        _bench_arguments,
        _bench,
        description="Times a training step (forward + backward + zero_grad) in one process over torch's fake "
        "process group, each variant interleaved round after round; prints per variant the median µs per "
        "step, the ratio to untraced (median of per-round ratios, with their interquartile range) and, for "
        "hp_otel's variants, the µs added per recorded event. "
        "--export-down and --scale measure other things instead (see their help).",
    ),
    Command(
        "render",
        "re-render the table and counts from a spans file (OTLP/JSON)",
        _render_arguments,
        _render,
        description="Rebuild the collective counts and the tracing table from a spans file "
        "(the demo's spans_rank<r>.json, or any OTLP/JSON file of hp_otel spans).",
    ),
    Command(
        "ranks",
        "compare per-rank spans files: first divergence, hang suspects, stragglers "
        "(exit 0 agree, 3 not, 4 ranks without a file, 2 bad input)",
        ranks.add_arguments,
        ranks.run,
    ),
    Command(
        "diff",
        "compare two runs' collectives per module, phase and op (exit 0 same, 3 different, 2 bad input)",
        diff.add_arguments,
        diff.run,
        description="Two runs side by side (two spans files, JSON dumps or snapshots, or two folders of per-rank "
        "files): per module, phase and collective op, the count and bytes before and after, what appeared and "
        "what vanished, then the totals.",
    ),
    Command(
        "plot",
        "draw one step across ranks as a timeline (SVG, or HTML that opens without a server)",
        pictures.add_plot_arguments,
        pictures.run_plot,
        description="A lane per rank on one time axis; modules, ops and redistributes as bars, collectives "
        "coloured by op, the same collective joined across ranks so skew shows. Hover a bar for details.",
    ),
    Command(
        "chrome-trace",
        "write spans as Chrome/Perfetto trace-event JSON, optionally merged with a torch.profiler trace",
        pictures.add_chrome_trace_arguments,
        pictures.run_chrome_trace,
        description="Open the result in ui.perfetto.dev or chrome://tracing. With --merge, hp_otel's tracks are "
        "added to a torch.profiler chrome trace of the same run (same clock), next to its CPU ops and kernels.",
        deprecated_aliases=("export",),
    ),
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hp-otel", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"hp-otel {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.add_arguments(
            sub.add_parser(
                command.name,
                aliases=list(command.deprecated_aliases),
                help=command.help
                + "".join(f" ({alias}: its old name, deprecated)" for alias in command.deprecated_aliases),
                description=command.description,
                formatter_class=DefaultsFormatter,
            )
        )
    return parser


# What a shell reports for a program that SIGPIPE ended (`hp-otel ranks --json ... | head`).
EXIT_BROKEN_PIPE = 128 + 13


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        command = next(c for c in COMMANDS if args.command in (c.name, *c.deprecated_aliases))
        if args.command != command.name:
            print(printable(f"hp-otel: `{args.command}` is deprecated, use `hp-otel {command.name}`"), file=sys.stderr)
        status = command.run(args)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's flush at exit
        return status
    except BrokenPipeError:
        _quiet_stdout()
        return EXIT_BROKEN_PIPE


def _quiet_stdout() -> None:
    """The reader went away (`| head`): stop quietly, as Unix tools do, with no traceback and no
    "Exception ignored" from the interpreter's final flush (Python's documented recipe: stdout to devnull)."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is not a file (captured): nothing left to flush into the pipe
        pass
