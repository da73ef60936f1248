"""`hp-otel plot` and `hp-otel export`: one step across ranks as a picture, or as a Chrome/Perfetto trace."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

PLOT_FORMATS = (".svg", ".html")


def add_parsers(sub: Any, formatter: type[argparse.HelpFormatter]) -> None:
    plot = sub.add_parser(
        "plot",
        help="draw one step across ranks as a timeline (SVG, or HTML that opens without a server)",
        description="A lane per rank on one time axis; modules, ops and redistributes as bars, collectives "
        "coloured by op, the same collective joined across ranks so skew shows. Hover a bar for details.",
        formatter_class=formatter,
    )
    plot.add_argument("files", type=Path, nargs="+", metavar="FILE", help="spans files (OTLP/JSON), one per rank")
    plot.add_argument("-o", "--out", type=Path, default=Path("hp_otel_out/timeline.html"), help="output: .svg or .html")
    plot.add_argument("--step", help="the hp_otel.step() to draw (default: the last one; files without steps: all)")

    export = sub.add_parser(
        "export",
        help="write spans as Chrome/Perfetto trace-event JSON, optionally merged with a torch.profiler trace",
        description="Open the result in ui.perfetto.dev or chrome://tracing. With --merge, hp_otel's tracks are "
        "added to a torch.profiler chrome trace of the same run (same clock), next to its CPU ops and kernels.",
        formatter_class=formatter,
    )
    export.add_argument("files", type=Path, nargs="+", metavar="FILE", help="spans files (OTLP/JSON), one per rank")
    export.add_argument("--format", choices=("chrome",), default="chrome", help="output format")
    export.add_argument("--merge", type=Path, metavar="TRACE", help="a torch.profiler export_chrome_trace() file")
    export.add_argument("-o", "--out", type=Path, default=Path("hp_otel_out/trace.json"), help="output file")
    export.add_argument("--step", help="the hp_otel.step() to export (default: every span in the files)")


def run(args: argparse.Namespace) -> int:
    from hp_otel.common.files import write_text_atomically
    from hp_otel.render.rank_spans import load_rank_spans
    from hp_otel.spans.otlp_json import SpanFileError

    command = args.command
    if command == "plot" and args.out.suffix.lower() not in PLOT_FORMATS:
        print(f"hp-otel plot: --out must end in {' or '.join(PLOT_FORMATS)}, got {str(args.out)!r}", file=sys.stderr)
        return 2
    try:
        spans_by_rank = load_rank_spans(args.files, args.step, every_step=command == "export" and args.step is None)
    except SpanFileError as exc:
        print(f"hp-otel {command}: {exc}", file=sys.stderr)
        return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if command == "plot":
        from hp_otel.render.timeline import render_html, render_svg

        ranks = ", ".join(map(str, spans_by_rank))
        title = f"hp_otel: {'step ' + args.step if args.step else 'one step'} on ranks {ranks}"
        render = render_html if args.out.suffix.lower() == ".html" else render_svg
        text = render(spans_by_rank, title)
        write_text_atomically(args.out, lambda handle: handle.write(text), argument="--out")
        print(f"wrote {args.out} ({len(spans_by_rank)} ranks)")
        return 0
    from hp_otel.render.chrome_trace import ProfilerTraceError, chrome_trace, read_profiler_trace

    try:
        profiler = read_profiler_trace(args.merge) if args.merge else None
    except ProfilerTraceError as exc:
        print(f"hp-otel export: {exc}", file=sys.stderr)
        return 2
    document = chrome_trace(spans_by_rank, profiler)
    write_text_atomically(args.out, lambda handle: json.dump(document, handle), argument="--out")
    added = sum(1 for event in document["traceEvents"] if str(event.get("cat", "")).startswith("hp_otel."))
    merged = f", merged into {args.merge}'s {len(profiler['traceEvents'])} events" if profiler else ""
    print(f"wrote {args.out}: {added} hp_otel events on {len(spans_by_rank)} rank track(s){merged}")
    return 0
