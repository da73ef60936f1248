"""One step across ranks as a timeline picture: SVG, or an HTML page that opens without a server.

A lane per rank on one time axis (the spans' own wall-clock times, so ranks on one host
share the clock). Inside a lane, a row per call depth for modules, ops and redistributes
(grey/blue bars), then one row per process group for that rank's collectives, coloured by
op. The same collective on each rank — the same `hp_otel.collective.match.id` in the same group,
which every rank derives alike — is joined by a dashed line from start to start, so skew
between ranks shows as a slanted line (on a 2-D mesh, a TP collective is never joined to a
DP one). Ticks share one unit; a bar is labelled when a few characters fit; each bar's
tooltip names the call, its duration, and for collectives bytes, module and skew.
No dependencies: the SVG is written by hand.
"""

from __future__ import annotations

import html
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan

from hp_otel.common.safe_text import printable
from hp_otel.render.cross_rank import CollectiveKeys, group_label
from hp_otel.spans import exposure, schema
from hp_otel.spans.bandwidth import format_rate
from hp_otel.spans.call_tree import CallRecord, build_call_tree

# Another part of hp_otel may add a bus-bandwidth attribute to collective spans; shown when present.
BUSBW_ATTRIBUTE = "hp_otel.collective.busbw"


def _markup(text: str) -> str:
    """Text from the spans (names, from users' models and others' files) for XML and HTML: control
    characters (not even allowed as `&#...;` in XML 1.0) and bidi overrides written visibly, then `<&>"'`."""
    return html.escape(printable(text))


COLLECTIVE_COLOURS = MappingProxyType(
    {
        "all_reduce": "#d62728",
        "all_gather": "#2ca02c",
        "reduce_scatter": "#ff7f0e",
        "all_to_all": "#9467bd",
        "broadcast": "#8c564b",
        "barrier": "#7f7f7f",
        "send": "#e377c2",
        "recv": "#e377c2",
        "p2p": "#e377c2",  # a batch of sends and receives: as they are
        "gather": "#17becf",
        "scatter": "#17becf",
        "reduce": "#bcbd22",
    }
)
KIND_COLOURS = MappingProxyType(
    {schema.KIND_MODULE: "#b0b7c0", schema.KIND_OP: "#6baed6", schema.KIND_REDISTRIBUTE: "#c6dbef"}
)
OTHER_COLLECTIVE = "#000000"

WIDTH = 1200
LEFT = 110  # lane and row labels
RIGHT = 40  # room for the last tick's label
ROW = 18
LANE_GAP = 14
TOP = 72  # title, legend and axis
CHAR_W = 6.7  # an 11px monospace character
LABEL_MIN_CHARS = 3  # a bar narrower than this many characters carries no label


@dataclass(frozen=True)
class Bar:
    """One call drawn on a rank's lane."""

    rank: int
    depth: int  # the row in the rank's lane: call depth, then one row per group for collectives
    kind: str
    label: str
    start_ns: int
    end_ns: int
    colour: str
    detail: str
    op: str = ""  # collectives: the normalised op
    index: int = -1  # collectives: the how-many-th of this op on this rank (when spans carry no match id)
    skew_ns: int = 0  # collectives: latest minus earliest start of this collective over ranks
    group: str = ""  # collectives: the process group, as the spans name it
    match: tuple[Any, ...] = ()  # collectives: the same on every rank for the same collective
    attributes: Mapping[str, Any] | None = None


def colour_of(record: CallRecord) -> str:
    if record.kind == schema.KIND_COLLECTIVE:
        return COLLECTIVE_COLOURS.get(str(record.attributes.get(schema.COLLECTIVE_OP, "")), OTHER_COLLECTIVE)
    return KIND_COLOURS.get(record.kind, "#dddddd")


def _label(record: CallRecord) -> str:
    if record.kind == schema.KIND_MODULE:
        return f"{record.fqn or record.name}{' [bwd]' if record.phase == schema.PHASE_BACKWARD else ''}"
    if record.kind == schema.KIND_COLLECTIVE:
        return str(record.attributes.get(schema.COLLECTIVE_OP, record.name))
    return record.name


def _detail(record: CallRecord) -> str:
    attrs = record.attributes
    parts = [f"{record.kind} {record.name}", f"{record.duration_ns / 1000:.1f} µs", f"phase {record.phase}"]
    if record.kind == schema.KIND_COLLECTIVE:
        parts.append(
            f"{attrs.get(schema.COLLECTIVE_NAME, '')} group_size={attrs.get(schema.COLLECTIVE_GROUP_SIZE, '?')}"
        )
        if schema.COLLECTIVE_BYTES in attrs:
            parts.append(f"{attrs[schema.COLLECTIVE_BYTES]} bytes")
        if attrs.get(schema.COLLECTIVE_MODULE):
            parts.append(f"in {attrs[schema.COLLECTIVE_MODULE]}")
        if BUSBW_ATTRIBUTE in attrs:
            parts.append(f"busbw {_rate(attrs[BUSBW_ATTRIBUTE])}")
    if record.error:
        parts.append(f"error: {record.error}")
    return "; ".join(parts)


