"""`hp-otel plot` and `hp-otel chrome-trace`: one step across ranks as a picture, or as a Chrome/Perfetto trace."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from hp_otel.common.safe_text import printable

PLOT_FORMATS = (".svg", ".html")


def _rank_files(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", type=Path, nargs="+", metavar="FILE", help="spans files (OTLP/JSON), one per rank")


def add_plot_arguments(plot: argparse.ArgumentParser) -> None:
    _rank_files(plot)
    plot.add_argument("-o", "--out", type=Path, default=Path("hp_otel_out/timeline.html"), help="output: .svg or .html")
    plot.add_argument("--step", help="the hp_otel.step() to draw (default: the last one; files without steps: all)")


def add_chrome_trace_arguments(trace: argparse.ArgumentParser) -> None:
    _rank_files(trace)
    trace.add_argument("--format", choices=("chrome",), default="chrome", help="output format")
    trace.add_argument(
        "--merge",
        type=Path,
        action="append",
        metavar="TRACE",
        help="a torch.profiler export_chrome_trace() file; with --per-rank one per rank (by its distributedInfo)",
    )
    trace.add_argument(
        "--per-rank",
        action="store_true",
        help="one Kineto-style file per rank (distributedInfo, collective args), in the folder --out: "
        "what Holistic Trace Analysis reads",
    )
    trace.add_argument(
        "-o",
        "--out",
        type=Path,
        help="output file (default: hp_otel_out/trace.json); with --per-rank a folder (default: hp_otel_out/trace)",
    )
    trace.add_argument("--step", help="the hp_otel.step() to export (default: every span in the files)")


def _load(command: str, args: argparse.Namespace, every_step: bool) -> dict[int, Any] | None:
    """The spans of every rank's file, or None after saying on stderr what is wrong."""
    from hp_otel.render.rank_spans import load_rank_spans
    from hp_otel.spans.otlp_json import SpanFileError

    try:
        spans_by_rank = load_rank_spans(args.files, args.step, every_step=every_step)
    except SpanFileError as exc:
        print(printable(f"hp-otel {command}: {exc}"), file=sys.stderr)
        return None
    return spans_by_rank


def _write_out(command: str, out: Path, write: Any) -> bool:
    """Write `--out` (its folder made if missing); False after one line on stderr naming `--out` and why."""
    from hp_otel.common.files import write_text_atomically

    try:
        if not out.parent.is_dir():
            try:
                out.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise OSError(exc.errno, f"--out: cannot make the folder {str(out.parent)!r} ({exc.strerror})") from exc
        write_text_atomically(out, write, argument="--out")
    except (OSError, TypeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)  # not "[Errno 28] ..."
        print(printable(f"hp-otel {command}: {reason}"), file=sys.stderr)
        return False
    return True


def run_plot(args: argparse.Namespace) -> int:
    from hp_otel.render.timeline import render_html, render_svg

    if args.out.suffix.lower() not in PLOT_FORMATS:
        message = f"hp-otel plot: --out must end in {' or '.join(PLOT_FORMATS)}, got {str(args.out)!r}"
        print(printable(message), file=sys.stderr)
        return 2
    spans_by_rank = _load("plot", args, every_step=False)
    if spans_by_rank is None:
        return 2
    ranks = ", ".join(map(str, spans_by_rank))
    title = f"hp_otel: {'step ' + args.step if args.step else 'one step'} on ranks {ranks}"
    render = render_html if args.out.suffix.lower() == ".html" else render_svg
    text = render(spans_by_rank, title)
    if not _write_out("plot", args.out, lambda handle: handle.write(text)):
        return 2
    print(printable(f"wrote {args.out} ({len(spans_by_rank)} ranks)"))
    return 0


def _say(message: str) -> int:
    print(printable(f"hp-otel chrome-trace: {message}"), file=sys.stderr)
    return 2


def run_chrome_trace(args: argparse.Namespace) -> int:
    from hp_otel.render.chrome_trace import ProfilerTraceError, chrome_trace, read_profiler_trace

    merges = args.merge or []
    if args.per_rank:
        return _run_per_rank(args, merges)
    if len(merges) > 1:
        return _say(f"--merge: one torch.profiler trace, got {len(merges)} (--per-rank takes one per rank)")
    args.out = args.out or Path("hp_otel_out/trace.json")
    spans_by_rank = _load("chrome-trace", args, every_step=args.step is None)
    if spans_by_rank is None:
        return 2
    try:
        profiler = read_profiler_trace(merges[0]) if merges else None
    except ProfilerTraceError as exc:
        return _say(str(exc))
    document = chrome_trace(spans_by_rank, profiler)
    if not _write_out("chrome-trace", args.out, lambda handle: json.dump(document, handle)):
        return 2
    added = sum(1 for event in document["traceEvents"] if str(event.get("cat", "")).startswith("hp_otel."))
    merged = f", merged into {merges[0]}'s {len(profiler['traceEvents'])} events" if profiler else ""
    print(printable(f"wrote {args.out}: {added} hp_otel events on {len(spans_by_rank)} rank track(s){merged}"))
    return 0


def _run_per_rank(args: argparse.Namespace, merges: list[Path]) -> int:
    """`--per-rank`: rank<r>.json per rank in the folder --out, each merged into that rank's profiler trace if given."""
    from hp_otel.render.chrome_trace import (
        ProfilerTraceError,
        chrome_traces_per_rank,
        profiler_rank,
        read_profiler_trace,
    )

    folder = args.out or Path("hp_otel_out/trace")
    spans_by_rank = _load("chrome-trace", args, every_step=args.step is None)
    if spans_by_rank is None:
        return 2
    profilers: dict[int, dict[str, Any]] = {}
    for path in merges:
        try:
            trace = read_profiler_trace(path)
        except ProfilerTraceError as exc:
            return _say(str(exc))
        rank = profiler_rank(trace)
        if rank is None or rank not in spans_by_rank or rank in profilers:
            what = (
                "no distributedInfo rank"
                if rank is None
                else f"rank {rank}, "
                + ("given twice" if rank in profilers else f"not one of the spans' ranks {sorted(spans_by_rank)}")
            )
            return _say(f"--merge {str(path)!r}: {what} (with --per-rank each trace must be a different rank's)")
        profilers[rank] = trace
    documents = chrome_traces_per_rank(spans_by_rank, profilers)
    for rank, document in documents.items():
        out = folder / f"rank{rank}.json"
        if not _write_out("chrome-trace", out, lambda handle, document=document: json.dump(document, handle)):
            return 2
    merged = f", {len(profilers)} merged into its rank's profiler trace" if profilers else ""
    print(printable(f"wrote {len(documents)} Kineto-style rank files to {folder}/{merged}"))
    return 0
