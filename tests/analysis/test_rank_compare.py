"""Sequence numbers, the cross-rank link, per-rank files and `hp-otel ranks`, in one process.

Ranks are played one after the other in this process (the rank a file names comes from
RANK, as torchrun sets it); the real multi-process jobs are in test_rank_compare_gloo.py.
"""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from events import ALL_REDUCE

from hp_otel import CommDebugMode, step
from hp_otel.always_on.steps import step_ids
from hp_otel.analysis import compare_files, format_report
from hp_otel.cli import main as cli_main
from hp_otel.export import providers
from hp_otel.spans import schema
from hp_otel.spans.groups import GroupTable
from hp_otel.spans.infos import CollectiveInfo, ModuleInfo
from hp_otel.spans.otlp_json import read_trace_file

ALL_GATHER = CollectiveInfo(
    name="c10d._allgather_base_",
    op="all_gather",
    group_size=2,
    group="tp",
    group_ranks=(0, 1),
    input_shape=(4, 8),
    output_shape=(8, 8),
    dtype="torch.float32",
)
OTHER_GROUP = dataclasses.replace(ALL_REDUCE, group="dp", group_ranks=(0, 2))


BASE_NS = 1_700_000_000_000_000_000  # ranks are played one after the other: their clocks are made up


def _issue_and_complete(observer, info, late_ns: int = 0, start: int | None = None) -> None:  # type: ignore[no-untyped-def]
    start = (time.time_ns() if start is None else start) + late_ns
    ticket = observer.on_collective_issue(info, start)
    observer.on_collective(info, start, start + 1000, None, None, ticket)


def _play_rank(rank: int, program, path: Path, monkeypatch) -> CommDebugMode:  # type: ignore[no-untyped-def]
    """Run `program(observer)` as rank `rank` in a module `layers.<i>` per collective, write its file."""
    monkeypatch.setenv("RANK", str(rank))
    # each rank is a process of its own: its default provider's resource is made with its RANK
    monkeypatch.setattr(providers, "_default_tracer_provider", None)
    with CommDebugMode() as mode:
        program(mode.observer)
    mode.write_spans(path)
    mode.generate_json_dump(path.with_name(f"comm_rank{rank}.json"), noise_level=0)
    return mode


def _in_layers(*calls):  # type: ignore[no-untyped-def]
    """A program issuing each (info, late_ns) inside its own module layers.<i>."""

    def program(observer) -> None:  # type: ignore[no-untyped-def]
        for i, (info, late_ns) in enumerate(calls):
            observer.on_module_enter(ModuleInfo(f"layers.{i}", f"layers.{i}", "Block"), "forward")
            _issue_and_complete(observer, info, late_ns, start=BASE_NS + i * 10_000_000)
            observer.on_module_exit(f"layers.{i}", "forward")

    return program


def test_seq_counts_per_group_within_the_window(monkeypatch) -> None:
    with CommDebugMode() as mode:
        for info in (ALL_REDUCE, ALL_REDUCE, OTHER_GROUP, ALL_REDUCE, OTHER_GROUP):
            _issue_and_complete(mode.observer, info)
        mode.observer.on_collective(ALL_REDUCE, 1, 2)  # a source that reports no issue: numbered on completion
    spans = sorted(mode.get_finished_spans(), key=lambda s: s.start_time)
    table = GroupTable.of(s.attributes for s in spans)  # each group described once, on its first span
    seqs = [(table.group_of(s.attributes).name, s.attributes[schema.COLLECTIVE_SEQ]) for s in spans]
    assert sorted(seqs) == sorted([("tp", 0), ("tp", 1), ("dp", 0), ("tp", 2), ("dp", 1), ("tp", 3)])
    with CommDebugMode() as again:  # a new window counts from 0
        _issue_and_complete(again.observer, ALL_REDUCE)
    (span,) = again.get_finished_spans()
    assert span.attributes[schema.COLLECTIVE_SEQ] == 0
    assert span.attributes[schema.COLLECTIVE_WINDOW] != spans[0].attributes[schema.COLLECTIVE_WINDOW]


