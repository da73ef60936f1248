"""Issue 33 items 1-5: files written to hurt `render`, `ranks`, `diff`, `plot`, `chrome-trace` and the
snapshot assertion. Each gets exit 2 and one line naming the file and what is wrong, within bounded
time and memory (the child processes run under an address-space limit, so a reader that reads a
device forever or parses before it checks the size fails here instead of eating the machine)."""

from __future__ import annotations

import json
import os
import pickle
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from events import design_mlp_forward

from hp_otel import CommDebugMode
from hp_otel.cli import main
from hp_otel.common.input_files import MAX_PICKLE_CONTAINERS, checked_int
from hp_otel.spans import schema
from hp_otel.spans.otlp_json import write_spans
from hp_otel.testing import assert_comm_snapshot

CHILD_MEMORY = 1_500_000_000  # bytes of address space a child CLI may map (torch alone maps ~1 GB)


# The child's own peak is VmHWM (since its exec): Linux keeps ru_maxrss across exec, so the child
# started by fork + exec would report the test process's size at the fork (the suite's, with every
# library its earlier tests imported).
_CHILD = """
import os, resource, sys
from hp_otel.cli import main

def own_peak_kb():
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

try:
    code = main(sys.argv[1:])
finally:
    with open(os.environ["HP_OTEL_TEST_PEAK_FILE"], "w") as peak:
        peak.write(str(own_peak_kb()))
sys.exit(code)
"""


