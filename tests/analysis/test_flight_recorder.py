"""`hp-otel ranks` on torch's Flight Recorder dumps: real gloo runs (torch 2.13 records gloo's
collectives on CPU), against hp_otel's own spans of the same run and a referee of what each rank
issued; and the reader's rules on made-up dumps (naming, rings, p2p, files that are no dump)."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import fr_workers
import pytest
import torch
import torch.multiprocessing as mp

import hp_otel
from hp_otel.analysis import RankInputError, compare_files, read_any_rank_file
from hp_otel.analysis.flight_recorder import P2P_WINDOW, WINDOW, read_flight_recorder_file
from hp_otel.spans import schema
from hp_otel.spans.otlp_json import read_spans
from hp_otel.workloads.process_groups import free_port

WORLD_SIZE = 2


def _run(tmp_path: Path, scenario: str) -> None:
    mp.spawn(fr_workers.fr_worker, args=(WORLD_SIZE, free_port(), str(tmp_path), scenario), nprocs=WORLD_SIZE)


def _cli(*files: Path, json_out: bool = False) -> subprocess.CompletedProcess[str]:
    extra = ["--json", "--per-collective"] if json_out else []  # per collective: each group's skews
    return subprocess.run(
        [sys.executable, "-m", "hp_otel.cli", "ranks", *map(str, files), *extra],
        capture_output=True,
        text=True,
        timeout=60,
    )


def _fr(tmp_path: Path) -> list[Path]:
    return [tmp_path / f"{fr_workers.FR_PREFIX}{r}" for r in range(WORLD_SIZE)]


def _fr_json(tmp_path: Path) -> list[Path]:
    return [tmp_path / f"fr_json_rank{r}.json" for r in range(WORLD_SIZE)]


def _spans(tmp_path: Path) -> list[Path]:
    return [tmp_path / f"spans_rank{r}.json" for r in range(WORLD_SIZE)]


def _referee(tmp_path: Path, rank: int) -> list[list[str]]:
    return json.loads((tmp_path / f"referee_rank{rank}.json").read_text())


@pytest.mark.multiprocess
def test_agreeing_ranks_match_hp_otels_spans_seq_for_seq_and_frame_for_frame(tmp_path: Path) -> None:
    _run(tmp_path, "agree")
    for rank in range(WORLD_SIZE):
        referee = _referee(tmp_path, rank)
        collectives = [r for r in referee if r[0] not in ("send", "recv")]  # gloo's FR records no p2p (2.13)
        fr = read_any_rank_file(_fr(tmp_path)[rank])
        assert fr.rank == rank
        # FR counts from 1 since the group was made: the barrier before hp_otel's window is #1
        assert [(c.seq, c.op) for c in fr.calls] == [(1, "barrier")] + [
            (k + 2, op) for k, (op, _) in enumerate(collectives)
        ]
        assert {(c.window, c.group, tuple(c.group_ranks)) for c in fr.calls} == {(WINDOW, "0", (0, 1))}
        # done; the last may not be retired yet when the dump is taken (gloo retires after wait() returns)
        assert [c.in_flight for c in fr.calls[:-1]] == [False] * (len(fr.calls) - 1)
        assert [c.stack[0] for c in fr.calls[1:]] == [line for _, line in collectives]  # FR's frames, torch's dropped
        ours = {  # hp_otel's spans of the same collectives: its seq counts from 0 in the window, p2p included
            sp.attributes[schema.COLLECTIVE_SEQ]: sp.attributes
            for sp in read_spans(_spans(tmp_path)[rank])
            if sp.attributes.get(schema.CALL_KIND) == schema.KIND_COLLECTIVE
        }
        assert [(ours[k][schema.COLLECTIVE_OP], ours[k][schema.CALL_STACK][0]) for k in sorted(ours)] == [
            (op, line) for op, line in referee
        ]
        for call in fr.calls[1:]:  # the mapping the docs state: FR seq = hp_otel seq + collectives before + 1
            assert ours[call.seq - 2][schema.COLLECTIVE_OP] == call.op
            assert ours[call.seq - 2][schema.COLLECTIVE_DTYPE] == call.dtype == "torch.float32"
        json_calls = read_any_rank_file(_fr_json(tmp_path)[rank]).calls  # the JSON dump: the same, without frames
        assert [(c.seq, c.op, c.input_shape, c.stack) for c in json_calls] == [
            (c.seq, c.op, c.input_shape, ()) for c in fr.calls
        ]
    for files in (_fr(tmp_path), _fr_json(tmp_path), _spans(tmp_path)):
        result = _cli(*files)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "verdict: ranks agree" in result.stdout
    report = json.loads(_cli(*_fr(tmp_path), json_out=True).stdout)
    (group,) = report["groups"]
    skews = {k["seq"]: k for k in group["skews"]}
    assert skews[4]["op"] == "broadcast" and skews[4]["last_rank"] == 1
    assert skews[4]["skew_ns"] >= 0.95e9 * fr_workers.LATE_S
    assert report["stragglers"][0]["rank"] == 1


@pytest.mark.multiprocess
def test_a_desync_is_the_first_divergence_at_frs_seq_and_names_the_line(tmp_path: Path) -> None:
    _run(tmp_path, "desync")
    line = {r: _referee(tmp_path, r)[1] for r in range(WORLD_SIZE)}
    assert line[0][0] == line[1][0] == "all_gather"
    result = _cli(*_fr(tmp_path))
    print(result.stdout)
    assert result.returncode == 3, result.stdout + result.stderr
    assert "first divergence at seq #3:" in result.stdout  # barrier #1, all_reduce #2, all_gather #3
    # A rank's dump may catch its mismatched all_gather still in flight (the report then says so): which rank
    # is a race between the two workers, so either state is right; the shapes, module and line must be.
    for rank, shapes in ((0, "input (4, 8) output (2, 4, 8)"), (1, "input (8, 4) output (2, 8, 4)")):
        said = {
            f"rank {rank}: all_gather {shapes} torch.float32 in an unknown module{state} at {line[rank][1]}"
            for state in ("", " (in flight)")
        }
        assert any(s in result.stdout for s in said), (said, result.stdout)
    assert "first divergence at seq #1:" in _cli(*_spans(tmp_path)).stdout  # hp_otel's: #1 of the window


@pytest.mark.multiprocess
def test_an_all_reduce_one_rank_never_issued_is_the_hang_suspect(tmp_path: Path) -> None:
    _run(tmp_path, "hang")
    extra = _referee(tmp_path, 0)[-1]
    assert extra[0] == "all_reduce" and len(_referee(tmp_path, 0)) == len(_referee(tmp_path, 1)) + 1
    fr0 = read_any_rank_file(_fr(tmp_path)[0])
    # The unfinished all_reduce is the last entry, in flight. Whether torch's recorder has retired the
    # broadcast before it (#4) when the dump is taken is gloo's timing (seen both ways under load).
    assert [c.seq for c in fr0.calls][-2:] == [4, 5] and fr0.calls[-1].in_flight
    result = _cli(*_fr(tmp_path))
    print(result.stdout)
    assert result.returncode == 3, result.stdout + result.stderr
    assert (
        f"  hang suspect: rank 1 never reached all_reduce #5 in an unknown module (issued by rank 0 at {extra[1]}; "
        "rank 0 waiting in it)" in result.stdout.splitlines()
    )
    assert "first divergence" not in result.stdout


# --- the reader's rules, on made-up dumps ----------------------------------------------------------


def _entry(seq: int, name: str = "nccl:all_reduce", *, p2p: int = 0, retired: bool = True, **extra) -> dict:
    return {
        "collective_seq_id": 0 if p2p else seq,
        "p2p_seq_id": p2p,
        "op_id": seq,
        "process_group": ("0", "default_pg"),
        "profiling_name": name,
        "time_created_ns": 1000 * seq,
        "input_sizes": [[4, 8]],
        "input_dtypes": ["BFloat16"],
        "output_sizes": [[4, 8]],
        "output_dtypes": ["BFloat16"],
        "state": "completed" if retired else "started",
        "retired": retired,
        "is_p2p": bool(p2p),
        "time_discovered_completed_ns": 1000 * seq + 5 if retired else None,
        **extra,
    }


def _write(path: Path, entries: list[dict], ranks: str = "[0, 1]") -> Path:
    dump = {
        "version": "2.10",
        "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": ranks}},
        "entries": entries,
    }
    path.write_bytes(pickle.dumps(dump))
    return path


def test_names_ops_dtypes_and_in_flight_entries_are_read_as_hp_otel_calls(tmp_path: Path) -> None:
    frames = [
        {"name": "all_reduce", "filename": "/x/site-packages/torch/distributed/distributed_c10d.py", "line": 3245},
        {"name": "wrapper", "filename": "/x/site-packages/torch/distributed/c10d_logger.py", "line": 83},
        {"name": "train_step", "filename": "/home/me/train.py", "line": 42},
        {"name": "<module>", "filename": "/home/me/train.py", "line": 99},
    ]
    path = _write(
        tmp_path / "nccl_trace_rank_3",
        [
            _entry(1, "nccl:_allgather_base", frames=frames),
            _entry(2, "nccl:reduce_scatter_tensor_coalesced", retired=False),
        ],
        ranks="[2, 3]",
    )
    rank_file = read_flight_recorder_file(path)
    assert rank_file.rank == 3
    first, second = rank_file.calls
    assert (first.op, first.name, first.dtype, first.group_ranks) == (
        "all_gather",
        "nccl:_allgather_base",
        "torch.bfloat16",
        (2, 3),
    )
    assert first.stack == ("/home/me/train.py:42:train_step", "/home/me/train.py:99:<module>")
    assert (first.start_ns, first.end_ns, first.in_flight) == (1000, 1005, False)
    assert (second.op, second.in_flight, second.end_ns) == ("reduce_scatter", True, 2000)


def test_library_frames_are_told_by_where_the_packages_are_not_by_folder_names(tmp_path: Path) -> None:
    """A checkout folder named `hp_otel` (a plain clone) or `torch` holds the user's files; the
    libraries' frames are dropped wherever they were installed on the machine that wrote the dump."""
    here_torch = Path(torch.__file__).parent / "distributed" / "distributed_c10d.py"
    here_hp_otel = Path(hp_otel.__file__).parent / "mode" / "facade.py"
    library = [
        str(here_torch),
        str(here_hp_otel),
        "/home/u/hp_otel/.venv/lib/python3.11/site-packages/torch/distributed/c10d_logger.py",
        "/usr/lib/python3/dist-packages/typing_extensions.py",
        "/home/u/hp_otel/hp_otel/sources/pytorch/collectives.py",  # an editable install elsewhere
        "/src/pytorch/torch/distributed/distributed_c10d.py",  # a source checkout of torch
        "<frozen runpy>",
    ]
    users = [
        "/home/u/hp_otel/train.py",
        "/home/u/hp_otel/tests/support/fr_workers.py",
        "/home/u/torch/train.py",
        "/home/u/hp_otel/hp_otel/my_step.py",  # not a file of the package
    ]
    frames = [{"name": "f", "filename": name, "line": k} for k, name in enumerate(library + users)]
    rank_file = read_flight_recorder_file(_write(tmp_path / "fr_0", [_entry(1, frames=frames)]))
    assert rank_file.calls[0].stack == tuple(f"{name}:{k + len(library)}:f" for k, name in enumerate(users))


