"""MindSpore Cell tracking and the MindSpore collectives source, in one process (real MindSpore, PyNative).

The 2-worker collective run over mccl is test_mindspore_mccl.py.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("GLOG_v", "3")  # MindSpore's many [WARNING] lines
ms = pytest.importorskip("mindspore", reason="mindspore is not installed (CI installs it)")

import numpy as np  # noqa: E402
from mindspore import Tensor, nn  # noqa: E402

from hp_otel import CommDebugMode  # noqa: E402
from hp_otel.sources import default_sources  # noqa: E402
from hp_otel.sources.mindspore import collectives as ms_source  # noqa: E402
from hp_otel.spans import schema  # noqa: E402

HOOK_DICTS = ("_forward_pre_hook", "_forward_hook", "_backward_pre_hook", "_backward_hook")


class Net(nn.Cell):
    def __init__(self, fail: bool = False) -> None:
        super().__init__()
        self.fc1 = nn.Dense(4, 8)
        self.fc2 = nn.Dense(8, 4)
        self.fail = fail

    def construct(self, x):
        y = self.fc1(x)
        if self.fail:
            raise ValueError("construct failed")
        return self.fc2(y)


def _hooks(net: nn.Cell) -> list:
    return [{name: dict(getattr(cell, name)) for name in HOOK_DICTS} for _, cell in net.cells_and_names()]


def _spans(mode: CommDebugMode) -> list:
    spans = mode.get_finished_spans()
    names = {s.context.span_id: s.name for s in spans}
    return [(s.name, s.attributes[schema.PHASE], names.get(s.parent.span_id) if s.parent else None) for s in spans]


def test_forward_and_backward_cell_spans() -> None:
    net = Net()
    x = Tensor(np.ones((2, 4), np.float32))
    before = _hooks(net)

    def loss(x):
        return net(x).sum()

    with CommDebugMode(module=net) as mode:
        ms.grad(loss, grad_position=None, weights=net.trainable_params())(x)
    assert _hooks(net) == before  # every hook removed (MindSpore keeps its emptied containers)
    assert mode.engine == "auto"
    assert sorted(_spans(mode)) == sorted(
        [
            ("Net", "forward", None),
            ("fc1", "forward", "Net"),
            ("fc2", "forward", "Net"),
            ("Net backward", "backward", None),  # backward spans named apart (schema.md: span names)
            ("fc2 backward", "backward", "Net backward"),
            ("fc1 backward", "backward", "Net backward"),  # its post hook fires after the root's: not strictly nested
        ]
    )
    table = mode.generate_comm_debug_tracing_table(noise_level=3).splitlines()
    assert table[2:] == [
        "Module               Module((root)) [enter]",
        "  Module             Module(fc1) [enter]",
        "  Module             Module(fc2) [enter]",
        "Module               Module((root)) [backward]",
        "  Module             Module(fc2) [backward]",
        "  Module             Module(fc1) [backward]",
    ]
    assert mode.get_parameter_info()["fc1"] == {
        "weight": {"shape": [8, 4], "dtype": "Float32", "placements": ""},
        "bias": {"shape": [8], "dtype": "Float32", "placements": ""},
    }
    assert mode.get_callback_error_counts() == {}


def test_construct_that_raises_ends_spans_with_error_and_removes_hooks() -> None:
    net = Net(fail=True)
    before = _hooks(net)
    with pytest.raises(ValueError, match="construct failed"), CommDebugMode(module=net) as mode:
        net(Tensor(np.ones((2, 4), np.float32)))
    assert _hooks(net) == before
    root = next(s for s in mode.get_finished_spans() if s.name == "Net")
    assert not root.status.is_ok and "construct failed" in (root.status.description or "")


def test_auto_engine_for_a_cell_and_engine_mismatch() -> None:
    net = Net()
    sources = default_sources(net)
    assert [type(s).__name__ for s in sources] == [
        "MindSporeCollectiveSource",
        "MindSporeCellTracker",
        "GraphModeWatch",
    ]
    with pytest.raises(TypeError, match="engine='torch'"):
        CommDebugMode(module=net, engine="torch")
    with pytest.raises(ValueError, match="engine must be one of 'auto', 'torch', 'hyper_parallel', 'mindspore'"):
        CommDebugMode(engine="jax")
    with pytest.raises(ImportError, match="engine='hyper_parallel' needs"):  # the stand-in is not on the path here
        CommDebugMode(engine="hyper_parallel")


def test_collective_functions_are_patched_and_restored_exactly() -> None:
    import mindspore.mint.distributed as mint_distributed
    import mindspore.ops.communication as communication

    modules = (mint_distributed, communication)
    before = {(m, n): vars(m)[n] for m in modules for n in ms_source.COLLECTIVES if n in vars(m)}
    with CommDebugMode(engine="mindspore"):
        hooked = set(ms_source.hooked_functions())
        assert all(vars(m)[n] is not f for (m, n), f in before.items())
    assert hooked == {f"{m.__name__}.{n}" for m, n in before}
    assert {"mindspore.mint.distributed.all_reduce", "mindspore.ops.communication.barrier"} <= hooked
    assert all(vars(m)[n] is f for (m, n), f in before.items())
    assert ms_source.hooked_functions() == []


def test_real_graph_mode_is_reported_once() -> None:
    import warnings

    net = Net()
    previous = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with CommDebugMode(module=net) as mode:
                pass
    finally:
        ms.set_context(mode=previous)
    graph_warnings = [w for w in caught if "GRAPH_MODE" in str(w.message)]
    assert len(graph_warnings) == 1
    assert "PYNATIVE_MODE" in str(graph_warnings[0].message)
    assert mode.get_total_counts() == 0
    with warnings.catch_warnings(record=True) as caught:  # back in PyNative: nothing to say
        warnings.simplefilter("always")
        with CommDebugMode(module=net):
            pass
    assert not [w for w in caught if "GRAPH_MODE" in str(w.message)]


class Block(nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Dense(4, 4)

    def construct(self, x):
        return self.fc(x)


class Deep(nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.CellList([Block(), Block()])
        self.head = nn.Dense(4, 2)

    def construct(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


@pytest.mark.parametrize(
    ("depth", "hooked"),
    [
        (0, {"(root)"}),
        # the CellList is never called: its children at the depth are hooked in its place
        (1, {"(root)", "blocks", "blocks.0", "blocks.1", "head"}),
        ("full", {"(root)", "blocks", "blocks.0", "blocks.1", "head", "blocks.0.fc", "blocks.1.fc"}),
    ],
)
def test_module_depth_hooks_the_cells_down_to_it(depth, hooked) -> None:
    """Issue 46 item 7: `module_depth` is honoured (before: every cell was hooked, whatever it said)."""
    net = Deep()
    names = {id(cell): fqn or "(root)" for fqn, cell in net.cells_and_names()}
    x = Tensor(np.ones((2, 4), np.float32))

    def loss(x):
        return net(x).sum()

    with CommDebugMode(module=net, module_depth=depth) as mode:
        with_hooks = {names[id(cell)] for _, cell in net.cells_and_names() if cell._forward_pre_hook}
        ms.grad(loss, grad_position=None, weights=net.trainable_params())(x)
    assert with_hooks == hooked
    called = hooked - {"blocks"}  # (never called)
    spans = {(s.attributes[schema.MODULE_FQN], s.attributes[schema.PHASE]) for s in mode.get_finished_spans()}
    assert spans == {(fqn, phase) for fqn in called for phase in ("forward", "backward")}
    assert mode.get_callback_error_counts() == {}