def _rate(value: Any) -> str:
    """A bandwidth attribute (bytes/s) as the table prints it: `1.5 GB/s`."""
    try:
        return format_rate(float(value))
    except (TypeError, ValueError):
        return str(value)


def _group_explained(key: str) -> tuple[str, str]:
    """(row label, its tooltip) for a `group_label` key: `pg tp [0,1]`, and what the row holds."""
    name, _, members = key.rpartition(" [") if key.endswith("]") else (key, "", "")
    ranks = f", global ranks {members[:-1]}" if members else ""
    return f"pg {key}", f"process group {name}{ranks}: the collectives this rank issued on it"


def bars(spans_by_rank: Mapping[int, Sequence[ReadableSpan]]) -> list[Bar]:
    """Every call of every rank as a bar; collectives on one row per group, matched across ranks by match id."""
    out: list[Bar] = []
    for rank, spans in spans_by_rank.items():
        keys = CollectiveKeys()
        mine: list[Bar] = []

        def visit(
            record: CallRecord,
            depth: int,
            rank: int = rank,
            mine: list[Bar] = mine,
            keys: CollectiveKeys = keys,
        ) -> None:
            attrs = record.attributes
            if record.kind == schema.KIND_COLLECTIVE:
                op = str(attrs.get(schema.COLLECTIVE_OP, "")) or record.name
                match, index = keys.key(attrs, op, record.groups)
                group = group_label(attrs, record.groups)
                mine.append(
                    Bar(rank, -1, record.kind, _label(record), record.start_ns, record.end_ns, colour_of(record),
                        _detail(record), op, index, group=group, match=match, attributes=attrs)
                )  # fmt: skip
            else:
                mine.append(
                    Bar(rank, depth, record.kind, _label(record), record.start_ns, record.end_ns, colour_of(record),
                        _detail(record), attributes=attrs)
                )  # fmt: skip
            for child in record.children:
                visit(child, depth + 1)

        for root in build_call_tree(spans):
            visit(root, 0)
        calls_depth = max((b.depth for b in mine if b.kind != schema.KIND_COLLECTIVE), default=-1) + 1
        groups = sorted({b.group for b in mine if b.kind == schema.KIND_COLLECTIVE})
        row_of = {group: calls_depth + i for i, group in enumerate(groups)}
        out += [replace(b, depth=row_of[b.group]) if b.kind == schema.KIND_COLLECTIVE else b for b in mine]
    starts: dict[tuple[Any, ...], list[int]] = {}
    for bar in out:
        if bar.match:
            starts.setdefault(bar.match, []).append(bar.start_ns)
    return [replace(bar, skew_ns=max(starts[bar.match]) - min(starts[bar.match])) if bar.match else bar for bar in out]


def matched_collectives(drawn: Sequence[Bar]) -> dict[tuple[Any, ...], list[Bar]]:
    """The same collective on each rank, by its match key, ranks in order."""
    matched: dict[tuple[Any, ...], list[Bar]] = {}
    for bar in drawn:
        if bar.match:
            matched.setdefault(bar.match, []).append(bar)
    for group in matched.values():
        group.sort(key=lambda b: b.rank)
    return matched


def _nice_step(span: float) -> float:
    """A 1-2-5 step giving about 8 ticks over `span` (any unit)."""
    raw = span / 8
    magnitude = 10.0 ** _floor_log10(raw)
    for factor in (1, 2, 5, 10):
        if raw <= factor * magnitude:
            return factor * magnitude
    return 10 * magnitude


def _floor_log10(value: float) -> int:
    exponent = 0
    if value <= 0:
        return 0
    while value >= 10:
        value /= 10
        exponent += 1
    while value < 1:
        value *= 10
        exponent -= 1
    return exponent


def axis_unit(span_ns: float) -> tuple[str, float]:
    """One unit for every tick of an axis this long: (name, ns per unit)."""
    if span_ns >= 2e9:
        return "s", 1e9
    if span_ns >= 2e6:
        return "ms", 1e6
    return "µs", 1e3


def ticks(span_ns: float) -> list[tuple[float, str]]:
    """(ns from the start, label) for each tick, every label in the same unit."""
    unit, per = axis_unit(span_ns)
    step = _nice_step(span_ns / per)
    out = []
    k = 0
    while k * step * per <= span_ns * (1 + 1e-9):
        value = k * step
        out.append((value * per, f"{round(value, 6):g} {unit}"))
        k += 1
    return out


