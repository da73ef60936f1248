"""One step across ranks as a timeline picture: SVG, or an HTML page that opens without a server.

A lane per rank on one time axis (the spans' own wall-clock times, so ranks on one host
share the clock); inside a lane a row per call depth: modules, ops and redistributes as
grey/blue bars, collectives coloured by op. The k-th collective of an op on each rank is
joined by a dashed line from start to start, so skew between ranks shows as a slanted
line; each bar's tooltip names the call, its duration, and for collectives the skew.
No dependencies: the SVG is written by hand.
"""

from __future__ import annotations

import html
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from opentelemetry.sdk.trace import ReadableSpan

from hp_otel.common.safe_text import printable
from hp_otel.spans import exposure
from hp_otel.spans import schema as s
from hp_otel.spans.call_tree import CallRecord, build_call_tree


def _markup(text: str) -> str:
    """Text from the spans (names, from users' models and others' files) for XML and HTML: control
    characters (not even allowed as `&#...;` in XML 1.0) and bidi overrides written visibly, then `<&>"'`."""
    return html.escape(printable(text))


COLLECTIVE_COLOURS = {
    "all_reduce": "#d62728",
    "all_gather": "#2ca02c",
    "reduce_scatter": "#ff7f0e",
    "all_to_all": "#9467bd",
    "broadcast": "#8c564b",
    "barrier": "#7f7f7f",
    "send": "#e377c2",
    "recv": "#e377c2",
    "gather": "#17becf",
    "scatter": "#17becf",
    "reduce": "#bcbd22",
}
KIND_COLOURS = {s.KIND_MODULE: "#b0b7c0", s.KIND_OP: "#6baed6", s.KIND_REDISTRIBUTE: "#c6dbef"}
OTHER_COLLECTIVE = "#000000"

WIDTH = 1200
LEFT = 90  # lane labels
RIGHT = 20
ROW = 18
LANE_GAP = 14
TOP = 72  # title, legend and axis


@dataclass(frozen=True)
class Bar:
    """One call drawn on a rank's lane."""

    rank: int
    depth: int
    kind: str
    label: str
    start_ns: int
    end_ns: int
    colour: str
    detail: str
    op: str = ""  # collectives: the normalised op
    index: int = -1  # collectives: the how-many-th of this op on this rank
    skew_ns: int = 0  # collectives: latest minus earliest start of this op's index over ranks


def colour_of(record: CallRecord) -> str:
    if record.kind == s.KIND_COLLECTIVE:
        return COLLECTIVE_COLOURS.get(str(record.attributes.get(s.COLLECTIVE_OP, "")), OTHER_COLLECTIVE)
    return KIND_COLOURS.get(record.kind, "#dddddd")


def _label(record: CallRecord) -> str:
    if record.kind == s.KIND_MODULE:
        return f"{record.fqn or record.name}{' [bwd]' if record.phase == s.PHASE_BACKWARD else ''}"
    if record.kind == s.KIND_COLLECTIVE:
        return str(record.attributes.get(s.COLLECTIVE_OP, record.name))
    return record.name


def _detail(record: CallRecord) -> str:
    attrs = record.attributes
    parts = [f"{record.kind} {record.name}", f"{record.duration_ns / 1000:.1f} µs", f"phase {record.phase}"]
    if record.kind == s.KIND_COLLECTIVE:
        parts.append(f"{attrs.get(s.COLLECTIVE_NAME, '')} group_size={attrs.get(s.COLLECTIVE_GROUP_SIZE, '?')}")
        if s.COLLECTIVE_BYTES in attrs:
            parts.append(f"{attrs[s.COLLECTIVE_BYTES]} bytes")
    if record.error:
        parts.append(f"error: {record.error}")
    return "; ".join(parts)


def bars(spans_by_rank: Mapping[int, Sequence[ReadableSpan]]) -> list[Bar]:
    """Every call of every rank as a bar, collectives matched across ranks by op and order."""
    out: list[Bar] = []
    for rank, spans in spans_by_rank.items():
        counters: dict[str, int] = {}

        def visit(record: CallRecord, depth: int, rank: int = rank, counters: dict[str, int] = counters) -> None:
            op = str(record.attributes.get(s.COLLECTIVE_OP, "")) if record.kind == s.KIND_COLLECTIVE else ""
            index = -1
            if op:
                index = counters[op] = counters.get(op, -1) + 1
            out.append(
                Bar(rank, depth, record.kind, _label(record), record.start_ns, record.end_ns, colour_of(record),
                    _detail(record), op, index)
            )  # fmt: skip
            for child in record.children:
                visit(child, depth + 1)

        for root in build_call_tree(spans):
            visit(root, 0)
    starts: dict[tuple[str, int], list[int]] = {}
    for bar in out:
        if bar.op:
            starts.setdefault((bar.op, bar.index), []).append(bar.start_ns)
    return [
        Bar(**{**bar.__dict__, "skew_ns": max(starts[(bar.op, bar.index)]) - min(starts[(bar.op, bar.index)])})
        if bar.op
        else bar
        for bar in out
    ]


