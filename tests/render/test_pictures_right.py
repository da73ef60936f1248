"""Pictures that are right (issue 22, item 4): Chrome-trace tracks that nest, the timeline's
pairing by match id on a 2-D mesh, its rows, axis, labels and table."""

from __future__ import annotations

import dataclasses
import json
import re
import time
import xml.etree.ElementTree as ET
from itertools import combinations

import pytest
from events import ALL_REDUCE
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan

from hp_otel import CommDebugMode, step
from hp_otel.cli import main
from hp_otel.render.chrome_trace import chrome_trace, nesting_lanes
from hp_otel.render.timeline import bars, render_html, render_svg, ticks
from hp_otel.spans import schema
from hp_otel.spans.infos import ModuleInfo

SVG = "{http://www.w3.org/2000/svg}"


def _partial_overlaps(events: list[dict]) -> list[tuple[dict, dict]]:
    """Pairs of complete events on one (pid, tid) that overlap without one containing the other
    (times in whole ns, as a trace importer reads µs with 3 decimals: touching events do not overlap)."""
    by_track: dict[tuple[int, int], list[dict]] = {}
    for e in events:
        if e["ph"] == "X":
            by_track.setdefault((e["pid"], e["tid"]), []).append(e)
    bad = []
    for track in by_track.values():
        for a, b in combinations(track, 2):
            a0, a1 = round(a["ts"] * 1000), round((a["ts"] + a["dur"]) * 1000)
            b0, b1 = round(b["ts"] * 1000), round((b["ts"] + b["dur"]) * 1000)
            overlap = a0 < b1 and b0 < a1
            nested = (a0 <= b0 and b1 <= a1) or (b0 <= a0 and a1 <= b1)
            if overlap and not nested:
                bad.append((a, b))
    return bad


@pytest.fixture
def transformer_step_spans(fake_world):  # type: ignore[no-untyped-def]
    """The demo's TP + SP transformer, one forward + backward on the fake process group."""
    from hp_otel.workloads.tp_mlp import train_step
    from hp_otel.workloads.tp_transformer import build_tp_transformer, demo_tokens

    model = build_tp_transformer(fake_world)
    with CommDebugMode(module=model) as mode:
        train_step(model, demo_tokens())
    return mode.get_finished_spans()


def test_chrome_trace_of_the_transformer_has_no_partially_overlapping_events_on_a_track(
    transformer_step_spans,
) -> None:
    spans = transformer_step_spans
    events = chrome_trace({0: spans})["traceEvents"]
    calls = [e for e in events if e["ph"] == "X"]
    assert len(calls) == len(spans)
    assert _partial_overlaps(calls) == []
    # the referee: on one track, as before, the async collectives ending after their op overlap partially
    one_track = [dict(e, tid=1) for e in calls]
    assert len(_partial_overlaps(one_track)) > 0
    names = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    collective_tids = {e["tid"] for e in calls if e["cat"] == "hp_otel.collective"}
    assert collective_tids and all(names[t].startswith("collectives ") for t in collective_tids)
    assert {names[e["tid"]] for e in calls if e["cat"] == "hp_otel.module"} == {"calls"}


def test_nesting_lanes_keep_nested_calls_together_and_split_partial_overlaps() -> None:
    intervals = [(0, 10), (1, 4), (5, 9), (3, 12), (11, 13)]
    lanes = nesting_lanes(intervals)
    assert lanes[:3] == [0, 0, 0] and lanes[3] != 0
    for lane in set(lanes):
        mine = [iv for iv, la in zip(intervals, lanes, strict=True) if la == lane]
        for (a0, a1), (b0, b1) in combinations(mine, 2):
            assert not (a0 < b1 and b0 < a1) or (a0 <= b0 and b1 <= a1) or (b0 <= a0 and a1 <= b1)


# --- a 2-D mesh: dp x tp = 2 x 2, ranks 0..3; tp groups [0,1] and [2,3], dp groups [0,2] and [1,3] ---

TP = {0: (0, 1), 1: (0, 1), 2: (2, 3), 3: (2, 3)}
DP = {0: (0, 2), 1: (1, 3), 2: (0, 2), 3: (1, 3)}