def _fitted(label: str, width_px: float) -> str:
    """The label, shortened with an ellipsis to fit the bar; "" when too few characters fit."""
    chars = int((width_px - 4) / CHAR_W)
    if chars >= len(label):
        return label
    if chars < LABEL_MIN_CHARS:
        return ""
    return label[: chars - 1] + "…"


def _lane_rows(drawn: Sequence[Bar], rank: int) -> int:
    return max((b.depth for b in drawn if b.rank == rank), default=0) + 1


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

    def x(ns: float) -> float:
        return LEFT + (ns - t0) * scale

    lane_top: dict[int, float] = {}
    y = float(TOP)
    for rank in ranks:
        lane_top[rank] = y
        y += _lane_rows(drawn, rank) * ROW + LANE_GAP
    height = int(y + 10)
    parts: list[str] = []
    for offset, text in ticks(span_ns):
        tx = x(t0 + offset)
        parts.append(f'<line x1="{tx:.1f}" y1="{TOP - 8}" x2="{tx:.1f}" y2="{height - 10}" class="grid"/>')
        parts.append(f'<text x="{tx:.1f}" y="{TOP - 12}" class="tick" text-anchor="middle">{_markup(text)}</text>')
    for rank in ranks:
        top = lane_top[rank]
        rows = _lane_rows(drawn, rank)
        parts.append(
            f'<g class="lane" data-rank="{rank}"><rect x="0" y="{top - 3:.1f}" width="{WIDTH}" '
            f'height="{rows * ROW + 6}" class="lane-bg"/>'
            f'<text x="8" y="{top + ROW - 5:.1f}" class="rank">rank {rank}</text></g>'
        )
        rows_of_groups = sorted(
            {(b.depth, b.group) for b in drawn if b.rank == rank and b.kind == schema.KIND_COLLECTIVE}
        )
        for depth, group in rows_of_groups:
            row_y = top + depth * ROW + ROW - 5
            label, tip = _group_explained(group)
            parts.append(
                f'<text x="8" y="{row_y:.1f}" class="group" data-rank="{rank}" data-group="{_markup(group)}">'
                f"<title>{_markup(tip)}</title>{_markup(_fitted(label, LEFT - 12))}</text>"
            )
    parts.extend(_exposure_labels(spans_by_rank, lane_top))
    for bar in drawn:
        bx, bw = x(bar.start_ns), max((bar.end_ns - bar.start_ns) * scale, 1.0)
        by = lane_top[bar.rank] + bar.depth * ROW
        tip = bar.detail + (f"; start skew over ranks {bar.skew_ns / 1000:.1f} µs" if bar.op else "")
        text = ""
        label = _fitted(bar.label, bw)
        if label:
            fill = "#ffffff" if bar.kind == schema.KIND_COLLECTIVE else "#1b1f24"
            text = f'<text x="{bx + 2:.1f}" y="{by + ROW - 6:.1f}" fill="{fill}">{_markup(label)}</text>'
        parts.append(
            f'<g class="bar" data-rank="{bar.rank}" data-kind="{_markup(bar.kind)}" data-op="{_markup(bar.op)}" '
            f'data-group="{_markup(bar.group)}" data-row="{bar.depth}" '
            f'data-start-ns="{bar.start_ns}" data-end-ns="{bar.end_ns}"><title>{_markup(tip)}</title>'
            f'<rect x="{bx:.2f}" y="{by:.1f}" width="{bw:.2f}" height="{ROW - 3}" fill="{bar.colour}"/>{text}</g>'
        )
    for match, group in matched_collectives(drawn).items():
        for a, b in itertools.pairwise(group):
            ya = lane_top[a.rank] + a.depth * ROW + ROW - 3
            yb = lane_top[b.rank] + b.depth * ROW
            parts.append(
                f'<line x1="{x(a.start_ns):.2f}" y1="{ya:.1f}" x2="{x(b.start_ns):.2f}" y2="{yb:.1f}" '
                f'stroke="{a.colour}" class="skew" data-match="{_markup(str(match[2]))}"/>'
            )
    legend_x = LEFT
    for name, colour in [("module", KIND_COLOURS[schema.KIND_MODULE]), ("op", KIND_COLOURS[schema.KIND_OP]),
                         ("redistribute", KIND_COLOURS[schema.KIND_REDISTRIBUTE])] + [
        (op, COLLECTIVE_COLOURS[op]) for op in sorted({b.op for b in drawn if b.op in COLLECTIVE_COLOURS})
    ]:  # fmt: skip
        parts.append(f'<rect x="{legend_x}" y="27" width="10" height="10" fill="{colour}"/>')
        parts.append(f'<text x="{legend_x + 14}" y="36" class="legend">{_markup(name)}</text>')
        legend_x += 14 + 7 * len(name) + 16
    return _svg(WIDTH, height, parts, title)


