"""Communication snapshots, as a user's session sees them: written the first time, passing while
the step is the same, failing with the diff when the plan changes, rewritten on request.

The snapshot's expected text is written by hand: the TP MLP (fc1 colwise, fc2 rowwise) issues
one all_reduce of its [4, 16] float32 output in fc2's forward and one of the input gradient
in fc1's backward (256 B each); with fc2 colwise instead, see tests/analysis/test_run_diff.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hp_otel import CommDebugMode
from hp_otel.testing import assert_comm_snapshot
from hp_otel.testing.snapshots import CommSnapshotWritten

pytest_plugins = ("pytester",)

USER_TEST = """
import os

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from hp_otel.workloads.tp_mlp import MLP
from hp_otel.testing import assert_comm_snapshot


@pytest.fixture
def model():
    from torch.testing._internal.distributed.fake_pg import FakeStore

    created = not dist.is_initialized()
    if created:
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    fc2 = ColwiseParallel() if os.environ.get("PLAN") == "colwise" else RowwiseParallel()
    torch.manual_seed(0)
    plan = {"fc1": ColwiseParallel(use_local_output=False), "fc2": fc2}
    yield parallelize_module(MLP(), init_device_mesh("cpu", (2,)), plan)
    if created:
        dist.destroy_process_group()


def test_step(model, make_comm_debug_mode):
    x = torch.randn(4, 16, requires_grad=True)
    with make_comm_debug_mode(module=model) as mode:
        model(x).sum().backward()
    assert_comm_snapshot(mode, "snapshots/step.json")
"""

ROWWISE_SNAPSHOT = """{
  "format": "hp_otel.comm_snapshot",
  "version": 1,
  "collectives": [
    {"module": "fc1", "phase": "backward", "op": "all_reduce", "count": 1, "bytes": 256},
    {"module": "fc2", "phase": "forward", "op": "all_reduce", "count": 1, "bytes": 256}
  ],
  "total": {"count": 2, "bytes": 512}
}
"""
# fc2 colwise: its input [4, 16] a rank gathered in forward, the input gradient [4, 32] reduce-scattered
# (under the root: the plan's hook made that node), the transposed output gradient [8, 4] a rank gathered.
COLWISE_ROWS = [
    {"module": "(root)", "phase": "backward", "op": "reduce_scatter", "count": 1, "bytes": 512},
    {"module": "fc1", "phase": "backward", "op": "all_reduce", "count": 1, "bytes": 256},
    {"module": "fc2", "phase": "forward", "op": "all_gather", "count": 1, "bytes": 256},
    {"module": "fc2", "phase": "backward", "op": "all_gather", "count": 1, "bytes": 128},
]


@pytest.fixture(scope="module")
def warmed_up(fake_world) -> None:  # type: ignore[no-untyped-def]
    """Both plans' steps once in this process, before `pytester` notes which modules are loaded: it
    drops those loaded later (by a test or an inline session), and some of torch's, which such a
    step loads lazily, cannot be loaded twice in one process."""
    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from hp_otel.workloads.tp_mlp import MLP

    for fc2 in (RowwiseParallel(), ColwiseParallel()):
        plan = {"fc1": ColwiseParallel(use_local_output=False), "fc2": fc2}
        model = parallelize_module(MLP(), init_device_mesh("cpu", (2,)), plan)
        with CommDebugMode(module=model):
            model(torch.randn(4, 16, requires_grad=True)).sum().backward()


INLINE = ("-p", "no:cacheprovider", "--assert=plain")  # an inline session of this suite takes ≈5 s


SUBPROCESS = ("-p", "no:cacheprovider")


@pytest.mark.multiprocess  # six pytest sessions, each in a process of its own
def test_the_snapshot_workflow_end_to_end(pytester, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Each session in its own process, as a user's runs are: nothing of this suite's process (its
    earlier tests' torch state) reaches the user's step."""
    tests = pytester.mkpydir("tests")
    (tests / "test_step.py").write_text(USER_TEST)
    snapshot = tests / "snapshots" / "step.json"  # beside the test file, not in the working directory

    first = pytester.runpytest_subprocess(*SUBPROCESS, "tests")
    first.assert_outcomes(passed=1, warnings=1)
    first.stdout.fnmatch_lines(["*hp_otel: 1 communication snapshot(s) written*", f"*{snapshot}"])
    assert snapshot.read_text() == ROWWISE_SNAPSHOT
    assert not (pytester.path / "snapshots").exists()

    again = pytester.runpytest_subprocess(*SUBPROCESS, "tests")
    again.assert_outcomes(passed=1)
    assert "snapshot(s) written" not in again.stdout.str()

    monkeypatch.setenv("PLAN", "colwise")
    changed = pytester.runpytest_subprocess(*SUBPROCESS, "tests")
    changed.assert_outcomes(failed=1)
    changed.stdout.fnmatch_lines(
        [
            "*communication differs from the snapshot (A: the snapshot, B: this run):*",
            "*(root) backward: +1 reduce_scatter (512 B)",
            "*fc2 forward: +1 all_gather (256 B)",
            "*fc2 forward: -1 all_reduce (256 B)",
            "*fc2 backward: +1 all_gather (128 B)",
            "*total: 2 → 4 collectives (+2), 512 B → 1.1 KiB (+640 B)",
            "*rerun with `pytest --hp-otel-update-snapshots`*",
        ]
    )
    assert snapshot.read_text() == ROWWISE_SNAPSHOT  # a failure leaves the snapshot alone

    updated = pytester.runpytest_subprocess(*SUBPROCESS, "tests", "--hp-otel-update-snapshots")
    updated.assert_outcomes(passed=1, warnings=1)
    assert json.loads(snapshot.read_text())["collectives"] == COLWISE_ROWS
    pytester.runpytest_subprocess(*SUBPROCESS, "tests").assert_outcomes(passed=1)  # the option is gone again

    monkeypatch.delenv("PLAN")
    pytester.runpytest_subprocess(*SUBPROCESS, "tests").assert_outcomes(failed=1)


