"""The `hp-otel` command: see the collectives of a distributed-tensor training step.

demo: a real 2-process CPU run; render: a table from a saved spans file; ranks: compare the
ranks' files (divergence, hang, stragglers); plot / export: pictures; bench: what tracing costs.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from hp_otel.cli.progress import to_stderr
from hp_otel.export.config import PROTOCOLS
from hp_otel.version import __version__

NOISE_LEVEL_HELP = (
    "table detail, 0-3: 0 collectives only; 1 + DTensor ops; 2 + forward module boundaries; "
    "3 + redistributes, backward modules, dtype/bytes/reduce op on collectives"
)


class _DEFAULTS(argparse.HelpFormatter):
    """Help lines end with the default, where there is one to state."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "%(default)" in text or action.default in (None, "", False, argparse.SUPPRESS):
            return text
        return f"{text} (default: %(default)s)"


def _noise_level(text: str) -> int:
    from hp_otel.render.levels import NOISE_LEVELS

    if not text.isdigit() or int(text) not in NOISE_LEVELS:
        raise argparse.ArgumentTypeError(f"must be one of {', '.join(map(str, NOISE_LEVELS))}")
    return int(text)


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError("must be a positive integer")
    return int(text)


def _port(text: str) -> int:
    if not text.isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError("must be a port number 0-65535")
    return int(text)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hp-otel", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"hp-otel {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = sub.add_parser(
        "demo",
        help="2-process CPU tensor-parallel step (MLP or transformer) under CommDebugMode (about 10 s)",
        description="A real 2-process CPU (gloo) tensor-parallel forward+backward under CommDebugMode "
        "(a TP MLP, or a 2-layer TP + sequence-parallel transformer): prints rank 0's counts and tables, "
        "writes every rank's JSON dump and spans into --out.",
        formatter_class=_DEFAULTS,
    )
    demo.add_argument(
        "--model",
        choices=("mlp", "transformer"),
        default="mlp",
        help="mlp: a 2-layer TP MLP; transformer: a 2-layer TP + sequence-parallel transformer",
    )
    demo.add_argument("--out", type=Path, default=Path("hp_otel_out"), help="folder for the JSON dumps and spans")
    demo.add_argument("--noise-level", type=_noise_level, default=2, metavar="0-3", help=NOISE_LEVEL_HELP)
    demo.add_argument("--otlp-endpoint", metavar="URL", help="send spans and metrics over OTLP to this endpoint")
    demo.add_argument(
        "--otlp-protocol", choices=PROTOCOLS, help="OTLP protocol (default: OTEL_EXPORTER_OTLP_PROTOCOL, else http)"
    )
    demo.add_argument(
        "--prometheus-port", type=_port, metavar="N", help="serve /metrics on N + local rank (0: any free port)"
    )
    demo.add_argument(
        "--steps", type=_positive, default=1, metavar="N", help="training steps, 1 or more, one trace each across ranks"
    )
    demo.add_argument(
        "--linger", type=float, default=0.0, metavar="S", help="keep /metrics up S seconds at the end (0: exit at once)"
    )
    demo.add_argument("--run-id", default="", help="run id the step trace ids derive from (empty: a random one)")

    from hp_otel.cli.bench_workloads import ALIASES, WORKLOADS

    bench = sub.add_parser(
        "bench",
        help="what tracing costs a step, against untraced and torch's own tools (1-2 min a workload)",
        description="Times a training step (forward + backward + zero_grad) in one process over torch's fake "
        "process group, each variant interleaved round after round; prints per variant the median µs per "
        "step, the ratio to untraced (median of per-round ratios, with their interquartile range) and, for "
        "hp_otel's variants, the µs added per recorded event. "
        "--export-down and --scale measure other things instead (see their help).",
        formatter_class=_DEFAULTS,
    )
    per_workload = ", ".join(f"{name} {spec.rounds}x{spec.steps}" for name, spec in WORKLOADS.items())
    bench.add_argument(
        "--rounds",
        type=_positive,
        metavar="N",
        help=f"interleaved rounds, 1 or more (median over rounds); default per workload, rounds x steps: {per_workload}"
        " (realistic runs fewer: its step is about 10-100x longer); --export-down: 15",
    )
    bench.add_argument(
        "--steps",
        type=_positive,
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
        choices=(*WORKLOADS, *ALIASES, "all"),
        default="mlp",
        help="the step to time; all: each in turn, one table each. "
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
    bench.add_argument("--spans", type=_positive, default=100_000, metavar="N", help="spans in the --scale window")
    bench.add_argument(
        "--pieces",
        action="store_true",
        help="instead: what each part of tracing costs the --model step, one part added at a time "
        "(kept hooks idle, window + counting, module hooks, spans, op mode, install per window)",
    )

    render = sub.add_parser(
        "render",
        help="re-render the table and counts from a spans file (OTLP/JSON)",
        description="Rebuild the collective counts and the tracing table from a spans file "
        "(the demo's spans_rank<r>.json, or any OTLP/JSON file of hp_otel spans).",
        formatter_class=_DEFAULTS,
    )
    render.add_argument("file", type=Path, help="an OTLP/JSON spans file")
    render.add_argument("--noise-level", type=_noise_level, default=1, metavar="0-3", help=NOISE_LEVEL_HELP)
    render.add_argument(
        "--max-bytes",
        type=_positive,
        default=None,
        metavar="N",
        help="refuse files larger than N bytes (default: HP_OTEL_RENDER_MAX_BYTES, else 256 MiB)",
    )

    ranks = sub.add_parser(
        "ranks",
        help="compare per-rank spans files: first divergence, hang suspects, stragglers "
        "(exit 0 agree, 3 not, 2 bad input)",
        formatter_class=_DEFAULTS,
    )
    ranks.add_argument(
        "files", type=Path, nargs="+", metavar="FILE", help="one spans file (OTLP/JSON) or JSON dump per rank"
    )
    ranks.add_argument("--json", action="store_true", help="the report as JSON")
    ranks.add_argument("--top", type=_positive, default=5, metavar="N", help="largest skews to list")

    from hp_otel.cli import pictures

    pictures.add_parsers(sub, _DEFAULTS)  # plot, export
    return parser


def _bench(args: argparse.Namespace) -> int:
    import json

    from hp_otel.cli.bench import format_results, results_json, run_bench
    from hp_otel.cli.bench_workloads import WORKLOADS

    names = list(WORKLOADS) if args.model == "all" else [args.model]
    results = run_bench(names, rounds=args.rounds, steps=args.steps, progress=to_stderr("bench"))
    if args.json:
        print(json.dumps(results_json(results), indent=2))
    else:
        print("\n\n".join("\n".join(format_results(result)) for result in results))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command in ("plot", "export"):
        from hp_otel.cli.pictures import run

        return run(args)
    if args.command == "demo":
        from hp_otel.cli.demo import DemoConfig, run_demo

        run_demo(
            DemoConfig(
                out_dir=args.out,
                model=args.model,
                noise_level=args.noise_level,
                otlp_endpoint=args.otlp_endpoint,
                otlp_protocol=args.otlp_protocol,
                prometheus_port=args.prometheus_port,
                steps=args.steps,
                linger_s=args.linger,
                run_id=args.run_id,
            ),
            progress=to_stderr("demo"),
        )
        return 0
    if args.command == "bench" and args.export_down:
        from hp_otel.cli.bench_export import main as bench_export

        print("\n".join(bench_export(args.rounds or 15, args.steps or 20, to_stderr("bench --export-down"))))
        return 0
    if args.command == "bench" and args.scale:
        from hp_otel.cli.bench_scale import format_scale_results, run_scale_bench

        print("\n".join(format_scale_results(run_scale_bench(spans=args.spans, progress=to_stderr("bench --scale")))))
        return 0
    if args.command == "bench" and args.pieces:
        from hp_otel.cli.bench_pieces import main as bench_pieces

        print(bench_pieces(args.model, args.rounds, args.steps, to_stderr("bench --pieces")))
        return 0
    if args.command == "bench":
        return _bench(args)
    if args.command == "ranks":
        from hp_otel.cli.ranks import run_ranks

        return run_ranks(args.files, args.json, args.top)
    from hp_otel.render.table import render_table
    from hp_otel.spans.call_tree import build_call_tree, check_attribute_types, count_collectives
    from hp_otel.spans.otlp_json import SpanFileError, read_spans

    try:
        spans = read_spans(args.file, max_bytes=args.max_bytes)
        check_attribute_types(build_call_tree(spans))
    except (SpanFileError, ValueError) as exc:
        print(
            f"hp-otel render: {args.file}: {exc}" if not isinstance(exc, SpanFileError) else f"hp-otel render: {exc}",
            file=sys.stderr,
        )
        return 2
    print(f"collective counts: {count_collectives(spans)}")
    print(render_table(spans, args.noise_level))
    return 0