def _nice_step(span_ns: float) -> float:
    raw = span_ns / 8
    magnitude = 10 ** (len(str(int(raw))) - 1) if raw >= 1 else 1
    for factor in (1, 2, 5, 10):
        if raw <= factor * magnitude:
            return float(factor * magnitude)
    return float(10 * magnitude)


def _time_text(ns: float) -> str:
    if ns >= 1e6:
        return f"{ns / 1e6:g} ms"
    return f"{ns / 1e3:g} µs"


def render_svg(spans_by_rank: Mapping[int, Sequence[ReadableSpan]], title: str = "hp_otel timeline") -> str:
    """The timeline as a standalone SVG document."""
    drawn = bars(spans_by_rank)
    ranks = sorted(spans_by_rank)
    if not drawn:
        return _svg(WIDTH, TOP + ROW, [f'<text x="{LEFT}" y="{TOP}">no hp_otel calls in these spans</text>'], title)
    t0 = min(b.start_ns for b in drawn)
    t1 = max(b.end_ns for b in drawn)
    span_ns = max(t1 - t0, 1)
    scale = (WIDTH - LEFT - RIGHT) / span_ns

    def x(ns: int) -> float:
        return LEFT + (ns - t0) * scale

    lane_top: dict[int, float] = {}
    y = float(TOP)
    for rank in ranks:
        lane_top[rank] = y
        depth = max((b.depth for b in drawn if b.rank == rank), default=0)
        y += (depth + 1) * ROW + LANE_GAP
    height = int(y + 10)
    parts: list[str] = []
    step = _nice_step(span_ns)
    tick = 0.0
    while tick <= span_ns:
        tx = x(int(t0 + tick))
        parts.append(f'<line x1="{tx:.1f}" y1="{TOP - 8}" x2="{tx:.1f}" y2="{height - 10}" class="grid"/>')
        parts.append(f'<text x="{tx + 2:.1f}" y="{TOP - 12}" class="tick">{_time_text(tick)}</text>')
        tick += step
    for rank in ranks:
        top = lane_top[rank]
        depth = max((b.depth for b in drawn if b.rank == rank), default=0)
        parts.append(
            f'<g class="lane" data-rank="{rank}"><rect x="0" y="{top - 3:.1f}" width="{WIDTH}" '
            f'height="{(depth + 1) * ROW + 6}" class="lane-bg"/>'
            f'<text x="8" y="{top + ROW - 5:.1f}" class="rank">rank {rank}</text></g>'
        )
    parts.extend(_exposure_labels(spans_by_rank, lane_top))
    for bar in drawn:
        bx, bw = x(bar.start_ns), max((bar.end_ns - bar.start_ns) * scale, 1.0)
        by = lane_top[bar.rank] + bar.depth * ROW
        tip = bar.detail + (f"; start skew over ranks {bar.skew_ns / 1000:.1f} µs" if bar.op else "")
        text = ""
        if bw > 7 * len(bar.label) + 4:
            fill = "#ffffff" if bar.kind == s.KIND_COLLECTIVE else "#1b1f24"
            text = f'<text x="{bx + 3:.1f}" y="{by + ROW - 6:.1f}" fill="{fill}">{_markup(bar.label)}</text>'
        parts.append(
            f'<g class="bar" data-rank="{bar.rank}" data-kind="{_markup(bar.kind)}" data-op="{_markup(bar.op)}" '
            f'data-start-ns="{bar.start_ns}" data-end-ns="{bar.end_ns}"><title>{_markup(tip)}</title>'
            f'<rect x="{bx:.2f}" y="{by:.1f}" width="{bw:.2f}" height="{ROW - 3}" fill="{bar.colour}"/>{text}</g>'
        )
    matched: dict[tuple[str, int], list[Bar]] = {}
    for bar in drawn:
        if bar.op:
            matched.setdefault((bar.op, bar.index), []).append(bar)
    for group in matched.values():
        group.sort(key=lambda b: b.rank)
        for a, b in itertools.pairwise(group):
            ya = lane_top[a.rank] + a.depth * ROW + ROW - 3
            yb = lane_top[b.rank] + b.depth * ROW
            parts.append(
                f'<line x1="{x(a.start_ns):.2f}" y1="{ya:.1f}" x2="{x(b.start_ns):.2f}" y2="{yb:.1f}" '
                f'stroke="{a.colour}" class="skew"/>'
            )
    legend_x = LEFT
    for name, colour in [("module", KIND_COLOURS[s.KIND_MODULE]), ("op", KIND_COLOURS[s.KIND_OP]),
                         ("redistribute", KIND_COLOURS[s.KIND_REDISTRIBUTE])] + [
        (op, COLLECTIVE_COLOURS[op]) for op in sorted({b.op for b in drawn if b.op in COLLECTIVE_COLOURS})
    ]:  # fmt: skip
        parts.append(f'<rect x="{legend_x}" y="27" width="10" height="10" fill="{colour}"/>')
        parts.append(f'<text x="{legend_x + 14}" y="36" class="legend">{_markup(name)}</text>')
        legend_x += 14 + 7 * len(name) + 16
    return _svg(WIDTH, height, parts, title)