def test_the_option_rewrites_and_the_summary_lists_it(warmed_up, pytester, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The fast part of the workflow: the plugin's option and its summary (the diff itself: the unit tests)."""
    tests = pytester.mkpydir("tests")
    (tests / "test_step.py").write_text(USER_TEST)
    snapshot = tests / "snapshots" / "step.json"
    snapshot.parent.mkdir()
    snapshot.write_text(ROWWISE_SNAPSHOT)
    monkeypatch.setenv("PLAN", "colwise")
    updated = pytester.runpytest(*INLINE, "tests", "--hp-otel-update-snapshots")
    updated.assert_outcomes(passed=1, warnings=1)
    updated.stdout.fnmatch_lines(["*hp_otel: 1 communication snapshot(s) written*", f"*{snapshot}"])
    assert json.loads(snapshot.read_text())["collectives"] == COLWISE_ROWS
    from hp_otel.testing import snapshots

    assert snapshots._session["update"] is False  # the inline session's option did not outlive it


def _mode_with(observer_program) -> CommDebugMode:  # type: ignore[no-untyped-def]
    with CommDebugMode() as mode:
        observer_program(mode.observer)
    return mode


def _all_reduce(observer, shape=(4, 8)) -> None:  # type: ignore[no-untyped-def]
    from hp_otel.spans.infos import CollectiveInfo

    size = shape[0] * shape[1] * 4
    info = CollectiveInfo("c10d.allreduce_", "all_reduce", 2, "tp", (0, 1), shape, shape, "torch.float32", size)
    ticket = observer.on_collective_issue(info, 1)
    observer.on_collective(info, 1, 2, None, None, ticket)


def test_bytes_tolerance_and_update_false(tmp_path: Path) -> None:
    path = tmp_path / "snap.json"
    with pytest.warns(CommSnapshotWritten):
        assert_comm_snapshot(_mode_with(_all_reduce), path)
    bigger = _mode_with(lambda o: _all_reduce(o, (4, 9)))  # 128 B -> 144 B: +12.5%
    with pytest.raises(AssertionError, match=r"\(outside\) forward: all_reduce 1 → 1, 128 B → 144 B"):
        assert_comm_snapshot(bigger, path)
    assert_comm_snapshot(bigger, path, bytes_tolerance="12.5%")
    assert_comm_snapshot(bigger, path, bytes_tolerance=16)
    with pytest.raises(AssertionError):
        assert_comm_snapshot(bigger, path, bytes_tolerance=15, update=False)
    with pytest.warns(CommSnapshotWritten, match="updated"):
        assert_comm_snapshot(bigger, path, update=True)
    assert json.loads(path.read_text())["total"] == {"count": 1, "bytes": 144}


def test_a_relative_path_is_beside_the_calling_file(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.chdir(tmp_path)
    target = Path(__file__).parent / "snapshots" / "never_written.json"
    mode = _mode_with(_all_reduce)
    with pytest.warns(CommSnapshotWritten, match=str(target)):
        assert_comm_snapshot(mode, "snapshots/never_written.json")
    try:
        assert target.exists() and not (tmp_path / "snapshots").exists()
    finally:
        target.unlink()
        target.parent.rmdir()


def test_what_a_snapshot_cannot_be_taken_from(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="path must be"):
        assert_comm_snapshot(_mode_with(_all_reduce), 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="bytes tolerance must be"):
        assert_comm_snapshot(_mode_with(_all_reduce), tmp_path / "x.json", bytes_tolerance="a lot")
    with CommDebugMode(max_spans=1) as capped:
        _all_reduce(capped.observer)
        _all_reduce(capped.observer)
    with pytest.raises(AssertionError, match="max_spans"):
        assert_comm_snapshot(capped, tmp_path / "x.json")
    with CommDebugMode(record_spans=False) as counts_only:
        _all_reduce(counts_only.observer)
    with pytest.raises(AssertionError, match="needs the spans"):
        assert_comm_snapshot(counts_only, tmp_path / "x.json")
    (tmp_path / "broken.json").write_text('{"format": "hp_otel.comm_snapshot", "version": 1, "collectives": [{}]}')
    with pytest.raises(AssertionError, match=r"cannot be read.*--hp-otel-update-snapshots"):
        assert_comm_snapshot(_mode_with(_all_reduce), tmp_path / "broken.json")
    assert not (tmp_path / "x.json").exists()
