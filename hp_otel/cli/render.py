"""`hp-otel render`: the collective counts and the tracing table again, from a saved spans file."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hp_otel.cli.arguments import DEFAULT_NOISE_LEVEL, NOISE_LEVEL_HELP, noise_level, positive
from hp_otel.common.safe_text import printable


def add_arguments(render: argparse.ArgumentParser) -> None:
    """`hp-otel render`'s options."""
    render.add_argument("file", type=Path, help="an OTLP/JSON spans file")
    render.add_argument(
        "--noise-level", type=noise_level, default=DEFAULT_NOISE_LEVEL, metavar="0-3", help=NOISE_LEVEL_HELP
    )
    render.add_argument(
        "--max-bytes",
        type=positive,
        default=None,
        metavar="N",
        help="refuse files larger than N bytes (default: HP_OTEL_RENDER_MAX_BYTES, else 256 MiB)",
    )


def run(args: argparse.Namespace) -> int:
    """`hp-otel render`: the counts and the table of a spans file; exit status 0, or 2 for a bad file."""
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
