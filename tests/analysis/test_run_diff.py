"""`hp-otel diff` on pairs of real runs that differ by one plan change, over torch's fake process group.

Each expected difference is written here by hand from what the plans do (shapes and
bytes included), and its counts are checked again against the referee's per-module counts
(its own dispatch mode and autograd tagging, sharing no code with hp_otel): the innermost
module's count is the referee's count for it less its children's.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from referee import Referee
from torch import nn

from hp_otel import CommDebugMode
from hp_otel.analysis.run_diff import (
    BytesTolerance,
    diff_paths,
    diff_runs,
    format_diff,
    parse_bytes_tolerance,
    read_run,
    summarize_spans,
)
from hp_otel.cli import main as cli_main

F32 = 4  # bytes
# The referee names ops as torch does; the diff by normalised op.
NORMALISED = {
    "all_reduce": "all_reduce",
    "all_gather_into_tensor": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter",
    "_allgather_base_": "all_gather",
    "_reduce_scatter_base_": "reduce_scatter",
}

Expected = dict[tuple[str, str, str], tuple[tuple[int, int], tuple[int, int]]]


class MLP(nn.Module):
    def __init__(self, norm: bool = False) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(16) if norm else None
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.norm is not None:
            x = self.norm(x)
        return self.fc2(F.gelu(self.fc1(x)))


def _step(plan: dict[str, object], x: torch.Tensor, norm: bool = False) -> tuple[CommDebugMode, Counter]:
    """One forward+backward of the MLP under `plan`: hp_otel's mode, and the referee's innermost counts."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    torch.manual_seed(0)
    model = parallelize_module(MLP(norm), init_device_mesh("cpu", (2,)), plan)
    with CommDebugMode(module=model) as mode:
        model(x).sum().backward()
    with Referee(model) as referee:
        model(x).sum().backward()
    return mode, _innermost(referee.module_counts_dict(), model)


def _innermost(counts: dict[str, dict[str, dict[str, int]]], model: nn.Module) -> Counter:
    """(module, phase, op) -> count issued with that module innermost: the referee's count less its children's."""
    out: Counter = Counter()
    for fqn, module in model.named_modules():
        name = fqn or "(root)"
        children = [f"{fqn}.{c}" if fqn else c for c, _ in module.named_children()]
        for phase, ops in counts.get(name, {}).items():
            for op, n in ops.items():
                below = sum(counts.get(child, {}).get(phase, {}).get(op, 0) for child in children)
                if n - below:
                    out[(name, phase, NORMALISED[op.split(".")[-1]])] += n - below
    return out


def _changes(report: dict) -> Expected:
    return {
        (c["module"], c["phase"], c["op"]): (
            (c["before"]["count"], c["before"]["bytes"]),
            (c["after"]["count"], c["after"]["bytes"]),
        )
        for c in report["changes"]
    }


def _check_against_referee(expected: Expected, before: Counter, after: Counter) -> None:
    """The referee's innermost counts differ exactly where the expectation says, by as much."""
    keys = set(before) | set(after)
    referee = {k: (before[k], after[k]) for k in keys if before[k] != after[k]}
    assert referee == {k: (b[0], a[0]) for k, (b, a) in expected.items()}


