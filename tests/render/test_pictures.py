"""`hp-otel plot` (SVG / HTML timeline) and `hp-otel chrome-trace` (with a torch.profiler merge)."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan

from benchmarks.scale import record_window
from hp_otel.cli import main
from hp_otel.render.chrome_trace import PID_BASE
from hp_otel.render.rank_spans import load_rank_spans
from hp_otel.render.timeline import COLLECTIVE_COLOURS, bars, matched_collectives
from hp_otel.spans import schema
from hp_otel.spans.call_tree import count_collectives
from hp_otel.spans.otlp_json import write_spans

SKEW_NS = 500_000  # rank 1 starts everything 500 µs after rank 0
SVG = "{http://www.w3.org/2000/svg}"


def _as_rank(spans, rank: int, shift_ns: int) -> list[ReadableSpan]:
    return [
        ReadableSpan(
            name=span.name,
            context=span.context,
            parent=span.parent,
            resource=Resource({"hp_otel.rank": rank}),
            attributes=dict(span.attributes),
            start_time=span.start_time + shift_ns,
            end_time=span.end_time + shift_ns,
        )
        for span in spans
    ]


@pytest.fixture
def rank_files(tmp_path):
    spans = record_window(14).get_finished_spans()  # two forwards of the design's MLP: 2 all_reduce
    files = []
    for rank in (0, 1):
        path = tmp_path / f"spans_rank{rank}.json"
        write_spans(path, _as_rank(spans, rank, rank * SKEW_NS))
        files.append(path)
    return files, spans


def test_the_svg_has_a_lane_per_rank_and_collectives_coloured_by_op_with_their_skew(rank_files, tmp_path) -> None:
    files, spans = rank_files
    out = tmp_path / "t.svg"
    assert main(["plot", *map(str, reversed(files)), "-o", str(out)]) == 0  # rank from the resource, not the order
    root = ET.parse(out).getroot()
    groups = root.iter(f"{SVG}g")
    lanes = [g.get("data-rank") for g in root.iter(f"{SVG}g") if g.get("class") == "lane"]
    assert lanes == ["0", "1"]
    bars = [g for g in groups if g.get("class") == "bar"]
    assert len(bars) == 2 * len(spans)
    collectives = [g for g in bars if g.get("data-kind") == "collective"]
    assert len(collectives) == 2 * count_collectives(spans)["_c10d_functional.all_reduce"]
    for bar in collectives:
        assert bar.find(f"{SVG}rect").get("fill") == COLLECTIVE_COLOURS["all_reduce"]
        assert "start skew over ranks 500.0 µs" in bar.find(f"{SVG}title").text

    # one time axis: a bar's x is proportional to its start, so rank 1's bars sit SKEW_NS further right
    def x_and_start(bar):
        return float(bar.find(f"{SVG}rect").get("x")), int(bar.get("data-start-ns"))

    (xa, sa), (xb, sb) = x_and_start(bars[0]), x_and_start(bars[-1])
    scale = (xb - xa) / (sb - sa)
    by_rank = {r: [x_and_start(b) for b in collectives if b.get("data-rank") == r] for r in ("0", "1")}
    for (x0, s0), (x1, s1) in zip(by_rank["0"], by_rank["1"], strict=True):
        assert s1 - s0 == SKEW_NS and x1 - x0 == pytest.approx(SKEW_NS * scale, abs=0.02)
    assert len([line for line in root.iter(f"{SVG}line") if line.get("class") == "skew"]) == 2


def test_the_html_page_is_self_contained_and_lists_the_skew(rank_files, tmp_path) -> None:
    files, _ = rank_files
    out = tmp_path / "t.html"
    assert main(["plot", *map(str, files), "-o", str(out)]) == 0
    page = out.read_text()
    assert page.startswith("<!doctype html>") and "<svg" in page
    assert not re.search(r"""(src|href)=["']?(https?:|//)""", page)  # nothing fetched: opens from disk
    assert re.search(r"<td>all_reduce #0</td><td>tp \[0,1\]</td><td>2</td><td>500.0</td>", page)