def _play_2d_rank(rank: int, monkeypatch, base_ns: int) -> list[ReadableSpan]:  # type: ignore[no-untyped-def]
    """Rank `rank`'s window: an all_reduce on its tp group, then one on its dp group (as FSDP+TP issue them),
    each rank 100 µs * rank late, times made up (the ranks are played one after the other)."""
    monkeypatch.setenv("RANK", str(rank))
    tp = dataclasses.replace(ALL_REDUCE, group="tp", group_ranks=TP[rank])
    dp = dataclasses.replace(ALL_REDUCE, group="dp", group_ranks=DP[rank])
    with step(7, run_id="mesh-2d", rank=rank), CommDebugMode() as mode:  # one step: the ranks' match ids agree
        observer = mode.observer
        observer.on_module_enter(ModuleInfo("layers.0", "layers.0", "Block"), "forward")
        for k, info in enumerate((tp, dp)):
            start = base_ns + k * 1_000_000 + rank * 100_000
            ticket = observer.on_collective_issue(info, start)
            observer.on_collective(info, start, start + 200_000, None, None, ticket)
        observer.on_module_exit("layers.0", "forward")
    return [
        ReadableSpan(
            name=sp.name,
            context=sp.context,
            parent=sp.parent,
            resource=Resource({schema.RESOURCE_RANK: rank}),
            attributes=dict(sp.attributes),
            start_time=sp.start_time,
            end_time=sp.end_time,
        )
        for sp in mode.get_finished_spans()
    ]


@pytest.fixture
def mesh_2d(monkeypatch):  # type: ignore[no-untyped-def]
    base_ns = time.time_ns()  # one made-up clock for the ranks, near the modules' real one
    return {rank: _play_2d_rank(rank, monkeypatch, base_ns) for rank in range(4)}


def test_plot_joins_collectives_of_the_same_group_only_on_a_2d_mesh(mesh_2d) -> None:
    root = ET.fromstring(render_svg(mesh_2d))
    drawn = [g for g in root.iter(f"{SVG}g") if g.get("class") == "bar" and g.get("data-kind") == "collective"]
    assert len(drawn) == 8
    # one collectives row per rank and group: rank r's tp and dp all_reduce on two rows, the same two on every rank
    for rank in range(4):
        rows = {g.get("data-group"): g.get("data-row") for g in drawn if g.get("data-rank") == str(rank)}
        assert set(rows) == {f"tp [{','.join(map(str, TP[rank]))}]", f"dp [{','.join(map(str, DP[rank]))}]"}
        assert len(set(rows.values())) == 2
    # the referee: every dashed line joins two ranks of one group; the k-th all_reduce of each rank would not
    expected = {frozenset(TP[r]) for r in range(4)} | {frozenset(DP[r]) for r in range(4)}
    lines = [line for line in root.iter(f"{SVG}line") if line.get("class") == "skew"]
    joined = set()
    for line in lines:
        x1, x2 = float(line.get("x1")), float(line.get("x2"))
        ends = [
            int(g.get("data-rank"))
            for g in drawn
            for x in (x1, x2)
            if abs(float(g.find(f"{SVG}rect").get("x")) - x) < 0.01
        ]
        joined.add(frozenset(ends))
    assert joined == expected and len(lines) == 4
    by_rank0 = {b.group: b for b in bars(mesh_2d) if b.rank == 0 and b.op}
    assert by_rank0["tp [0,1]"].skew_ns == 100_000 and by_rank0["dp [0,2]"].skew_ns == 200_000


def _without_bandwidth(spans_by_rank):
    """The same spans without the bandwidth attributes the recorder adds (as an older hp_otel wrote)."""
    drop = {schema.COLLECTIVE_BUSBW, schema.COLLECTIVE_ALGBW, schema.COLLECTIVE_BW_BYTES}
    return {
        rank: [
            ReadableSpan(
                name=sp.name,
                context=sp.context,
                parent=sp.parent,
                resource=sp.resource,
                attributes={k: v for k, v in sp.attributes.items() if k not in drop},
                start_time=sp.start_time,
                end_time=sp.end_time,
            )
            for sp in spans
        ]
        for rank, spans in spans_by_rank.items()
    }