_STYLE = (
    "text{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:11px}"
    ".title{font-size:14px;font-weight:bold}.tick{fill:#555;font-size:10px}.rank{font-weight:bold}"
    ".grid{stroke:#e3e6ea;stroke-width:1}.lane-bg{fill:#f6f8fa}.skew{stroke-width:1;stroke-dasharray:3,2}"
)


def _svg(width: int, height: int, parts: list[str], title: str) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="monospace"><style>{_STYLE}</style>'
        f'<rect width="{width}" height="{height}" fill="#ffffff"/>'
        f'<text x="{LEFT}" y="18" class="title">{_markup(title)}</text>' + "".join(parts) + "</svg>\n"
    )


def render_html(spans_by_rank: Mapping[int, Sequence[ReadableSpan]], title: str = "hp_otel timeline") -> str:
    """A page with the SVG inline and a table of the collectives and their skew: opens from disk, no server."""
    rows = []
    matched: dict[tuple[str, int], list[Bar]] = {}
    for bar in bars(spans_by_rank):
        if bar.op:
            matched.setdefault((bar.op, bar.index), []).append(bar)
    for (op, index), group in sorted(matched.items(), key=lambda item: min(b.start_ns for b in item[1])):
        by_rank = sorted(group, key=lambda b: b.rank)
        durations = ", ".join(f"r{b.rank} {(b.end_ns - b.start_ns) / 1000:.1f}" for b in by_rank)
        rows.append(
            f"<tr><td>{_markup(op)} #{index}</td><td>{len(group)}</td>"
            f"<td>{group[0].skew_ns / 1000:.1f}</td><td>{_markup(durations)}</td></tr>"
        )
    return (
        '<!doctype html>\n<html><head><meta charset="utf-8">'
        f"<title>{_markup(title)}</title>"
        "<style>body{font-family:system-ui,sans-serif;margin:16px}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:2px 8px;font-family:monospace}</style></head><body>"
        f"<h1>{_markup(title)}</h1><p>Hover a bar for the call, its duration and, for collectives, "
        "the start skew over ranks. Dashed lines join the same collective on each rank.</p>"
        + render_svg(spans_by_rank, title)
        + exposure_html(spans_by_rank)
        + "<h2>Collectives</h2><table><tr><th>collective</th><th>ranks</th><th>start skew µs</th>"
        "<th>duration µs per rank</th></tr>" + "".join(rows) + "</table></body></html>\n"
    )


def rank_exposure(spans_by_rank: Mapping[int, Sequence[ReadableSpan]]) -> dict[int, exposure.Exposure]:
    """Per rank, its windows' communication time and exposed time added up."""
    out: dict[int, exposure.Exposure] = {}
    for rank, spans in spans_by_rank.items():
        totals = [r.total for r in exposure.by_window(spans).values() if r.total.collectives]
        if totals:
            out[rank] = exposure.Exposure(
                sum(e.comm_ns for e in totals), sum(e.exposed_ns for e in totals), sum(e.collectives for e in totals)
            )
    return out


def _exposure_labels(spans_by_rank: Mapping[int, Sequence[ReadableSpan]], lane_top: Mapping[int, float]) -> list[str]:
    """Under each lane's rank name: its overlap fraction (the whole summary as the tooltip)."""
    parts = []
    for rank, e in rank_exposure(spans_by_rank).items():
        if rank not in lane_top:
            continue
        fraction = e.overlap_fraction
        short = f"overlap {fraction:.0%}" if fraction is not None else "overlap -"
        parts.append(
            f'<g class="exposure" data-rank="{rank}" data-comm-ns="{e.comm_ns}" data-exposed-ns="{e.exposed_ns}">'
            f"<title>{_markup(exposure.describe(e))}</title>"
            f'<text x="8" y="{lane_top[rank] + 2 * ROW - 5:.1f}" class="tick">{short}</text></g>'
        )
    return parts


def exposure_html(spans_by_rank: Mapping[int, Sequence[ReadableSpan]]) -> str:
    """The per-rank summary of exposed communication, for the HTML page."""
    rows = "".join(
        f"<tr><td>{rank}</td><td>{_markup(exposure.describe(e))}</td></tr>"
        for rank, e in sorted(rank_exposure(spans_by_rank).items())
    )
    if not rows:
        return ""
    return (
        "<h2>Communication exposed</h2><p>In flight: union of the collectives' [issue, completion]; exposed: "
        "the part the rank's thread waited for (docs/overlap.md).</p>"
        "<table><tr><th>rank</th><th>communication</th></tr>" + rows + "</table>"
    )
