"""`hp-otel diff A B`: what changed in communication between two runs (see `hp_otel.analysis.run_diff`).

Exit status: 0 the same (bytes within the tolerance), 3 different, 2 a run cannot be read
(one line on stderr, no traceback).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from hp_otel.common.safe_text import printable

EXIT_SAME = 0
EXIT_BAD_INPUT = 2
EXIT_DIFFERENT = 3


def _tolerance(text: str) -> object:
    from hp_otel.analysis.run_diff import parse_bytes_tolerance

    try:
        return parse_bytes_tolerance(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_arguments(diff: argparse.ArgumentParser) -> None:
    for name, which in (("a", "before"), ("b", "after")):
        diff.add_argument(
            name,
            type=Path,
            metavar=name.upper(),
            help=f"the run {which}: a spans file (OTLP/JSON), a JSON dump or a snapshot of one process, "
            "or a folder of per-rank .json files",
        )
    diff.add_argument("--json", action="store_true", help="the report as JSON")
    diff.add_argument(
        "--bytes-tolerance",
        type=_tolerance,
        default=None,
        metavar="N|P%",
        help="bytes of a (module, phase, op) may differ by N bytes, or P%% of A's, and still count as the same "
        "(counts must always match; default: exact)",
    )


def run(args: argparse.Namespace) -> int:
    from hp_otel.analysis.run_diff import DiffInputError, diff_paths, diff_to_json, format_diff

    try:
        result = diff_paths(args.a, args.b, args.bytes_tolerance)
    except DiffInputError as exc:
        print(printable(f"hp-otel diff: {exc}"), file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.json:
        print(json.dumps(diff_to_json(result), indent=2))
    else:
        print(format_diff(result))
    return EXIT_SAME if result.same else EXIT_DIFFERENT