_STYLE = (
    "text{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:11px}"
    ".title{font-size:14px;font-weight:bold}.tick{fill:#555;font-size:10px}.rank{font-weight:bold}"
    ".group{fill:#555;font-size:10px}.overlap{fill:#555;font-size:10px;font-style:italic}"
    ".grid{stroke:#e3e6ea;stroke-width:1}.lane-bg{fill:#f6f8fa}.skew{stroke-width:1;stroke-dasharray:3,2}"
)


def _svg(width: int, height: int, parts: list[str], title: str) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="monospace"><style>{_STYLE}</style>'
        f'<rect width="{width}" height="{height}" fill="#ffffff"/>'
        f'<text x="{LEFT}" y="18" class="title">{_markup(title)}</text>' + "".join(parts) + "</svg>\n"
    )


def _cell(value: Any) -> str:
    return f"<td>{_markup(str(value))}</td>"


def collective_rows(drawn: Sequence[Bar]) -> tuple[list[str], list[list[str]]]:
    """The HTML table's header and rows: one row per collective matched across ranks, in start order."""
    matched = matched_collectives(drawn)
    busbw = any(BUSBW_ATTRIBUTE in (b.attributes or {}) for group in matched.values() for b in group)
    header = ["collective", "process group [its ranks]", "ranks seen", "start skew µs", "duration µs per rank"]
    header += ["bytes", "module"]
    header += ["busbw per rank"] if busbw else []
    rows = []
    for group in sorted(matched.values(), key=lambda g: min(b.start_ns for b in g)):
        first = group[0]
        attrs = first.attributes or {}
        durations = ", ".join(f"r{b.rank} {(b.end_ns - b.start_ns) / 1000:.1f}" for b in group)
        row = [
            f"{first.op} #{first.index}",
            first.group,
            str(len(group)),
            f"{first.skew_ns / 1000:.1f}",
            durations,
            str(attrs.get(schema.COLLECTIVE_BYTES, "")),
            str(attrs.get(schema.COLLECTIVE_MODULE, "")),
        ]
        if busbw:
            row.append(", ".join(f"r{b.rank} {_rate((b.attributes or {}).get(BUSBW_ATTRIBUTE, ''))}" for b in group))
        rows.append(row)
    return header, rows


def render_html(spans_by_rank: Mapping[int, Sequence[ReadableSpan]], title: str = "hp_otel timeline") -> str:
    """A page with the SVG inline and a table of the collectives and their skew: opens from disk, no server."""
    header, rows = collective_rows(bars(spans_by_rank))
    table = (
        "<tr>"
        + "".join(f"<th>{_markup(h)}</th>" for h in header)
        + "</tr>"
        + "".join("<tr>" + "".join(map(_cell, row)) + "</tr>" for row in rows)
    )
    return (
        '<!doctype html>\n<html><head><meta charset="utf-8">'
        f"<title>{_markup(title)}</title>"
        "<style>body{font-family:system-ui,sans-serif;margin:16px}svg{max-width:100%;height:auto}"
        "table{border-collapse:collapse;max-width:100%}"
        "td,th{border:1px solid #ccc;padding:2px 8px;font-family:monospace;overflow-wrap:anywhere}</style>"
        "</head><body>"
        f"<h1>{_markup(title)}</h1><p>Hover a bar for the call, its duration and, for collectives, "
        "bytes, module and the start skew over ranks. Each rank's collectives sit on one row per process group, "
        "labelled with the group's name and its global ranks (<code>pg 0 [0,1]</code>: process group 0, ranks 0 "
        "and 1); dashed lines join the same collective (same match id) on each rank. Modules are grey, ops "
        "blue, redistributes light blue; <code>[bwd]</code> marks a module's backward.</p>"
        + render_svg(spans_by_rank, title)
        + exposure_html(spans_by_rank)
        + '<h2>Collectives</h2><table class="collectives">'
        + table
        + "</table></body></html>\n"
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
            f'<text x="8" y="{lane_top[rank] + 2 * ROW - 5:.1f}" class="overlap">{short}</text></g>'
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
        "<h2>Communication exposed</h2><p>Communication: how long the rank's collectives were in flight (the "
        "union of their [issue, completion]); exposed: the part of it the rank's thread spent waiting in a "
        "collective call or wait; overlapped: the rest, when the thread ran something else (compute, or any "
        "host code); the fraction is overlapped over communication.</p>"
        "<table><tr><th>rank</th><th>communication</th></tr>" + rows + "</table>"
    )
