"""`hp-otel chrome-trace` output opened in the real Perfetto UI (offline, headless Chromium).

The referee is Perfetto's own importer, running in the page as it does for a user: its
`stats` table counts what it could not parse or had to drop (a JSON error, complete
events that overlap partially on one track, an end without a begin), and its `slice` and
`flow` tables hold what it will draw. Four traces, one browser: rank 0 of a real 2-rank
gloo demo alone, both ranks in one trace, three ranks (a recorded window shifted per
rank: a chain of flows), and a traced step merged into its torch.profiler trace
(`--merge`). The flows are checked against the spans files themselves: one per pair of
ranks that ran the same collective (`hp_otel.collective.match.id`), from the rank that started
it first. A broken trace, last, shows the same check fails.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest
import servers
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from perfetto_ui import PerfettoUI, perfetto_ui_dir, serve, start_browser

from benchmarks.scale import record_window
from hp_otel.cli import main
from hp_otel.spans import schema
from hp_otel.spans.otlp_json import read_spans, write_spans

pytestmark = [pytest.mark.browser, pytest.mark.multiprocess]  # a 2-rank demo and a browser running the Perfetto UI

NAMED_ERRORS = ("json_parser_failure", "slice_drop_overlapping_complete_event", "misplaced_end_event")
FLOWS = """
select o.category as category, oa.display_value as out_match, ia.display_value as in_match,
       op.pid as out_pid, ip.pid as in_pid, o.ts as out_ts, i.ts as in_ts
from flow f
join slice o on f.slice_out = o.id join slice i on f.slice_in = i.id
join thread_track ot on o.track_id = ot.id join thread oth on ot.utid = oth.utid join process op on oth.upid = op.upid
join thread_track it on i.track_id = it.id join thread ith on it.utid = ith.utid join process ip on ith.upid = ip.upid
left join args oa on oa.arg_set_id = o.arg_set_id and oa.key = 'args.hp_otel.collective.match.id'
left join args ia on ia.arg_set_id = i.arg_set_id and ia.key = 'args.hp_otel.collective.match.id'
where o.category like 'hp_otel.%' or i.category like 'hp_otel.%'
"""


@pytest.fixture(scope="module")
def demo_spans(tmp_path_factory) -> list[Path]:
    """Both ranks' spans files of a real 2-rank gloo demo (one step)."""
    out = tmp_path_factory.mktemp("demo")
    child = servers.hp_otel_cli("demo", "--out", str(out))
    _, stderr = child.communicate(timeout=240)
    assert child.returncode == 0, stderr[-3000:]
    return [out / "spans_rank0.json", out / "spans_rank1.json"]


