"""`hp-otel render` on files written to hurt it: deep nesting, deep or cyclic parent
chains, duplicate span ids, wrong attribute types, files too large for memory.

Each gets one clear line (exit 2) or a table whose every span is accounted for, with a
`!` line saying what was odd; never a traceback, never a table that silently shows
fewer calls than the counts.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from events import design_mlp_forward

from hp_otel import CommDebugMode
from hp_otel.cli import main
from hp_otel.spans.otlp_json import read_spans, write_spans

pytestmark = pytest.mark.torch_free  # needs no torch: not rerun on torch 2.14.1 (tests/support/markers.py)


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> dict:
    with CommDebugMode() as mode:
        design_mlp_forward(mode.observer)
    path = tmp_path_factory.mktemp("spans") / "good.json"
    write_spans(path, mode.get_finished_spans())
    return json.loads(path.read_text())


def _collective(good: dict) -> dict:
    spans = good["resourceSpans"][0]["scopeSpans"][0]["spans"]
    span = next(s for s in spans if any(a["value"].get("stringValue") == "collective" for a in s["attributes"]))
    span = copy.deepcopy(span)
    span.pop("parentSpanId", None)
    return span


def _file(tmp_path: Path, good: dict, spans: list[dict], name: str = "spans.json") -> Path:
    payload = copy.deepcopy(good)
    payload["resourceSpans"][0]["scopeSpans"][0]["spans"] = spans
    path = tmp_path / name
    path.write_text(json.dumps(payload))
    return path


def _render(capsys: pytest.CaptureFixture[str], path: Path, *args: str) -> tuple[int, str, str]:
    code = main(["render", str(path), *args])
    out, err = capsys.readouterr()
    return code, out, err


def _table_collectives(out: str) -> int:
    return sum(1 for line in out.splitlines() if line.lstrip().startswith("Collective "))


def test_deeply_nested_arrays_get_one_line(tmp_path: Path, good: dict, capsys) -> None:
    text = json.dumps(good)
    path = tmp_path / "nested.json"
    path.write_text(text[:-1] + ', "x": ' + "[" * 100_000 + "]" * 100_000 + "}")
    code, out, err = _render(capsys, path)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "nests values deeper than can be read" in err


def test_a_2000_deep_parent_chain_renders_every_span(tmp_path: Path, good: dict, capsys) -> None:
    chain = []
    for i in range(2000):
        span = _collective(good)
        span["spanId"] = f"{i + 1:016x}"
        if i:
            span["parentSpanId"] = f"{i:016x}"
        chain.append(span)
    code, out, err = _render(capsys, _file(tmp_path, good, chain))
    assert code == 0 and err == ""
    assert _table_collectives(out) == 2000
    table = [line for line in out.splitlines() if line.lstrip().startswith("Collective ")]
    assert table[-1].startswith(" " * 2 * 1999 + "Collective")  # the deepest, under the table's footer lines


def test_a_parent_cycle_is_cut_and_said(tmp_path: Path, good: dict, capsys) -> None:
    a, b, c = _collective(good), _collective(good), _collective(good)
    a["spanId"], a["parentSpanId"] = "a" * 16, "b" * 16
    b["spanId"], b["parentSpanId"] = "b" * 16, "a" * 16
    c["spanId"], c["parentSpanId"] = "c" * 16, "b" * 16  # hangs below the cycle
    code, out, _ = _render(capsys, _file(tmp_path, good, [a, b, c]))
    assert code == 0 and "'differentiable_all_reduce': 3" in out
    assert _table_collectives(out) == 3
    assert "! 1 parent cycle(s)" in out


def test_duplicate_span_ids_keep_every_span_and_say_so(tmp_path: Path, good: dict, capsys) -> None:
    root, twin, child = _collective(good), _collective(good), _collective(good)
    root["spanId"] = twin["spanId"] = "d" * 16
    twin["parentSpanId"] = "e" * 16
    child["spanId"], child["parentSpanId"] = "f" * 16, "d" * 16
    code, out, _ = _render(capsys, _file(tmp_path, good, [root, twin, child]))
    assert code == 0 and "'differentiable_all_reduce': 3" in out
    assert _table_collectives(out) == 3
    assert "! 1 span(s) reuse another span's id" in out


def test_a_wrong_attribute_type_gets_one_line_naming_it(tmp_path: Path, good: dict, capsys) -> None:
    span = _collective(good)
    for attribute in span["attributes"]:
        if attribute["key"] == "hp_otel.collective.group.size":
            attribute["value"] = {"arrayValue": {"values": [{"stringValue": "x"}]}}
    code, out, err = _render(capsys, _file(tmp_path, good, [span]))
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "'hp_otel.collective.group.size' = ('x',) has the wrong type" in err


def test_a_span_id_that_is_not_hex_gets_one_line(tmp_path: Path, good: dict, capsys) -> None:
    span = _collective(good)
    span["spanId"] = "not hex at all!!"
    code, _, err = _render(capsys, _file(tmp_path, good, [span]))
    assert code == 2 and "is not hex" in err and err.count("\n") == 1


def test_a_file_over_the_size_limit_is_refused_with_the_numbers(tmp_path: Path, good: dict, capsys) -> None:
    path = _file(tmp_path, good, [_collective(good)] * 50)
    size = path.stat().st_size
    code, _, err = _render(capsys, path, "--max-bytes", "1000")
    assert code == 2 and f"is {size:,} bytes, over the limit of 1,000 bytes" in err
    assert read_spans(path, max_bytes=size)  # at the limit it reads


def test_running_out_of_memory_is_reported_as_such(tmp_path: Path, good: dict) -> None:
    spans = []
    for i in range(6000):
        span = _collective(good)
        span["spanId"] = f"{i + 1:016x}"
        spans.append(span)
    path = _file(tmp_path, good, spans)  # ~6 MB: ~60 MB to read
    script = textwrap.dedent(
        f"""
        import resource
        from hp_otel.spans.otlp_json import SpanFileError, read_spans
        with open("/proc/self/statm") as f:
            used = int(f.read().split()[0]) * resource.getpagesize()
        resource.setrlimit(resource.RLIMIT_AS, (used + 30_000_000, resource.RLIM_INFINITY))
        try:
            read_spans({str(path)!r})
        except SpanFileError as exc:
            print(exc)
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert "needs more memory than is available to read" in result.stdout, result.stdout + result.stderr
    assert f"({path.stat().st_size:,} bytes)" in result.stdout
