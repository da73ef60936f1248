"""`hp-otel chrome-trace --per-rank`: a Kineto-style file per rank that Holistic Trace Analysis reads.

Two real gloo ranks issue an all_reduce, an all_gather and an uneven all_to_all on a group made as
DeviceMesh makes a mesh dimension's (tests/support/kineto_workers.py), under torch.profiler and
CommDebugMode at once. Referees: the program (what each rank issued, its sizes and split sizes) and
torch.profiler's own trace of the same calls (its `c10d::` ops, on the same clock).
"""

from __future__ import annotations

import json
from pathlib import Path

import kineto_workers as kw
import pytest
import torch.multiprocessing as mp

from hp_otel.cli import main
from hp_otel.workloads.process_groups import free_port

pytestmark = pytest.mark.multiprocess  # two gloo processes

WORLD_SIZE = 2
KINETO_NAMES = ["allreduce", "all_gather", "all_to_allv"]  # torch's names for what the program issues


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("kineto")
    mp.spawn(kw.kineto_worker, args=(WORLD_SIZE, free_port(), str(out)), nprocs=WORLD_SIZE)
    spans = [str(out / f"spans_rank{r}.json") for r in range(WORLD_SIZE)]
    assert main(["chrome-trace", *spans, "--per-rank", "-o", str(out / "trace")]) == 0
    merges = [a for r in range(WORLD_SIZE) for a in ("--merge", str(out / f"profiler_rank{r}.json"))]
    assert main(["chrome-trace", *spans, "--per-rank", *merges, "-o", str(out / "merged")]) == 0
    return out


def _doc(path: Path) -> dict:  # type: ignore[type-arg]
    return json.loads(path.read_text())


def _ours(doc: dict) -> list[dict]:  # type: ignore[type-arg]
    return sorted((e for e in doc["traceEvents"] if e.get("cat") == "hp_otel.collective"), key=lambda e: e["ts"])


def _expected_args(rank: int) -> list[dict]:  # type: ignore[type-arg]
    common = {
        "Group size": 2,
        "dtype": "Float",
        "Process Group Description": "mesh_tp",
        "Process Group Ranks": "[0, 1]",
    }
    rows_in, rows_out = sum(kw.SPLITS_IN[rank]), sum(kw.SPLITS_OUT[rank])
    sizes = [(kw.N, kw.N, "[]", "[]"), (kw.N, WORLD_SIZE * kw.N, "[]", "[]")]
    sizes.append((2 * rows_in, 2 * rows_out, str(kw.SPLITS_IN[rank]), str(kw.SPLITS_OUT[rank])))
    return [
        {"Collective name": name, "In msg nelems": i, "Out msg nelems": o, "In split size": si, "Out split size": so}
        | common
        for name, (i, o, si, so) in zip(KINETO_NAMES, sizes, strict=True)
    ]


def test_one_file_per_rank_with_distributed_info_and_kinetos_collective_args(run: Path) -> None:
    assert sorted(p.name for p in (run / "trace").iterdir()) == ["rank0.json", "rank1.json"]
    for rank in range(WORLD_SIZE):
        doc = _doc(run / "trace" / f"rank{rank}.json")
        info = doc["distributedInfo"]
        assert (info["rank"], info["world_size"], info["backend"]) == (rank, WORLD_SIZE, "gloo")
        (group,) = info["pg_config"]
        assert (group["pg_desc"], group["pg_size"], group["ranks"]) == ("mesh_tp", 2, [0, 1])
        events = _ours(doc)
        assert [{k: e["args"][k] for k in _expected_args(rank)[0]} for e in events] == _expected_args(rank)
        assert {e["args"]["Process Group Name"] for e in events} == {group["pg_name"]}


def test_hta_reads_each_ranks_collectives(run: Path) -> None:
    from hta.configs.parser_config import ParserConfig
    from hta.trace_analysis import TraceAnalysis

    default = ParserConfig.get_default_cfg()
    ParserConfig.set_default_cfg(ParserConfig.enable_communication_args(default.clone()))
    try:
        analysis = TraceAnalysis(trace_dir=str(run / "trace"))
    finally:
        ParserConfig.set_default_cfg(default)
    assert sorted(analysis.t.traces) == list(range(WORLD_SIZE))
    symbols = analysis.t.symbol_table.get_sym_table()
    for rank in range(WORLD_SIZE):
        frame = analysis.t.get_trace(rank)
        comms = frame[frame["collective_name"].astype(str) != ""].sort_values("ts")
        columns = ["collective_name", "in_msg_nelems", "out_msg_nelems", "group_size", "msg_dtype"]
        rows = [tuple(row) for row in comms[columns].itertuples(index=False)]
        print(f"HTA rank {rank}: {rows} splits {list(comms['in_split_size'])} -> {list(comms['out_split_size'])}")
        expected = _expected_args(rank)
        assert rows == [
            (a["Collective name"], a["In msg nelems"], a["Out msg nelems"], a["Group size"], a["dtype"])
            for a in expected
        ]
        assert list(comms["in_split_size"])[-1] == str(kw.SPLITS_IN[rank])
        assert [symbols[i] for i in comms["name"]] == [op for _, op in kw.CALLS]
        # as many as torch.profiler saw the process group run on that rank
        profiler = _doc(run / f"profiler_rank{rank}.json")
        assert len(comms) == sum(1 for e in profiler["traceEvents"] if e.get("name", "").startswith("c10d::"))


def test_merged_collectives_line_up_with_the_profilers_own(run: Path) -> None:
    """Each hp_otel collective overlaps, on the merged file's one clock, the profiler's c10d op of that call."""
    for rank in range(WORLD_SIZE):
        doc = _doc(run / "merged" / f"rank{rank}.json")
        assert doc["distributedInfo"]["rank"] == rank  # the profiler's own, kept
        theirs = sorted(
            (e for e in doc["traceEvents"] if e.get("name", "").startswith("c10d::")), key=lambda e: e["ts"]
        )
        ours = _ours(doc)
        assert [e["name"] for e in theirs] == [c10d for c10d, _ in kw.CALLS]
        assert [e["name"] for e in ours] == [op for _, op in kw.CALLS]
        for mine, profiled in zip(ours, theirs, strict=True):
            assert mine["ts"] < profiled["ts"] + profiled["dur"] and profiled["ts"] < mine["ts"] + mine["dur"], (
                mine,
                profiled,
            )


def test_per_rank_merge_refuses_a_trace_of_no_rank_or_of_a_rank_twice(run: Path, capsys) -> None:
    spans = [str(run / f"spans_rank{r}.json") for r in range(WORLD_SIZE)]
    twice = ["--merge", str(run / "profiler_rank0.json")] * 2
    assert main(["chrome-trace", *spans, "--per-rank", *twice, "-o", str(run / "bad")]) == 2
    assert "rank 0, given twice" in capsys.readouterr().err
    assert main(["chrome-trace", *spans, *twice, "-o", str(run / "bad.json")]) == 2
    assert "--merge: one torch.profiler trace, got 2" in capsys.readouterr().err