def _cli(capsys, *argv: str) -> tuple[int, str, str]:  # type: ignore[no-untyped-def]
    code = cli_main(["diff", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def _copy_as_rank(source: str, rank: int, dest: Path) -> None:
    """A spans file whose resource names another rank (the runs here are one process playing rank 0)."""
    payload = json.loads(Path(source).read_text())
    for entry in payload["resourceSpans"]:
        for kv in entry["resource"]["attributes"]:
            if kv["key"] == "hp_otel.rank":
                kv["value"] = {"intValue": str(rank)}
    dest.parent.mkdir(exist_ok=True)
    dest.write_text(json.dumps(payload))


def _write(mode: CommDebugMode, path: Path) -> str:
    mode.write_spans(path)
    return str(path)


# --- ColwiseParallel vs RowwiseParallel on fc2 ----------------------------------------------

# fc1 is ColwiseParallel(use_local_output=False) in both: fc2 gets a DTensor sharded on its last dim.
COLWISE_VS_ROWWISE: Expected = {
    # Rowwise fc2: its Partial output [4, 16] is all-reduced in forward.
    ("fc2", "forward", "all_reduce"): ((1, 4 * 16 * F32), (0, 0)),
    # Colwise fc2 wants its input replicated: the local [4, 16] half of [4, 32] is all-gathered.
    ("fc2", "forward", "all_gather"): ((0, 0), (1, 4 * 16 * F32)),
    # ... and in backward the input gradient, Partial [4, 32], is reduce-scattered back to Shard(-1).
    # That redistribute's autograd node was made by the plan's input hook, around fc2's forward:
    # the referee, too, counts it for the root only.
    ("(root)", "backward", "reduce_scatter"): ((0, 0), (1, 4 * 32 * F32)),
    # DTensor's propagation gathers fc2's transposed output gradient ([16, 4], Shard(0): [8, 4] a rank).
    ("fc2", "backward", "all_gather"): ((0, 0), (1, 8 * 4 * F32)),
}
# Unchanged: fc1's backward all_reduce of the input gradient [4, 16].


def test_colwise_vs_rowwise_on_one_layer(fake_world, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    x = torch.randn(4, 16, requires_grad=True)
    fc1 = ColwiseParallel(use_local_output=False)
    a, referee_a = _step({"fc1": fc1, "fc2": RowwiseParallel()}, x)
    b, referee_b = _step({"fc1": fc1, "fc2": ColwiseParallel()}, x)
    _check_against_referee(COLWISE_VS_ROWWISE, referee_a, referee_b)
    files = _write(a, tmp_path / "rowwise.json"), _write(b, tmp_path / "colwise.json")

    code, out, err = _cli(capsys, *files, "--json")
    assert code == 3, err
    report = json.loads(out)
    assert _changes(report) == COLWISE_VS_ROWWISE
    assert report["a"]["total"] == {"count": 2, "bytes": 2 * 4 * 16 * F32}
    assert report["b"]["total"] == {"count": 4, "bytes": (4 * 16 + 4 * 32 + 8 * 4 + 4 * 16) * F32}

    code, out, _ = _cli(capsys, *files)
    print(out)
    assert code == 3
    lines = out.splitlines()
    for line in (
        "fc2 forward: -1 all_reduce (256 B)",
        "fc2 forward: +1 all_gather (256 B)",
        "fc2 backward: +1 all_gather (128 B)",
        "(root) backward: +1 reduce_scatter (512 B)",
        "total: 2 → 4 collectives (+2), 512 B → 1.1 KiB (+640 B)",
        "  all_reduce: 2 → 1, 512 B → 256 B",
    ):
        assert line in lines
    assert not any(line.startswith("fc1 ") for line in lines)  # fc1 communicates as before

    code, out, _ = _cli(capsys, files[0], files[0])
    assert code == 0 and "same communication" in out


# --- sequence parallel off vs on -------------------------------------------------------------

B, S, H = 2, 8, 16  # batch, sequence, hidden: an activation [2, 8, 16] is 1 KiB, a sequence half 512 B
SP_OFF_VS_ON: Expected = {
    # off: fc2's Partial output [2, 8, 16] all-reduced; on: reduce-scattered to sequence halves.
    ("fc2", "forward", "all_reduce"): ((1, B * S * H * F32), (0, 0)),
    ("fc2", "forward", "reduce_scatter"): ((0, 0), (1, B * S * H * F32)),
    # on: fc1 gathers the norm's sequence-sharded output [2, 4, 16] a rank.
    ("fc1", "forward", "all_gather"): ((0, 0), (1, B * S // 2 * H * F32)),
    # backward mirrors forward: fc2's output gradient gathered, fc1's input gradient reduce-scattered
    ("fc2", "backward", "all_gather"): ((0, 0), (1, B * S // 2 * H * F32)),
    ("fc1", "backward", "all_reduce"): ((1, B * S * H * F32), (0, 0)),
    ("fc1", "backward", "reduce_scatter"): ((0, 0), (1, B * S * H * F32)),
}
# The norm's replicated weight gradients stay Partial: no collective in its backward either way.


def test_sequence_parallel_off_vs_on(fake_world, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

    off, referee_off = _step(
        {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()}, torch.randn(B, S, H, requires_grad=True), norm=True
    )
    on_plan = {
        "norm": SequenceParallel(),
        "fc1": ColwiseParallel(input_layouts=Shard(1)),
        "fc2": RowwiseParallel(output_layouts=Shard(1)),
    }
    on, referee_on = _step(on_plan, torch.randn(B, S // 2, H, requires_grad=True), norm=True)
    _check_against_referee(SP_OFF_VS_ON, referee_off, referee_on)
    # JSON dumps read as well as spans files
    off.generate_json_dump(tmp_path / "off.json", noise_level=0)
    on.generate_json_dump(tmp_path / "on.json", noise_level=0)

    code, out, err = _cli(capsys, str(tmp_path / "off.json"), str(tmp_path / "on.json"), "--json")
    assert code == 3, err
    assert _changes(json.loads(out)) == SP_OFF_VS_ON
    code, out, _ = _cli(capsys, str(tmp_path / "off.json"), str(tmp_path / "on.json"))
    print(out)
    for line in (
        "fc1 forward: +1 all_gather (512 B)",
        "fc1 backward: -1 all_reduce (1.0 KiB)",
        "fc1 backward: +1 reduce_scatter (1.0 KiB)",
        "fc2 forward: -1 all_reduce (1.0 KiB)",
        "fc2 forward: +1 reduce_scatter (1.0 KiB)",
        "fc2 backward: +1 all_gather (512 B)",
        "total: 2 → 4 collectives (+2), 2.0 KiB → 3.0 KiB (+1.0 KiB)",
    ):
        assert line in out.splitlines()
    assert "norm " not in out


# --- bytes only, tolerance, inputs ------------------------------------------------------------


@pytest.fixture
def batch_4_vs_5(fake_world, tmp_path: Path) -> tuple[str, str]:
    """The same plan on a batch of 4 and of 5: the same collectives, 25% more bytes each."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    plan = {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()}
    a, _ = _step(plan, torch.randn(4, 16, requires_grad=True))
    b, _ = _step(plan, torch.randn(5, 16, requires_grad=True))
    return _write(a, tmp_path / "a.json"), _write(b, tmp_path / "b.json")


def test_bytes_changes_and_the_tolerance(batch_4_vs_5, capsys) -> None:  # type: ignore[no-untyped-def]
    a, b = batch_4_vs_5
    code, out, _ = _cli(capsys, a, b)
    assert code == 3
    # fc2's forward output and fc1's input gradient: [4, 16] -> [5, 16] float32
    assert "fc2 forward: all_reduce 1 → 1, 256 B → 320 B (+64 B)" in out.splitlines()
    assert "fc1 backward: all_reduce 1 → 1, 256 B → 320 B (+64 B)" in out.splitlines()
    assert _cli(capsys, a, b, "--bytes-tolerance", "25%")[0] == 0
    assert _cli(capsys, a, b, "--bytes-tolerance", "24%")[0] == 3
    assert _cli(capsys, a, b, "--bytes-tolerance", "64")[0] == 0
    code, out, _ = _cli(capsys, a, b, "--bytes-tolerance", "63")
    assert code == 3 and json.loads(_cli(capsys, a, b, "--json", "--bytes-tolerance", "63")[1])["same"] is False


def test_tolerance_parsing() -> None:
    assert parse_bytes_tolerance("4096") == BytesTolerance(absolute=4096)
    assert parse_bytes_tolerance("2.5%") == BytesTolerance(fraction=0.025)
    for bad in ("-1", "5 MiB", "1.5", "%", ""):
        with pytest.raises(ValueError, match="bytes tolerance"):
            parse_bytes_tolerance(bad)


def test_bad_tolerance_is_a_usage_error(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["diff", str(tmp_path), str(tmp_path), "--bytes-tolerance", "lots"])
    assert exit_info.value.code == 2
    assert "bytes tolerance must be" in capsys.readouterr().err


def test_unreadable_runs_exit_2_with_one_line(batch_4_vs_5, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    a, _ = batch_4_vs_5
    (tmp_path / "junk.json").write_text("not json")
    (tmp_path / "empty").mkdir()
    two_ranks = tmp_path / "two_ranks"
    for rank in (0, 1):
        _copy_as_rank(a, rank, two_ranks / f"spans_rank{rank}.json")
    for other, says in (
        (tmp_path / "missing.json", "no such file"),
        (tmp_path / "junk.json", "is not JSON"),
        (tmp_path / "empty", "no per-rank .json files"),
        (two_ranks, "holds 2 ranks"),
    ):
        code, out, err = _cli(capsys, a, str(other))
        assert code == 2 and out == "", (other, out)
        assert says in err and len(err.strip().splitlines()) == 1, err


def test_folders_rank_by_rank(batch_4_vs_5, tmp_path: Path) -> None:
    """Rank 1 changes, rank 0 does not; a rank only in B: its collectives appear."""
    a, b = batch_4_vs_5
    for folder, sources in (("A", (a, a)), ("B", (a, b, a))):
        for rank, source in enumerate(sources):
            _copy_as_rank(source, rank, tmp_path / folder / f"spans_rank{rank}.json")
    diff = diff_paths(tmp_path / "A", tmp_path / "B")
    assert diff.ranks_only_in_b == [2] and not diff.same
    report = format_diff(diff)
    print(report)
    lines = report.splitlines()
    assert "rank 1: fc2 forward: all_reduce 1 → 1, 256 B → 320 B (+64 B)" in lines
    assert "rank 2: fc2 forward: +1 all_reduce (256 B)" in lines
    assert "rank 2: only in B" in lines
    assert not any(line.startswith("rank 0:") for line in lines)


def test_a_demo_folder_a_spans_file_and_a_json_dump_per_rank(fake_world, tmp_path: Path) -> None:
    """`hp-otel demo` writes both per rank (spans_rank<r>.json, comm_rank<r>.json): the spans file is read;
    two files of one kind for a rank are still refused."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    plan = {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()}
    a, _ = _step(plan, torch.randn(4, 16, requires_grad=True))
    b, _ = _step(plan, torch.randn(5, 16, requires_grad=True))
    for folder, spans, dump in (("A", a, a), ("B", b, b), ("mixed", a, b)):
        (tmp_path / folder).mkdir()
        spans.write_spans(tmp_path / folder / "spans_rank0.json")
        dump.generate_json_dump(tmp_path / folder / "comm_rank0.json", noise_level=3)
    assert diff_paths(tmp_path / "A", tmp_path / "A").same
    lines = format_diff(diff_paths(tmp_path / "A", tmp_path / "B")).splitlines()
    assert "rank 0: fc2 forward: all_reduce 1 → 1, 256 B → 320 B (+64 B)" in lines
    assert diff_paths(tmp_path / "A", tmp_path / "mixed").same  # its spans file is a's; its dump b's is not read
    b.write_spans(tmp_path / "mixed" / "spans_rank0_again.json")
    with pytest.raises(ValueError, match="rank 0 twice"):
        read_run(tmp_path / "mixed")


def test_a_change_on_every_rank_is_said_once(batch_4_vs_5, tmp_path: Path) -> None:
    a, b = batch_4_vs_5
    for folder, source in (("A", a), ("B", b)):
        for rank in (0, 1):
            _copy_as_rank(source, rank, tmp_path / folder / f"spans_rank{rank}.json")
    assert set(read_run(tmp_path / "A").ranks) == {0, 1}
    lines = format_diff(diff_paths(tmp_path / "A", tmp_path / "B")).splitlines()
    assert "fc2 forward: all_reduce 1 → 1, 256 B → 320 B (+64 B)" in lines
    assert "per rank; a line without ranks holds on all 2" in lines


def test_a_mode_summary_matches_its_file(batch_4_vs_5) -> None:
    a, _ = batch_4_vs_5
    from hp_otel.spans.otlp_json import read_spans

    assert diff_runs(read_run(a), summarize_spans(read_spans(a))).same


def test_a_snapshot_is_a_run_too(batch_4_vs_5, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    from hp_otel.analysis.run_diff import snapshot_text

    a, b = batch_4_vs_5
    snapshot = tmp_path / "snap.json"
    snapshot.write_text(snapshot_text(read_run(a)))
    assert _cli(capsys, str(snapshot), a)[0] == 0
    code, out, _ = _cli(capsys, str(snapshot), b)
    assert code == 3 and "fc2 forward: all_reduce 1 → 1, 256 B → 320 B (+64 B)" in out.splitlines()
    snapshot.write_text(json.dumps({"format": "hp_otel.comm_snapshot", "version": 99, "collectives": []}))
    code, _, err = _cli(capsys, str(snapshot), a)
    assert code == 2 and "snapshot version 99" in err