def test_ranks_of_one_step_link_to_the_first_members_span_of_each_collective(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Two ranks of step 7: rank 1's span of a collective links to rank 0's span of it (the group's first
    member, whose span has the derived id), in the step's trace: a link that opens a span."""
    by_rank = {}
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        with step(7, run_id="link-run", rank=rank), CommDebugMode() as mode:
            _issue_and_complete(mode.observer, ALL_REDUCE)
            _issue_and_complete(mode.observer, ALL_REDUCE)
        by_rank[rank] = sorted(
            (s for s in mode.get_finished_spans() if s.name == "all_reduce"), key=lambda s: s.start_time
        )
    step_trace, _ = step_ids("link-run", 7)
    for seq in (0, 1):
        a, b = by_rank[0][seq], by_rank[1][seq]
        assert a.attributes[schema.COLLECTIVE_WINDOW] == b.attributes[schema.COLLECTIVE_WINDOW] == "step 7"
        assert a.attributes[schema.COLLECTIVE_MATCH_ID] == b.attributes[schema.COLLECTIVE_MATCH_ID]
        assert not a.links and a.context.span_id == int(a.attributes[schema.COLLECTIVE_MATCH_ID], 16)
        (link,) = b.links
        assert (link.context.trace_id, link.context.span_id) == (a.context.trace_id, a.context.span_id)
        assert a.context.trace_id == step_trace == b.context.trace_id
    assert by_rank[0][0].attributes[schema.COLLECTIVE_MATCH_ID] != by_rank[0][1].attributes[schema.COLLECTIVE_MATCH_ID]


def test_seq_matches_an_independent_count_of_the_collectives_per_group(fake_world) -> None:
    """Referee: a dispatch mode of the test's own numbers every functional collective by its group name."""
    import torch
    import torch.distributed as dist
    from torch.utils._python_dispatch import TorchDispatchMode

    class Referee(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.seen: list[tuple[str, int]] = []
            self._next: dict[str, int] = {}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            if str(func.overloadpacket).startswith("_c10d_functional.") and "wait" not in str(func):
                group = str(args[-1])
                n = self._next.get(group, 0)
                self._next[group] = n + 1
                self.seen.append((group, n))
            return func(*args, **(kwargs or {}))

    world = dist.group.WORLD.group_name
    pair = dist.new_group([0, 1]).group_name
    ops = torch.ops._c10d_functional
    t = torch.ones(4)
    referee = Referee()
    with CommDebugMode() as mode, referee:
        for group in (world, world, pair, world, pair):
            ops.wait_tensor(ops.all_reduce(t, "sum", group))
        ops.wait_tensor(ops.all_gather_into_tensor(t, 2, pair))
    spans = sorted(mode.get_finished_spans(), key=lambda s: s.start_time)
    table = GroupTable.of(s.attributes for s in spans)
    ours = [(table.group_of(s.attributes).name, s.attributes[schema.COLLECTIVE_SEQ]) for s in spans]
    assert ours == referee.seen
    assert [n for g, n in ours if g == pair] == [0, 1, 2] and [n for g, n in ours if g == world] == [0, 1, 2]


def _files(tmp_path: Path, monkeypatch, rank0, rank1) -> list[str]:  # type: ignore[no-untyped-def]
    paths = [tmp_path / "spans_rank0.json", tmp_path / "spans_rank1.json"]
    _play_rank(0, rank0, paths[0], monkeypatch)
    _play_rank(1, rank1, paths[1], monkeypatch)
    return [str(p) for p in paths]


def test_the_file_names_its_rank_and_the_ranks_agree(tmp_path, monkeypatch, capsys) -> None:
    same = _in_layers((ALL_REDUCE, 0), (ALL_GATHER, 0), (ALL_REDUCE, 0))
    late = _in_layers((ALL_REDUCE, 0), (ALL_GATHER, 50_000_000), (ALL_REDUCE, 0))  # issued 50 ms later
    files = _files(tmp_path, monkeypatch, same, late)
    _, resources = read_trace_file(files[1])
    assert resources[0][schema.RESOURCE_RANK] == 1
    assert cli_main(["ranks", *files]) == 0
    out = capsys.readouterr().out
    assert "group tp (ranks 0,1), window" in out and "agree (3 collectives reached by every rank)" in out
    report = compare_files(files)
    (group,) = report.groups
    assert [(k.seq, k.skew_ns, k.last_rank) for k in group.skews] == [
        (0, 0, 1),  # a tie: no skew
        (1, 50_000_000, 1),
        (2, 0, 1),
    ]
    assert group.skews[1].module == "layers.1" and group.skews[1].op == "all_gather"
    assert (report.stragglers[0].rank, report.stragglers[0].last, report.stragglers[0].max_skew_ns) == (
        1,
        1,
        50_000_000,
    )


def test_the_first_divergence_names_each_ranks_collective(tmp_path, monkeypatch, capsys) -> None:
    other_shape = dataclasses.replace(ALL_GATHER, input_shape=(2, 8), output_shape=(4, 8))
    files = _files(
        tmp_path,
        monkeypatch,
        _in_layers((ALL_REDUCE, 0), (ALL_GATHER, 0), (ALL_REDUCE, 0)),
        _in_layers((ALL_REDUCE, 0), (other_shape, 0), (ALL_REDUCE, 0)),
    )
    assert cli_main(["ranks", *files]) == 3
    out = capsys.readouterr().out.splitlines()
    at = out.index("  first divergence at seq #1:")
    assert out[at + 1 : at + 3] == [
        "    rank 0: all_gather input (4, 8) output (8, 8) torch.float32 in Module(layers.1) [forward]",
        "    rank 1: all_gather input (2, 8) output (4, 8) torch.float32 in Module(layers.1) [forward]",
    ]
    assert cli_main(["ranks", "--json", *files]) == 3
    report = json.loads(capsys.readouterr().out)
    assert report["agree"] is False
    assert [g["divergence"]["seq"] for g in report["groups"] if g["divergence"]] == [1]
    # the JSON dumps of the same windows say the same (the rank comes from their names)
    dumps = [str(tmp_path / f"comm_rank{r}.json") for r in (0, 1)]
    assert cli_main(["ranks", "--json", *dumps]) == 3
    from_dumps = json.loads(capsys.readouterr().out)
    assert from_dumps["groups"] == report["groups"]


def test_a_rank_that_stopped_early_is_the_hang_suspect(tmp_path, monkeypatch, capsys) -> None:
    def stuck_in_third(observer) -> None:  # type: ignore[no-untyped-def]
        _in_layers((ALL_REDUCE, 0), (ALL_REDUCE, 0))(observer)
        observer.on_module_enter(ModuleInfo("layers.2", "layers.2", "Block"), "forward")
        observer.on_collective_issue(ALL_REDUCE, time.time_ns())  # never returns

    files = _files(tmp_path, monkeypatch, stuck_in_third, _in_layers((ALL_REDUCE, 0), (ALL_REDUCE, 0)))
    assert cli_main(["ranks", *files]) == 3
    out = capsys.readouterr().out
    assert (
        "hang suspect: rank 1 never reached all_reduce #2 in Module(layers.2) (issued by rank 0; rank 0 waiting in it)"
        in out
    )
    assert "first divergence" not in out


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "does not exist"),
        ("not json", "is not JSON"),
        ('{"x": 1}', "no 'resourceSpans' key"),
        ('{"resourceSpans": []}', "names no rank"),
        ('{"records": []}', "a JSON dump names no rank"),
    ],
)
def test_bad_input_is_one_line_and_exit_status_2(tmp_path, capsys, content, message) -> None:
    path = tmp_path / "spans.json"
    if content is not None:
        path.write_text(content)
    assert cli_main(["ranks", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hp-otel ranks: ") and message in err and err.count("\n") == 1


def test_two_files_of_one_rank_are_bad_input(tmp_path, monkeypatch, capsys) -> None:
    program = _in_layers((ALL_REDUCE, 0))
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    _play_rank(0, program, a, monkeypatch)
    _play_rank(0, program, b, monkeypatch)
    assert cli_main(["ranks", str(a), str(b)]) == 2
    assert "are both rank 0; give one file per rank" in capsys.readouterr().err


@pytest.mark.multiprocess  # a subprocess (the fake group is process-wide), about 8 s here
def test_per_rank_programs_over_the_fake_process_group(tmp_path) -> None:
    """The real torch path (dispatch mode -> issue -> seq -> file) for divergent ranks, without hanging."""
    import subprocess
    import sys

    program = Path(__file__).resolve().parents[1] / "support" / "fake_rank_programs.py"
    cases = ("consistent", "divergent", "skipping")
    subprocess.run([sys.executable, str(program), str(tmp_path), *cases], check=True, timeout=120)
    reports = {case: compare_files([str(tmp_path / case / f"spans_rank{r}.json") for r in (0, 1)]) for case in cases}

    consistent = reports["consistent"]
    assert consistent.agree, format_report(consistent)
    assert [g.compared for g in consistent.groups] == [2]  # fc2's forward all_reduce, fc1's backward one

    (group,) = reports["divergent"].groups
    assert group.divergence is not None and group.divergence.seq == 0, format_report(reports["divergent"])
    calls = group.divergence.calls
    assert (calls[0].op, calls[0].input_shape, calls[1].input_shape) == ("all_gather", (4, 16), (3, 16))
    assert calls[0].module == calls[1].module == "fc2"

    (group,) = reports["skipping"].groups
    (missing,) = group.missing
    reference = missing.reference
    assert (missing.rank, missing.seq, reference.op, reference.module, reference.phase) == (
        1,
        1,
        "all_reduce",
        "fc1",
        "backward",
    )
    assert group.divergence is None
    assert "rank 1 never reached all_reduce #1 in Module(fc1) (issued by rank 0)" in format_report(reports["skipping"])


def test_a_malformed_collective_span_is_bad_input(tmp_path, monkeypatch, capsys) -> None:
    path = tmp_path / "spans_rank0.json"
    _play_rank(0, _in_layers((ALL_REDUCE, 0)), path, monkeypatch)
    path.write_text(
        path.read_text().replace(
            '"hp_otel.collective.seq", "value": {"intValue": "0"}',
            '"hp_otel.collective.seq", "value": {"stringValue": "x"}',
        )
    )
    assert 'stringValue": "x"' in path.read_text()
    assert cli_main(["ranks", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"hp-otel ranks: {path}: collective span 'all_reduce' is malformed") and err.count("\n") == 1


def test_send_and_recv_of_one_exchange_match(tmp_path, monkeypatch) -> None:
    """Point to point: rank 0 sends what rank 1 receives, at the same seq of the group: they agree."""
    send = dataclasses.replace(ALL_REDUCE, name="c10d.send", op="send", reduce_op="")
    recv = dataclasses.replace(send, name="c10d.recv_", op="recv")
    files = _files(
        tmp_path, monkeypatch, _in_layers((send, 0), (ALL_REDUCE, 0)), _in_layers((recv, 0), (ALL_REDUCE, 0))
    )
    report = compare_files(files)
    assert report.agree and [g.compared for g in report.groups] == [2]
    other = _files(tmp_path, monkeypatch, _in_layers((send, 0)), _in_layers((ALL_REDUCE, 0)))
    assert compare_files(other).groups[0].divergence.seq == 0


@pytest.mark.parametrize("big_seq", [10**7, 2**63 - 1])
def test_a_huge_seq_is_compared_in_bounded_time(tmp_path, monkeypatch, big_seq) -> None:
    """A file's seq may be any int64 (files others send): the comparison walks the seqs present,
    not every number up to the largest (which ran forever for 2**63 - 1)."""
    two = _in_layers((ALL_REDUCE, 0), (ALL_REDUCE, 0))
    files = _files(tmp_path, monkeypatch, two, two)
    # The default provider's resource keeps the rank of the first window in this process: name each file's own.
    for rank, path in enumerate(map(Path, files)):
        path.write_text(re.sub(r'("hp_otel.rank", "value": \{"intValue": )"\d+"', rf'\1"{rank}"', path.read_text()))
    rank0 = Path(files[0])
    second = '"hp_otel.collective.seq", "value": {"intValue": "1"}'
    assert second in rank0.read_text()
    rank0.write_text(
        rank0.read_text().replace(second, f'"hp_otel.collective.seq", "value": {{"intValue": "{big_seq}"}}')
    )
    command = [sys.executable, "-m", "hp_otel.cli", "ranks", *files]
    started = time.monotonic()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"hp-otel ranks with seq {big_seq} ran past 60 s")
    assert time.monotonic() - started < 60
    assert done.returncode == 3, done.stderr
    assert "rank 0 never reached all_reduce #1 in Module(layers.1) (issued by rank 1)" in done.stdout
    assert f"rank 1 never reached all_reduce #{big_seq} in Module(layers.1) (issued by rank 0)" in done.stdout
    (group,) = compare_files(files).groups
    assert group.compared == 1 and [m.seq for m in group.missing] == [1, big_seq]
