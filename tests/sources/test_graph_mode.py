"""Graph mode: a window that meets torch.compile'd code (or MindSpore GRAPH_MODE) says so once.

Uses a real `torch.compile` (backend "eager": dynamo's capture without a C++ compile)
of a tiny DTensor function over the fake process group.
"""

from __future__ import annotations

import sys
import types
import warnings

import pytest
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

from hp_otel import CommDebugMode
from hp_otel.sources.graph_mode import GraphModeWatch
from hp_otel.sources.pytorch.dtensor import HOOK_ENV


def _graph_warnings(caught) -> list[str]:
    return [str(w.message) for w in caught if "hp_otel:" in str(w.message)]


def test_compiled_code_in_a_window_is_named_once_and_traced_eagerly(fake_world, monkeypatch) -> None:
    """The dispatch-mode fallback: dynamo will not run compiled graphs under it."""
    import torch._dynamo
    from torch._dynamo import eval_frame

    monkeypatch.setenv(HOOK_ENV, "dispatch")
    mesh = init_device_mesh("cpu", (fake_world,))

    def gathered_sin(x):
        return x.redistribute(mesh, [Replicate()]).sin()

    compiled = torch.compile(gathered_sin, backend="eager")
    x = distribute_tensor(torch.randn(8, 4), mesh, [Shard(0)])
    expected = gathered_sin(x).to_local()
    torch.testing.assert_close(compiled(x).to_local(), expected)  # compiled outside any window
    before = eval_frame.dynamo_tls.skip_reasons

    mode = CommDebugMode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with mode:
            out = compiled(x)
        with mode:  # the same mode again: no second warning
            compiled(x)
    torch.testing.assert_close(out.to_local(), expected)
    (message,) = _graph_warnings(caught)
    assert "torch.compile'd code ran in this window (gathered_sin" in message
    assert "ran eagerly" in message
    assert mode.get_comm_counts() == {"_c10d_functional.all_gather_into_tensor": 1}  # it was traced
    assert eval_frame.dynamo_tls.skip_reasons is before  # restored exactly
    torch._dynamo.reset()


def test_compiled_dtensor_code_runs_compiled_with_kernels(fake_world, monkeypatch) -> None:
    """The kernel hook installs no dispatch mode: the compiled graph runs, its collective is counted."""
    import torch._dynamo

    monkeypatch.setenv(HOOK_ENV, "kernels")
    mesh = init_device_mesh("cpu", (fake_world,))
    graph_calls = []

    def counting_backend(gm, example_inputs):
        def run(*args):
            graph_calls.append(1)
            return gm.forward(*args)

        return run

    def gathered_sin(x):
        return x.redistribute(mesh, [Replicate()]).sin()

    compiled = torch.compile(gathered_sin, backend=counting_backend)
    x = distribute_tensor(torch.randn(8, 4), mesh, [Shard(0)])
    expected = gathered_sin(x).to_local()
    torch.testing.assert_close(compiled(x).to_local(), expected)
    ran_outside = len(graph_calls)
    assert ran_outside >= 1
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with CommDebugMode() as mode:
            out = compiled(x)
    torch.testing.assert_close(out.to_local(), expected)
    assert len(graph_calls) == 2 * ran_outside  # the graph ran compiled in the window
    assert _graph_warnings(caught) == []  # nothing ran eagerly
    assert mode.get_comm_counts() == {"_c10d_functional.all_gather_into_tensor": 1}
    assert mode.get_callback_error_counts() == {}
    torch._dynamo.reset()


def test_plain_window_does_not_warn(fake_world) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with CommDebugMode():
            torch.ones(2) + 1
    assert _graph_warnings(caught) == []


def test_reason_list_stays_bounded() -> None:
    from hp_otel.sources import graph_mode

    reasons = graph_mode._FirstReasons()
    for i in range(10_000):
        reasons.append(f"f{i}: non-infra torch dispatch mode present")
    assert len(reasons) == graph_mode._MAX_REASONS


@pytest.mark.parametrize("mode_value, warns", [(0, True), (1, False)])
def test_mindspore_graph_mode_is_reported(monkeypatch, mode_value: int, warns: bool) -> None:
    # both context values through a stand-in of the context API (GRAPH_MODE == 0, PYNATIVE_MODE == 1); the real
    # MindSpore GRAPH_MODE case is in test_mindspore_cells.py
    stand_in = types.SimpleNamespace(GRAPH_MODE=0, PYNATIVE_MODE=1, get_context=lambda key: mode_value)
    monkeypatch.setitem(sys.modules, "mindspore", stand_in)
    watch = GraphModeWatch()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        watch.attach(None)  # type: ignore[arg-type]
        watch.detach()
    assert bool(_graph_warnings(caught)) is warns
    if warns:
        assert "GRAPH_MODE" in watch.notes[0]


def test_the_watch_reads_dynamos_record_through_the_compat_entry_only(monkeypatch) -> None:
    """Issue 32 item 7: the member name comes from `_compat.SYMBOLS` alone. Renamed there (as a torch
    release could), the watch collects and restores the renamed member and never touches `skip_reasons`."""
    import dataclasses
    from types import MappingProxyType

    from torch._dynamo import eval_frame

    from hp_otel.sources.pytorch import _compat

    class Record:  # dynamo's thread-local state as a later torch might name it
        renamed_reasons = None

    record = Record()
    renamed = dataclasses.replace(_compat.SYMBOLS["dynamo_tls"], member="renamed_reasons")
    monkeypatch.setattr(_compat, "SYMBOLS", MappingProxyType({**_compat.SYMBOLS, "dynamo_tls": renamed}))
    monkeypatch.setattr(eval_frame, "dynamo_tls", record)
    watch = GraphModeWatch()
    watch.attach(None)  # type: ignore[arg-type]  # the watch never calls its observer
    collecting = record.renamed_reasons
    assert collecting is not None  # the watch put its own bounded list there
    collecting.append("gathered_sin: skipped because of a torch dispatch mode")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        watch.detach()
    assert record.renamed_reasons is None  # restored exactly
    assert not hasattr(record, "skip_reasons")
    assert "torch.compile'd code ran in this window (gathered_sin" in " ".join(_graph_warnings(caught))