def test_bad_plot_and_chrome_trace_input_says_what_is_wrong(rank_files, tmp_path, capsys) -> None:
    files, _ = rank_files
    assert main(["plot", str(files[0]), "-o", str(tmp_path / "t.png")]) == 2
    assert "--out must end in .svg or .html" in capsys.readouterr().err
    assert main(["plot", str(files[0]), "--step", "3", "-o", str(tmp_path / "t.svg")]) == 2
    assert "no step spans" in capsys.readouterr().err
    assert main(["chrome-trace", str(tmp_path / "missing.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hp-otel chrome-trace: ") and "does not exist" in err
    bad = tmp_path / "notrace.json"
    bad.write_text("{}")
    assert main(["chrome-trace", str(files[0]), "--merge", str(bad), "-o", str(tmp_path / "m.json")]) == 2
    assert "no 'traceEvents'" in capsys.readouterr().err


def test_chrome_trace_has_an_event_per_call_with_its_times(rank_files, tmp_path) -> None:
    files, spans = rank_files
    out = tmp_path / "trace.json"
    assert main(["chrome-trace", "--format", "chrome", *map(str, files), "-o", str(out)]) == 0
    document = json.loads(out.read_text())
    base = document["baseTimeNanoseconds"]
    calls = [e for e in document["traceEvents"] if e["ph"] == "X"]
    assert len(calls) == 2 * len(spans)
    names = {e["args"]["name"] for e in document["traceEvents"] if e["name"] == "process_name"}
    assert names == {"hp_otel rank 0", "hp_otel rank 1"}
    first = min(spans, key=lambda sp: sp.start_time)
    event = next(e for e in calls if e["pid"] == 1_000_000 and e["name"] == first.name)
    assert event["ts"] == pytest.approx((first.start_time - base) / 1000)
    assert event["dur"] == pytest.approx((first.end_time - first.start_time) / 1000)


@pytest.mark.parametrize("ranks, late", [(2, 1), (2, 0), (3, 0)])
def test_chrome_trace_joins_the_collectives_the_timeline_joins_from_the_rank_that_started_first(
    tmp_path, ranks, late
) -> None:
    """A flow per pair of ranks in start order: `late` starts everything SKEW_NS after the others."""
    spans = record_window(14).get_finished_spans()
    files = []
    for rank in range(ranks):
        files.append(tmp_path / f"spans_rank{rank}.json")
        write_spans(files[-1], _as_rank(spans, rank, SKEW_NS * (rank == late) + 1000 * rank))
    out = tmp_path / "trace.json"
    assert main(["chrome-trace", *map(str, files), "-o", str(out)]) == 0
    chains: dict[str, list[dict]] = {}
    for event in json.loads(out.read_text())["traceEvents"]:
        if "bind_id" in event:
            assert event["cat"] == "hp_otel.collective"
            chains.setdefault(event["bind_id"], []).append(event)
    joined = matched_collectives(bars(load_rank_spans(files)))  # what the timeline's dashed lines join
    assert len(chains) == len(joined) == count_collectives(spans)["_c10d_functional.all_reduce"] == 2
    assert {str(c[0]["args"][schema.COLLECTIVE_MATCH_ID]) for c in chains.values()} == {key[2] for key in joined}
    for chain in chains.values():
        assert len({str(e["args"][schema.COLLECTIVE_MATCH_ID]) for e in chain}) == 1
        order = sorted(chain, key=lambda e: e["ts"])
        assert [e["pid"] - PID_BASE for e in order] == sorted(range(ranks), key=lambda r: (r == late, r))
        assert [(e.get("flow_in", False), e.get("flow_out", False)) for e in order] == (
            [(False, True)] + [(True, True)] * (ranks - 2) + [(True, False)]
        )


def test_chrome_trace_of_one_rank_has_no_flows(rank_files, tmp_path) -> None:
    files, _ = rank_files
    out = tmp_path / "trace.json"
    assert main(["chrome-trace", str(files[0]), "-o", str(out)]) == 0
    assert not [e for e in json.loads(out.read_text())["traceEvents"] if "bind_id" in e]


def test_export_is_the_deprecated_name_of_chrome_trace(rank_files, tmp_path, capsys) -> None:
    files, _ = rank_files
    old, new = tmp_path / "old.json", tmp_path / "new.json"
    assert main(["chrome-trace", *map(str, files), "-o", str(new)]) == 0
    assert capsys.readouterr().err == ""
    assert main(["export", *map(str, files), "-o", str(old)]) == 0
    assert capsys.readouterr().err == "hp-otel: `export` is deprecated, use `hp-otel chrome-trace`\n"
    assert json.loads(old.read_text()) == json.loads(new.read_text())


def test_merged_with_torch_profiler_the_collectives_line_up_with_its_ops(tp_mlp, tmp_path) -> None:
    """The referee is torch.profiler: each hp_otel collective lies inside one of its c10d op events."""
    import torch

    from hp_otel import CommDebugMode
    from hp_otel.workloads.tp_mlp import train_step

    model, x = tp_mlp
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
        with CommDebugMode(module=model) as mode:
            train_step(model, x)
    profiler.export_chrome_trace(str(tmp_path / "profiler.json"))
    write_spans(tmp_path / "spans.json", mode.get_finished_spans())
    out = tmp_path / "merged.json"
    merge = ["--merge", str(tmp_path / "profiler.json")]
    assert main(["chrome-trace", str(tmp_path / "spans.json"), *merge, "-o", str(out)]) == 0
    merged = json.loads(out.read_text())
    c10d = [e for e in merged["traceEvents"] if e.get("name") == "_c10d_functional::all_reduce" and e["ph"] == "X"]

    def within(inner: dict, outer: dict) -> bool:
        return outer["ts"] <= inner["ts"] and inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"] + 1

    # the profiler records each call at two dispatch levels, one inside the other: count the outer ones
    theirs = [e for e in c10d if not any(o is not e and within(e, o) for o in c10d)]
    ours = [e for e in merged["traceEvents"] if e.get("cat") == "hp_otel.collective"]
    assert len(ours) == len(theirs) == 2

    def issued_in(inner: dict, outer: dict) -> bool:
        """Starts inside the op's event and ends no earlier: a span covers issue -> completion
        (its wait_tensor), the profiler's op event only the launch."""
        starts_inside = outer["ts"] <= inner["ts"] <= outer["ts"] + outer["dur"]
        return starts_inside and inner["ts"] + inner["dur"] + 1 >= outer["ts"] + outer["dur"]

    for event in ours:
        assert len([t for t in theirs if issued_in(event, t)]) == 1, (event, theirs)


def test_otlp_json_files_write_enums_as_integers(rank_files) -> None:
    """OTLP/JSON: "enum fields MUST be encoded as integer values" (span kind, status code)."""
    files, _ = rank_files
    payload = json.loads(files[0].read_text())
    spans = [sp for rs in payload["resourceSpans"] for ss in rs["scopeSpans"] for sp in ss["spans"]]
    assert spans and all(isinstance(sp["kind"], int) for sp in spans)
    assert "SPAN_KIND" not in files[0].read_text()


def _out_cases(tmp_path):
    regular = tmp_path / "regular.txt"
    regular.write_text("x")
    folder = tmp_path / "folder.svg"
    folder.mkdir()
    return {
        "a folder": (folder, "is a directory"),
        "under a regular file": (regular / "t.svg", "cannot make the folder"),
        "/proc/version": (None, "/proc/version"),
        "a full device (ENOSPC)": (None, "No space left on device"),
    }


@pytest.mark.parametrize("case", ["a folder", "under a regular file", "/proc/version", "a full device (ENOSPC)"])
@pytest.mark.parametrize("command", ["plot", "chrome-trace"])
def test_an_out_that_cannot_be_written_is_exit_2_naming_out(rank_files, tmp_path, capsys, command, case) -> None:
    """Issue 33 item 6: --out a folder, under a file, read-only /proc, a full device: one line, exit 2."""
    files, _ = rank_files
    out, reason = _out_cases(tmp_path)[case]
    if case == "/proc/version":
        out = "/proc/version"
    elif case.startswith("a full device"):
        out = tmp_path / "full.svg"
        out.symlink_to("/dev/full")  # writes there fail with ENOSPC, as on a full file system
    code = main([command, *map(str, files), "-o", str(out)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err and f"hp-otel {command}: --out" in err, err
    assert reason in err, err


def test_a_file_system_that_fills_while_writing_is_exit_2_naming_out(rank_files, tmp_path) -> None:
    """The regular-file path (an unnamed temporary file, then a rename): the write fails half-way
    (RLIMIT_FSIZE stands in for a full disk, EFBIG for ENOSPC) and leaves no file."""
    import resource
    import signal
    import subprocess
    import sys

    files, _ = rank_files
    out = tmp_path / "t.html"

    def small_files() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails instead of killing the process
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))

    result = subprocess.run(
        [sys.executable, "-m", "hp_otel.cli", "plot", *map(str, files), "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=small_files,
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and f"--out: cannot write {str(out)!r} (File too large)" in result.stderr
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == sorted(f.name for f in files)
