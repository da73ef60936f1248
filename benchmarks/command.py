"""`python -m benchmarks`: its options and which measurement they choose; the measurements are in
the other modules (`timing` times the variants, `export_down`, `scale`, `pieces`, `ranks` and
`telemetry` the other measurements, `instructions` the instruction counts)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from hp_otel.cli.arguments import positive
from hp_otel.cli.progress import to_stderr
from hp_otel.common.safe_text import printable

DESCRIPTION = (
    "Times a training step (forward + backward + zero_grad) in one process over torch's fake "
    "process group, each variant interleaved round after round; prints per variant the median µs per "
    "step, the ratio to untraced (median of per-round ratios, with their interquartile range) and, for "
    "hp_otel's variants, the µs added per recorded event. "
    "--export-down, --scale, --pieces, --ranks and --telemetry measure other things instead (see their help)."
)


def add_arguments(bench: argparse.ArgumentParser) -> None:
    """`python -m benchmarks`'s options (the workloads' and variants' names read from their modules)."""
    from benchmarks.instructions import DEFAULT_STEPS
    from benchmarks.variants import UNTRACED, VARIANT_NAMES
    from benchmarks.workloads import ALIASES, GROUPS, WORKLOADS

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
        help="steps per variant per round, 1 or more (median); default per workload (see --rounds); --export-down: "
        "20; --telemetry: 8",
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
        "--layout",
        choices=("mesh", "world"),
        default="mesh",
        help="--ranks: the groups: mesh (TP groups of --tp ranks and DP groups across them) or world (every "
        "collective on one group of all N ranks, as FSDP over the world)",
    )
    bench.add_argument(
        "--telemetry",
        action="store_true",
        help="instead: what one rank sends with the always-on instrumentor's defaults on the llama step (2 and 8 "
        "layers, 4 gloo ranks): its Prometheus series, OTLP bytes per sampled and unsampled step, per metrics export",
    )
    bench.add_argument(
        "--keep-files",
        metavar="DIR",
        help="--ranks: write the ranks' files to DIR and keep them (default: a temporary folder, removed)",
    )


def _progress(option: str) -> to_stderr:
    """`python -m benchmarks --scale [12.3 s]: ...` lines on stderr."""
    return to_stderr(option, program="python -m benchmarks")


def _bench_ranks(args: argparse.Namespace) -> int:
    import json

    from benchmarks.ranks import format_ranks_bench, ranks_bench_json, run_ranks_bench

    try:
        result = run_ranks_bench(
            args.ranks, args.tp, args.jobs, args.keep_files, _progress("--ranks"), args.evidence, args.layout
        )
    except ValueError as exc:
        print(f"python -m benchmarks: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(ranks_bench_json(result), indent=2) if args.json else "\n".join(format_ranks_bench(result)))
    return 0 if all(result.found.values()) else 1


def run(args: argparse.Namespace) -> int:
    """The measurement the options choose; exit 0, 1 (a planted fault not named), 2 (bad input)."""
    if args.instructions and (args.export_down or args.scale or args.pieces):
        print(
            "python -m benchmarks: --instructions counts the variants' steps; "
            "not with --export-down, --scale or --pieces",
            file=sys.stderr,
        )
        return 2
    if args.ranks is not None:
        return _bench_ranks(args)
    if args.telemetry:
        import json

        from benchmarks.telemetry import format_telemetry_bench, run_telemetry_bench, telemetry_bench_json

        results = run_telemetry_bench(steps=args.steps or 8, progress=_progress("--telemetry"))
        print(
            json.dumps(telemetry_bench_json(results), indent=2)
            if args.json
            else "\n".join(format_telemetry_bench(results))
        )
        return 0
    if args.export_down:
        from benchmarks.export_down import main as bench_export

        print("\n".join(bench_export(args.rounds or 15, args.steps or 20, _progress("--export-down"))))
        return 0
    if args.scale:
        from benchmarks.scale import format_scale_results, run_scale_bench

        print("\n".join(format_scale_results(run_scale_bench(spans=args.spans, progress=_progress("--scale")))))
        return 0
    if args.pieces:
        from benchmarks.pieces import main as bench_pieces

        print(bench_pieces(args.model, args.rounds, args.steps, _progress("--pieces")))
        return 0
    import json

    from benchmarks.instructions import ToolMissing
    from benchmarks.timing import format_results, per_event_tables, results_json, run_bench
    from benchmarks.workloads import workload_names

    names = workload_names(args.model)
    try:
        results = run_bench(
            names,
            rounds=args.rounds,
            steps=args.steps,
            only=args.variant,
            progress=_progress(""),
            instruction_steps=args.counted_steps if args.instructions else None,
            jobs=args.jobs or 1,
        )
    except ToolMissing as exc:
        print(printable(f"python -m benchmarks: {exc}"), file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(results_json(results), indent=2))
    else:
        print("\n\n".join("\n".join(format_results(result)) for result in results))
        events = list(per_event_tables(results))
        if events:
            print("\n" + "\n".join(events).rstrip())
    return 0


def build_parser() -> argparse.ArgumentParser:
    from hp_otel.cli.arguments import DefaultsFormatter

    parser = argparse.ArgumentParser(
        prog="python -m benchmarks", description=DESCRIPTION, formatter_class=DefaultsFormatter
    )
    add_arguments(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m benchmarks ARGS` (run from the repository's root); the exit status as `run` says."""
    return run(build_parser().parse_args(argv))
