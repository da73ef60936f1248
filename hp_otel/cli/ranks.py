"""`hp-otel ranks PATH...`: compare the ranks' collective sequences (see `hp_otel.analysis`).

Exit status: 0 the ranks agree, 3 they diverge or one misses collectives, 4 the ranks given
agree but the files name ranks that have no file (not compared), 2 bad input (one line on
stderr, no traceback; also a rank outside its world size, and files with no collective: nothing
to compare; also a folder holding no rank file, named). A folder stands for the rank files a run
writes in it (`run_folders`).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from hp_otel.cli.arguments import positive
from hp_otel.common.safe_text import printable


def add_arguments(ranks: argparse.ArgumentParser) -> None:
    ranks.add_argument(
        "files",
        type=Path,
        nargs="+",
        metavar="PATH",
        help="one file per rank: spans (OTLP/JSON), collectives file, JSON dump, or torch Flight Recorder dump; "
        "or a folder: the rank files a run writes there, recognised by name (collectives-rank<N>.json, "
        "spans_rank<N>.json, comm_rank<N>.json, nccl_trace_rank_<N>; one kind a folder, in that order)",
    )
    ranks.add_argument("--json", action="store_true", help="the report as JSON")
    ranks.add_argument(
        "--top",
        type=positive,
        default=5,
        metavar="N",
        help="largest skews and slowest collectives to list, and runs shown per rank list of the text "
        "(`0-4095 except 17`; past N runs, a count)",
    )
    ranks.add_argument(
        "--per-collective",
        action="store_true",
        help="--json: every collective's skew and bandwidths, and exposure per module (the JSON then grows with "
        "ranks x collectives); default: the --top largest skews and slowest collectives",
    )
    ranks.add_argument(
        "--jobs",
        type=_jobs,
        default=None,
        metavar="N",
        help="processes reading the files, 1-1024, never more than the cores this process may use "
        "(default: those cores)",
    )


def _jobs(text: str) -> int:
    from hp_otel.analysis.reading_pool import MAX_JOBS

    value = positive(text)
    if value > MAX_JOBS:
        raise argparse.ArgumentTypeError(f"must be 1-{MAX_JOBS} (and no more than the cores are used)")
    return value


def run(args: argparse.Namespace) -> int:
    return run_ranks(args.files, args.json, args.top, args.per_collective, args.jobs)


def run_ranks(
    files: Sequence[Path], as_json: bool, top: int = 5, per_collective: bool = False, jobs: int | None = None
) -> int:
    from hp_otel.analysis import RankInputError, compare_files, format_report, report_to_json
    from hp_otel.analysis.reading_pool import default_jobs
    from hp_otel.analysis.reporting import EXIT_BAD_INPUT, exit_status
    from hp_otel.cli.progress import ReadProgress
    from hp_otel.cli.run_folders import FolderError, expand

    try:
        files = expand(files, lambda line: print(printable(f"hp-otel ranks: {line}"), file=sys.stderr))
    except FolderError as exc:
        print(printable(f"hp-otel ranks: {exc}"), file=sys.stderr)
        return EXIT_BAD_INPUT
    progress = ReadProgress("ranks") if sys.stderr.isatty() else None
    try:
        report = compare_files(files, jobs or default_jobs(), progress, by_module=per_collective)
    except RankInputError as exc:
        print(printable(f"hp-otel ranks: {exc}"), file=sys.stderr)
        return EXIT_BAD_INPUT
    finally:
        if progress is not None:
            progress.done()
    if as_json:
        print(json.dumps(report_to_json(report, per_collective, top), indent=2))
    else:
        print(format_report(report, top=top))
    return exit_status(report)