def _cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> tuple[int, str, str, float, float]:
    """`hp-otel ARGS` in a child under CHILD_MEMORY: exit code, stdout, stderr, seconds, its peak RSS (MB)."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (CHILD_MEMORY, CHILD_MEMORY))

    with tempfile.NamedTemporaryFile("r", suffix=".peak") as peak:
        started = time.monotonic()
        result = subprocess.run(
            [sys.executable, "-c", _CHILD, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            preexec_fn=limit,
            env={**os.environ, **(env or {}), "HP_OTEL_TEST_PEAK_FILE": peak.name},
        )
        seconds = time.monotonic() - started
        peak_kb = int(peak.read() or 0)
    return result.returncode, result.stdout, result.stderr, seconds, peak_kb / 1024


def _one_line(err: str, *fragments: str) -> None:
    assert err.count("\n") == 1 and "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in err, (fragment, err)


@pytest.fixture(scope="module")
def spans_payload(tmp_path_factory: pytest.TempPathFactory) -> dict:
    with CommDebugMode() as mode:
        design_mlp_forward(mode.observer)
    path = tmp_path_factory.mktemp("good") / "spans_rank0.json"
    write_spans(path, mode.get_finished_spans(), resource_defaults={schema.RESOURCE_RANK: 0})
    return json.loads(path.read_text())


def _collective_attributes(payload: dict) -> list[list[dict]]:
    return [
        span["attributes"]
        for rs in payload["resourceSpans"]
        for ss in rs["scopeSpans"]
        for span in ss["spans"]
        if any(
            a["key"] == schema.CALL_KIND and a["value"].get("stringValue") == schema.KIND_COLLECTIVE
            for a in span["attributes"]
        )
    ]


def _fr_entry(seq: int, **extra: object) -> dict:
    return {
        "collective_seq_id": seq,
        "p2p_seq_id": 0,
        "process_group": ("0", "default_pg"),
        "profiling_name": "nccl:all_reduce",
        "time_created_ns": 1000 * seq,
        "input_sizes": [[4, 8]],
        "input_dtypes": ["Float"],
        "output_sizes": [[4, 8]],
        "output_dtypes": ["Float"],
        "state": "completed",
        "retired": True,
        "is_p2p": False,
        "time_discovered_completed_ns": 1000 * seq + 5,
        **extra,
    }


def _fr_dump(entries: list[dict]) -> dict:
    return {
        "version": "2.10",
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
        "entries": entries,
    }


def _json_dump(**record: object) -> dict:
    node = {
        "type": "collective",
        "seq": 0,
        "start_ns": 1,
        "collective_type": "all_reduce",
        "op": "all_reduce",
        **record,
    }
    return {"records": [node]}


# --- 1. Infinity (and other non-integers) where an integer belongs --------------------------


def test_checked_int_takes_integers_and_refuses_the_rest_naming_the_field() -> None:
    assert [checked_int(v, "seq") for v in (3, 3.0, "3", -(2**63), 2**63 - 1)] == [3, 3, 3, -(2**63), 2**63 - 1]
    for bad in (float("inf"), float("-inf"), float("nan"), 1.5, True, None, "x", 2**63, 1e300, [1]):
        with pytest.raises(ValueError, match=r"^seq must be an integer"):
            checked_int(bad, "seq")


_INTEGER_CASES = [
    ("json dump start_ns", "start_ns"),
    ("json dump seq", "seq"),
    ("fr json seq", "collective_seq_id"),
    ("fr pickle size", "input_sizes"),
    ("fr pickle seq", "collective_seq_id"),
    ("spans seq double", schema.COLLECTIVE_SEQ),
    ("spans bytes double", schema.COLLECTIVE_BYTES),
]


@pytest.mark.parametrize(
    ("command", "case", "field"),
    [("ranks", *c) for c in _INTEGER_CASES]
    + [("diff", *c) for c in _INTEGER_CASES if not c[0].startswith("fr")],  # diff reads no Flight Recorder dump
)
def test_infinity_where_an_integer_belongs_is_exit_2_naming_file_and_field(
    tmp_path: Path, spans_payload: dict, capsys, case: str, field: str, command: str
) -> None:
    inf = float("inf")
    if case.startswith("json dump"):
        path = tmp_path / "comm_rank0.json"
        path.write_text(json.dumps(_json_dump(**{field: inf})))
    elif case == "fr json seq":
        path = tmp_path / "fr_rank0.json"
        path.write_text(json.dumps(_fr_dump([_fr_entry(1, collective_seq_id=inf)])))
    elif case.startswith("fr pickle"):
        entry = _fr_entry(1, input_sizes=[[inf, 8]]) if "size" in case else _fr_entry(1, collective_seq_id=inf)
        path = tmp_path / "nccl_trace_rank_0"
        path.write_bytes(pickle.dumps(_fr_dump([entry])))
    else:
        payload = json.loads(json.dumps(spans_payload))
        for attributes in _collective_attributes(payload):
            for attribute in attributes:
                if attribute["key"] == field:
                    attribute["value"] = {"doubleValue": "Infinity"}
        path = tmp_path / "spans_rank0.json"
        path.write_text(json.dumps(payload))
    code = main([command, str(path)] if command == "ranks" else [command, str(path), str(path)])
    err = capsys.readouterr().err
    assert code == 2
    _one_line(err, str(path), field)


def test_infinity_in_a_snapshot_is_exit_2_for_diff_and_an_assertion_for_the_helper(tmp_path: Path, capsys) -> None:
    snapshot = tmp_path / "step.json"
    row = {"module": "", "phase": "forward", "op": "all_reduce", "count": float("inf"), "bytes": 8}
    snapshot.write_text(
        json.dumps({"format": "hp_otel.comm_snapshot", "version": 1, "collectives": [row], "total": {}})
    )
    assert main(["diff", str(snapshot), str(snapshot)]) == 2
    _one_line(capsys.readouterr().err, str(snapshot), "count must be an integer")
    with CommDebugMode() as mode:
        design_mlp_forward(mode.observer)
    with pytest.raises(AssertionError, match=r"cannot be read .*count must be an integer"):
        assert_comm_snapshot(mode, snapshot, update=False)


# --- 2. Deep nesting --------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["ranks", "diff"])
def test_json_nested_200000_levels_is_one_line(tmp_path: Path, capsys, command: str) -> None:
    path = tmp_path / "spans_rank0.json"
    path.write_text('{"records": ' + "[" * 200_000 + "]" * 200_000 + "}")
    code = main([command, str(path)] if command == "ranks" else [command, str(path), str(path)])
    assert code == 2
    _one_line(capsys.readouterr().err, str(path), "nests values deeper than can be read")


def test_a_pickled_dump_whose_profiling_name_nests_100000_levels_is_one_line(tmp_path: Path, capsys) -> None:
    body = pickle.dumps(_fr_dump([_fr_entry(1, profiling_name="PLACEHOLDER")]), protocol=4)
    placeholder = b"\x8c\x0bPLACEHOLDER\x94"  # SHORT_BINUNICODE, MEMOIZE
    assert body.count(placeholder) == 1
    levels = 100_000  # EMPTY_LIST x N, then APPEND x N-1: each list inside the one below it
    nested = pickle.EMPTY_LIST * levels + pickle.APPEND * (levels - 1) + b"\x94"
    path = tmp_path / "nccl_trace_rank_0"
    path.write_bytes(body.replace(placeholder, nested))
    assert main(["ranks", str(path)]) == 2
    _one_line(capsys.readouterr().err, str(path), "nests more than 100 levels")


# --- 3. The size limit before any parse; 4. non-regular files --------------------------------


@pytest.mark.parametrize("command", ["ranks", "diff", "render", "plot"])
def test_a_file_over_the_limit_is_refused_before_it_is_parsed(tmp_path: Path, command: str) -> None:
    path = tmp_path / "spans_rank0.json"
    with path.open("w") as handle:  # 30 MB of valid JSON a parser would turn into ≈2 GB of objects
        handle.write('{"resourceSpans": [' + ",".join(["{}"] * 10_000_000) + "]}")
    args = {"diff": [str(path), str(path)], "plot": [str(path), "-o", str(tmp_path / "t.svg")]}.get(
        command, [str(path)]
    )
    code, out, err, _seconds, peak_mb = _cli(command, *args, env={"HP_OTEL_RENDER_MAX_BYTES": "10000000"})
    assert code == 2 and out == ""
    _one_line(err, str(path), "over the limit of 10,000,000 bytes")
    assert peak_mb < 600, f"{peak_mb:.0f} MB peak RSS refusing a {path.stat().st_size:,}-byte file"


@pytest.mark.parametrize("command", ["ranks", "diff", "render", "plot", "chrome-trace"])
def test_a_symlink_to_dev_zero_is_refused_at_once(tmp_path: Path, command: str) -> None:
    link = tmp_path / "spans_rank0.json"
    link.symlink_to("/dev/zero")
    args = {"diff": [str(link), str(link)], "plot": [str(link), "-o", str(tmp_path / "t.svg")]}.get(
        command, [str(link)]
    )
    code, out, err, seconds, _peak_mb = _cli(command, *args, timeout=120)
    assert code == 2 and out == ""
    _one_line(err, str(link), "not a regular file")
    assert seconds < 60


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path: Path, capsys) -> None:
    fifo = tmp_path / "spans_rank0.json"
    os.mkfifo(fifo)
    assert main(["ranks", str(fifo)]) == 2
    _one_line(capsys.readouterr().err, str(fifo), "not a regular file")


def test_chrome_trace_merge_reads_the_profiler_trace_bounded(tmp_path: Path, spans_payload: dict) -> None:
    spans = tmp_path / "spans_rank0.json"
    spans.write_text(json.dumps(spans_payload))
    profiler = tmp_path / "trace.json"
    profiler.symlink_to("/dev/zero")
    code, _, err, _, _ = _cli("chrome-trace", str(spans), "--merge", str(profiler), "-o", str(tmp_path / "o.json"))
    assert code == 2
    _one_line(err, str(profiler), "not a regular file")


# --- 5. Pickle memory bombs --------------------------------------------------------------------


def _bomb(path: Path, opcode: bytes, count: int) -> Path:
    """`{"entries": [X, X, ...], "pg_config": {}}` with `count` X built by one opcode each (protocol 4)."""
    body = pickle.dumps({"entries": [], "pg_config": {}}, protocol=4)
    # the entries list is the first EMPTY_LIST: its items go in with one APPENDS after a MARK
    at = body.index(b"]")  # EMPTY_LIST
    items = b"(" + opcode * count + b"e"  # MARK, the items, APPENDS
    path.write_bytes(body[: at + 1] + items + body[at + 1 :])
    return path


@pytest.mark.parametrize(
    ("opcode", "count", "reason"),
    [
        (pickle.EMPTY_SET, 5_000_000, "a set"),
        (pickle.EMPTY_LIST, MAX_PICKLE_CONTAINERS + 10, "more than 2,000,000 lists, dicts and tuples"),
    ],
    ids=["5 million empty sets", "2 million empty lists"],
)
def test_a_pickle_memory_bomb_is_refused_in_bounded_memory(
    tmp_path: Path, opcode: bytes, count: int, reason: str
) -> None:
    path = _bomb(tmp_path / "nccl_trace_rank_0", opcode, count)
    code, _out, err, _seconds, peak_mb = _cli("ranks", str(path), timeout=120)
    assert code == 2
    _one_line(err, str(path), reason)
    assert peak_mb < 600, f"{peak_mb:.0f} MB peak RSS for a {path.stat().st_size:,}-byte pickle"


def test_a_memo_reference_to_nothing_says_what_was_refused(tmp_path: Path, capsys) -> None:
    path = tmp_path / "nccl_trace_rank_0"
    body = pickle.dumps({"entries": [], "pg_config": {}}, protocol=4)
    at = body.index(b"]")
    path.write_bytes(body[: at + 1] + b"(h\x63e" + body[at + 1 :])  # MARK, BINGET 99, APPENDS
    assert main(["ranks", str(path)]) == 2
    _one_line(capsys.readouterr().err, str(path), "memo entry 99, which was never stored")