def test_point_to_point_entries_are_compared_on_pairs_only(tmp_path: Path) -> None:
    pair = read_flight_recorder_file(_write(tmp_path / "fr_0", [_entry(1), _entry(2, "nccl:send", p2p=1)]))
    assert [(c.window, c.seq, c.op) for c in pair.calls] == [(WINDOW, 1, "all_reduce"), (P2P_WINDOW, 1, "send")]
    wide = read_flight_recorder_file(_write(tmp_path / "fr_1", [_entry(2, "nccl:send", p2p=1)], ranks="[0, 1, 2]"))
    assert wide.calls == [] and wide.unsequenced == 1


def test_rings_that_dropped_different_old_entries_are_compared_from_the_newest_first_seq(tmp_path: Path) -> None:
    busy = _write(tmp_path / "fr_0", [_entry(k) for k in range(5, 10)])  # its ring dropped 1..4
    calm = _write(tmp_path / "fr_1", [_entry(k) for k in range(1, 9)])  # it never issued 9
    report = compare_files([busy, calm])
    (group,) = report.groups
    assert group.compared == 4  # seqs 5..8
    assert [(m.rank, m.seq) for m in group.missing] == [(1, 9)]  # not the 1..4 the busy ring dropped
    assert any("4 older Flight Recorder entries not compared" in note for note in report.notes)


def test_files_that_are_no_dump_are_refused_by_name_and_classes_are_never_loaded(tmp_path: Path) -> None:
    evil = tmp_path / "fr_0"
    evil.write_bytes(pickle.dumps({"entries": [], "pg_config": {}, "x": Path("/")}))  # names a class
    with pytest.raises(RankInputError, match="names a class"):
        read_any_rank_file(evil)
    other = tmp_path / "fr_1"
    other.write_bytes(pickle.dumps([1, 2]))
    with pytest.raises(RankInputError, match="without Flight Recorder's 'entries'"):
        read_any_rank_file(other)
    unnamed = _write(tmp_path / "dump", [_entry(1)])
    with pytest.raises(RankInputError, match="names its rank in the file name"):
        read_any_rank_file(unnamed)
    broken = _write(tmp_path / "fr_2", [{"profiling_name": "nccl:all_reduce"}])
    with pytest.raises(RankInputError, match="a Flight Recorder entry hp_otel cannot read"):
        read_any_rank_file(broken)
