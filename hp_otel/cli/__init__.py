"""The `hp-otel` command: demo | bench | render | ranks."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from hp_otel.config import PROTOCOLS


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
    parser = argparse.ArgumentParser(prog="hp-otel", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="2-process CPU tensor-parallel MLP step under CommDebugMode")
    demo.add_argument("--out", type=Path, default=Path("hp_otel_out"), help="folder for the JSON dumps and spans")
    demo.add_argument("--noise-level", type=_noise_level, default=2)
    demo.add_argument("--otlp-endpoint", metavar="URL", help="send spans and metrics over OTLP to this endpoint")
    demo.add_argument(
        "--otlp-protocol", choices=PROTOCOLS, help="OTLP protocol (default: OTEL_EXPORTER_OTLP_PROTOCOL, else http)"
    )
    demo.add_argument(
        "--prometheus-port", type=_port, metavar="N", help="serve /metrics on N + local rank (0: any free port)"
    )
    demo.add_argument("--steps", type=_positive, default=1, help="training steps, one trace each across ranks")
    demo.add_argument("--linger", type=float, default=0.0, metavar="S", help="keep /metrics up S seconds at the end")
    demo.add_argument("--run-id", default="", help="run id the step trace ids derive from (default: random)")

    bench = sub.add_parser("bench", help="overhead against the untraced step and torch's own debug modes")
    bench.add_argument("--rounds", type=_positive, default=15, help="interleaved rounds (median over rounds)")
    bench.add_argument("--steps", type=_positive, default=20, help="steps per variant per round (median per block)")
    bench.add_argument(
        "--export-down",
        action="store_true",
        help="cost of exporting to a refused or blackholed OTLP endpoint, against no export",
    )
    bench.add_argument("--scale", action="store_true", help="memory per span and table/JSON time for a long window")
    bench.add_argument("--spans", type=_positive, default=100_000, help="spans in the --scale window")

    render = sub.add_parser("render", help="re-render the table and counts from a spans file (OTLP/JSON)")
    render.add_argument("file", type=Path)
    render.add_argument("--noise-level", type=_noise_level, default=1)
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
    )
    ranks.add_argument("files", type=Path, nargs="+", metavar="FILE", help="one spans file (OTLP/JSON) per rank")
    ranks.add_argument("--json", action="store_true", help="the report as JSON")
    ranks.add_argument("--top", type=_positive, default=5, help="largest skews to list")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "demo":
        from hp_otel.cli.demo import DemoConfig, run_demo

        run_demo(
            DemoConfig(
                out_dir=args.out,
                noise_level=args.noise_level,
                otlp_endpoint=args.otlp_endpoint,
                otlp_protocol=args.otlp_protocol,
                prometheus_port=args.prometheus_port,
                steps=args.steps,
                linger_s=args.linger,
                run_id=args.run_id,
            )
        )
        return 0
    if args.command == "bench" and args.export_down:
        from hp_otel.cli.bench_export import main as bench_export

        print("\n".join(bench_export(args.rounds, args.steps)))
        return 0
    if args.command == "bench" and args.scale:
        from hp_otel.cli.bench_scale import format_scale_results, run_scale_bench

        print("\n".join(format_scale_results(run_scale_bench(spans=args.spans))))
        return 0
    if args.command == "bench":
        from hp_otel.cli.bench import format_results, run_bench

        results = run_bench(rounds=args.rounds, steps=args.steps)
        print("\n".join(format_results(results)))
        return 0
    if args.command == "ranks":
        from hp_otel.cli.ranks import run_ranks

        return run_ranks(args.files, args.json, args.top)
    from hp_otel.call_tree import build_call_tree, check_attribute_types, count_collectives
    from hp_otel.otlp_json import SpanFileError, read_spans
    from hp_otel.render.table import render_table

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