def test_the_table_lists_each_collective_once_with_bytes_and_module(mesh_2d) -> None:
    page = render_html(_without_bandwidth(mesh_2d))
    table = page.split('<table class="collectives">')[1]
    header = re.findall(r"<th>(.*?)</th>", table)
    assert header == [
        "collective",
        "process group [its ranks]",
        "ranks seen",
        "start skew µs",
        "duration µs per rank",
        "bytes",
        "module",
    ]
    rows = re.findall(r"<tr><td>(.*?)</tr>", table)
    assert len(rows) == 4  # tp [0,1], tp [2,3], dp [0,2], dp [1,3]
    assert all(f"<td>{ALL_REDUCE.bytes}</td><td>layers.0</td>" in row for row in rows)


def test_the_table_shows_busbw_when_the_spans_carry_it(mesh_2d) -> None:
    with_busbw = {
        rank: [
            ReadableSpan(
                name=sp.name,
                context=sp.context,
                parent=sp.parent,
                resource=sp.resource,
                attributes={**sp.attributes, "hp_otel.collective.busbw": 1.5e9}
                if sp.attributes.get(schema.CALL_KIND) == schema.KIND_COLLECTIVE
                else dict(sp.attributes),
                start_time=sp.start_time,
                end_time=sp.end_time,
            )
            for sp in spans
        ]
        for rank, spans in mesh_2d.items()
    }
    page = render_html(with_busbw)
    # with its unit, as the table prints it (issue 35 item 5: before, `r0 1500000000.0`)
    assert "<th>busbw per rank</th>" in page and "r0 1.5 GB/s, r1 1.5 GB/s" in page
    assert "busbw 1.5 GB/s" in page  # the bar's tooltip too


def test_the_page_explains_its_rows_and_links_nowhere_a_file_cannot_reach(mesh_2d) -> None:
    """Opened from disk, the page stands alone: the group rows say what they are, and no text
    sends the reader to a path of the repository (issue 35 item 5)."""
    page = render_html(mesh_2d)
    root = ET.fromstring(render_svg(mesh_2d))
    labels = {t.get("data-group"): t for t in root.iter(f"{SVG}text") if t.get("class") == "group"}
    assert set(labels) >= {"tp [0,1]", "dp [0,2]"}
    label = labels["tp [0,1]"]
    assert "".join(label.itertext()).endswith("pg tp [0,1]")
    (title,) = label.iter(f"{SVG}title")
    assert title.text == "process group tp, global ranks 0,1: the collectives this rank issued on it"
    assert "docs/" not in page and ".md" not in page
    assert "pg tp [0,1]" in page and "process group" in page.split("<svg", 1)[0]  # the intro says it


@pytest.mark.parametrize(
    ("span_ns", "unit"), [(800, "µs"), (900_000, "µs"), (1_500_000, "µs"), (25_000_000, "ms"), (3e9, "s")]
)
def test_every_tick_has_the_same_unit_and_the_last_fits(span_ns, unit) -> None:
    marks = ticks(span_ns)
    assert len(marks) >= 4 and marks[0][1] == f"0 {unit}"
    assert {label.split()[1] for _, label in marks} == {unit}
    assert marks[-1][0] <= span_ns * (1 + 1e-9)


def test_svg_ticks_stay_inside_the_picture_and_labels_fit_their_bars(mesh_2d) -> None:
    root = ET.fromstring(render_svg(mesh_2d))
    width = float(root.get("width"))
    for text in root.iter(f"{SVG}text"):
        if text.get("class") == "tick":
            half = 6.7 * len(text.text) / 2
            assert half <= float(text.get("x")) <= width - half, text.text
    for bar in (g for g in root.iter(f"{SVG}g") if g.get("class") == "bar"):
        label = bar.find(f"{SVG}text")
        if label is not None:
            assert len(label.text) * 6.7 <= float(bar.find(f"{SVG}rect").get("width")), label.text


def test_plot_cli_draws_the_2d_mesh(mesh_2d, tmp_path) -> None:
    from hp_otel.spans.otlp_json import write_spans

    files = []
    for rank, spans in mesh_2d.items():
        files.append(str(tmp_path / f"spans_rank{rank}.json"))
        write_spans(files[-1], spans)
    out = tmp_path / "t.html"
    assert main(["plot", *files, "-o", str(out)]) == 0
    assert out.read_text().count('class="skew"') == 4
    trace = tmp_path / "trace.json"
    assert main(["chrome-trace", *files, "-o", str(trace)]) == 0
    assert _partial_overlaps(json.loads(trace.read_text())["traceEvents"]) == []