@pytest.fixture(scope="module")
def profiled_step(fake_world, tmp_path_factory) -> tuple[Path, Path]:
    """(spans file, torch.profiler chrome trace) of one traced step on the fake process group."""
    import torch

    from hp_otel import CommDebugMode
    from hp_otel.workloads.tp_mlp import build_tp_mlp, train_step

    folder = tmp_path_factory.mktemp("profiled")
    model, x = build_tp_mlp(fake_world), torch.randn(4, 16, requires_grad=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
        with CommDebugMode(module=model) as mode:
            train_step(model, x)
    profiler.export_chrome_trace(str(folder / "profiler.json"))
    write_spans(folder / "spans.json", mode.get_finished_spans())
    return folder / "spans.json", folder / "profiler.json"


@pytest.fixture(scope="module")
def ui(tmp_path_factory):
    folder = perfetto_ui_dir()
    server, url = serve(folder, tmp_path_factory.mktemp("perfetto_ui"))
    browser = start_browser()
    try:
        yield PerfettoUI(browser, url)
    finally:
        browser.close()
        server.close()


def _shifted(span: ReadableSpan, rank: int, shift_ns: int) -> ReadableSpan:
    """`span` as rank `rank` recorded it, `shift_ns` later."""
    return ReadableSpan(
        name=span.name,
        context=span.context,
        parent=span.parent,
        resource=Resource({"hp_otel.rank": rank}),
        attributes=dict(span.attributes or {}),
        start_time=(span.start_time or 0) + shift_ns,
        end_time=(span.end_time or 0) + shift_ns,
    )


def _chrome_trace(tmp_path: Path, name: str, files: list[Path], *extra: str) -> tuple[Path, dict]:
    out = tmp_path / name
    assert main(["chrome-trace", *map(str, files), *extra, "-o", str(out)]) == 0
    return out, json.loads(out.read_text())


def _expected_flows(files: list[Path]) -> dict[str, int]:
    """From the spans files, not our trace: {match id: ranks that ran it - 1} (a chain through the ranks)."""
    ranks_of: dict[str, set[int]] = defaultdict(set)
    for rank, path in enumerate(files):
        for span in read_spans(path):
            match_id = (span.attributes or {}).get(schema.COLLECTIVE_MATCH_ID)
            if match_id:
                ranks_of[str(match_id)].add(rank)
    return {match_id: len(ranks) - 1 for match_id, ranks in ranks_of.items()}


def _check_import(ui: PerfettoUI, trace: Path, document: dict, expected_flows: dict[str, int]) -> None:
    seconds = ui.load(trace)
    print(f"{trace.name}: loaded in {seconds:.1f} s")
    assert ui.error_stats() == {}
    names = ", ".join(f"'{name}'" for name in NAMED_ERRORS)
    named = {row["name"]: row["value"] for row in ui.query(f"select name, value from stats where name in ({names})")}
    assert named == dict.fromkeys(NAMED_ERRORS, 0)
    ours = [e for e in document["traceEvents"] if str(e.get("cat", "")).startswith("hp_otel.")]
    imported = ui.query("select count(*) as n from slice where category like 'hp_otel.%'")[0]["n"]
    assert imported == len(ours) > 0  # every call, none dropped
    flows = ui.query(FLOWS)
    assert all(f["category"] == f"hp_otel.{schema.KIND_COLLECTIVE}" for f in flows), flows
    per_match: dict[str, int] = defaultdict(int)
    for flow in flows:
        assert flow["out_match"] == flow["in_match"], flow  # both ends are the same collective ...
        assert flow["out_pid"] != flow["in_pid"], flow  # ... on two ranks
        assert flow["out_ts"] <= flow["in_ts"], flow  # from the rank that started it first
        per_match[flow["out_match"]] += 1
    assert dict(per_match) == {m: n for m, n in expected_flows.items() if n}
    print(f"{trace.name}: {imported} hp_otel slices, {len(flows)} flows, {len(document['traceEvents'])} events")


def test_the_perfetto_ui_imports_our_traces_with_no_errors_and_draws_a_flow_per_collective_across_ranks(
    ui, demo_spans, profiled_step, tmp_path
) -> None:
    one, one_doc = _chrome_trace(tmp_path, "rank0.json", demo_spans[:1])
    _check_import(ui, one, one_doc, _expected_flows(demo_spans[:1]))  # one rank: nothing to join

    both, both_doc = _chrome_trace(tmp_path, "ranks.json", demo_spans)
    expected = _expected_flows(demo_spans)
    assert len(expected) == 2 and set(expected.values()) == {1}  # forward and backward all_reduce, on both ranks
    _check_import(ui, both, both_doc, expected)

    # three ranks (one recorded window, shifted per rank): the middle rank's event ends one flow and begins the next
    window = record_window(14).get_finished_spans()
    three = []
    for rank, shift_ns in enumerate((0, 700_000, 300_000)):
        three.append(tmp_path / f"spans_rank{rank}.json")
        write_spans(three[-1], [_shifted(span, rank, shift_ns) for span in window])
    expected = _expected_flows(three)
    assert len(expected) == 2 and set(expected.values()) == {2}
    chain, chain_doc = _chrome_trace(tmp_path, "three.json", three)
    _check_import(ui, chain, chain_doc, expected)

    spans, profiler = profiled_step
    merged, merged_doc = _chrome_trace(tmp_path, "merged.json", [spans], "--merge", str(profiler))
    assert len(merged_doc["traceEvents"]) > len(json.loads(profiler.read_text())["traceEvents"])
    _check_import(ui, merged, merged_doc, _expected_flows([spans]))

    # The control: the same import sees a broken trace. One call moved to overlap its neighbour partially.
    calls = [e for e in both_doc["traceEvents"] if e.get("ph") == "X" and e["tid"] == 1 and e["dur"] > 0]
    first = calls[0]
    both_doc["traceEvents"].append({**first, "name": "overlapping", "ts": first["ts"] + first["dur"] / 2})
    broken = tmp_path / "overlapping.json"
    broken.write_text(json.dumps(both_doc))
    ui.load(broken)
    assert ui.error_stats() == {"slice_drop_overlapping_complete_event": 1}
