"""`_compat`, the one place hp_otel reaches torch's private API: every entry resolves on the
installed torch with the kind hp_otel expects (a torch upgrade that removes one fails here,
by name), hot-path entries are torch's own callables, and a missing symbol gives its
fallback or a TorchCompatError that names it."""

from __future__ import annotations

from types import ModuleType

import pytest
import torch

from hp_otel.sources.pytorch import _compat
from hp_otel.sources.pytorch._compat import SYMBOLS, TorchCompatError


@pytest.mark.parametrize("name", sorted(SYMBOLS))
def test_every_entry_resolves_with_its_kind(name: str) -> None:
    symbol = SYMBOLS[name]
    value = _compat.require(name)  # raises TorchCompatError naming the symbol if torch dropped it
    if symbol.kind == _compat.CALLABLE:
        assert callable(value), symbol.path
    elif symbol.kind == _compat.CLASS:
        assert isinstance(value, type), symbol.path
    elif symbol.kind == _compat.MODULE:
        assert isinstance(value, ModuleType), symbol.path
    else:  # ATTRIBUTE: `require` checked the member on its sample (or the owner)
        assert symbol.kind == _compat.ATTRIBUTE and symbol.purpose, symbol.path


def test_nothing_is_missing_on_this_torch() -> None:
    import hp_otel.torch  # noqa: F401 - imports every user of _compat
    from hp_otel.sources.pytorch import dtensor  # noqa: F401

    assert _compat.missing() == {}
    for name in ("current_graph_task_id", "unbox_work", "dispatch_library", "TorchDispatchMode", "FakeWork"):
        assert not _compat.is_missing(getattr(_compat, name)), name


def test_hot_entries_are_torchs_own_objects_bound_as_before() -> None:
    """No Python layer per event: the hooks' module globals are torch's C functions."""
    from hp_otel.sources.pytorch import collective_timer, modules

    assert _compat.current_graph_task_id is torch._C._current_graph_task_id
    assert collective_timer._in_backward is torch._C._current_graph_task_id
    assert modules._graph_task_id is torch._C._current_graph_task_id
    assert modules._current_node is torch._C._current_autograd_node
    assert modules._next_sequence_nr is torch._C._autograd._get_sequence_nr
    node = torch.ones(1, requires_grad=True).mul(2).grad_fn
    assert _compat.node_sequence_nr(node) == node._sequence_nr()


def test_accessors_read_the_private_members(fake_world) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    t = distribute_tensor(torch.ones(4, 2), init_device_mesh("cpu", (fake_world,)), [Shard(0)])
    assert _compat.dtensor_spec(t) is t._spec
    op = torch.ops.aten.add.Tensor
    assert (_compat.op_schema(op).name, _compat.overload_name(op)) == ("aten::add", "Tensor")
    assert _compat.overload_packet(op) is torch.ops.aten.add
    view = t.to_local()[1:]
    assert _compat.storage_key(view) == _compat.storage_key(t.to_local())  # views share the key
    linear = torch.nn.Linear(2, 2)
    assert list(_compat.own_parameters(linear)) == [linear.weight, linear.bias]
    assert _compat.fsdp_module_fqn(object()) == ""


def test_the_mod_tracker_members_the_drop_in_overrides_exist() -> None:
    tracker = _compat.mod_tracker_class()()
    missing = [m for m in _compat.MOD_TRACKER_MEMBERS if not hasattr(tracker, m)]
    assert missing == []
    assert _compat.mod_tracker_markers_take_module(_compat.mod_tracker_class())  # torch 2.13's signature


@pytest.fixture
def fresh_missing(monkeypatch):
    monkeypatch.setattr(_compat, "_missing", {})


def test_a_missing_callable_raises_a_clear_error_when_used(monkeypatch, fresh_missing) -> None:
    monkeypatch.delattr(torch._C, "_current_graph_task_id")
    stand_in = _compat.resolve("current_graph_task_id")
    assert _compat.is_missing(stand_in)
    with pytest.raises(TorchCompatError, match=r"torch\._C\._current_graph_task_id.*the phase of a collective"):
        stand_in()
    assert list(_compat.missing()) == ["current_graph_task_id"]
    with pytest.raises(TorchCompatError, match="_current_graph_task_id"):
        _compat.require("current_graph_task_id")
    assert isinstance(TorchCompatError("x"), ImportError)  # callers catching ImportError keep working


def test_a_missing_class_can_be_subclassed_but_not_instantiated(monkeypatch, fresh_missing) -> None:
    real_lookup = _compat._lookup

    def lookup(symbol):
        if symbol.name == "TorchDispatchMode":
            raise TorchCompatError("torch has no torch.utils._python_dispatch.TorchDispatchMode")
        return real_lookup(symbol)

    monkeypatch.setattr(_compat, "_lookup", lookup)
    base = _compat.resolve("TorchDispatchMode")

    class Mode(base):  # hp_otel's modules still import
        pass

    with pytest.raises(TorchCompatError, match="TorchDispatchMode"):
        Mode()
    assert not isinstance(object(), base)


def test_documented_fallbacks(monkeypatch, fresh_missing) -> None:
    monkeypatch.delattr(torch._C._distributed_c10d, "FakeWork")
    fake_work = _compat.resolve("FakeWork")
    assert isinstance(fake_work, type) and not isinstance(object(), fake_work)  # no Work is treated as fake
    monkeypatch.delattr(torch.utils.checkpoint, "_StopRecomputationError")
    assert _compat.resolve("StopRecomputationError") is None
    assert set(_compat.missing()) == {"FakeWork", "StopRecomputationError"}
    assert "no Work is treated as fake" in _compat.missing()["FakeWork"]


def test_hide_from_dynamo_falls_back_to_the_public_disable(monkeypatch) -> None:
    def fn() -> int:
        return 1

    assert _compat.hide_from_dynamo(fn) is fn  # marked skipped: the same function, no wrapper
    real_require = _compat.require

    def require(name):
        if name == "set_code_exec_strategy":
            raise TorchCompatError("gone")
        return real_require(name)

    monkeypatch.setattr(_compat, "require", require)

    def other() -> int:
        return 2

    wrapped = _compat.hide_from_dynamo(other)
    assert wrapped is not other and wrapped() == 2  # torch.compiler.disable's wrapper


def test_without_the_dispatcher_entries_collectives_fall_back_to_the_dispatch_mode(monkeypatch) -> None:
    from hp_otel.sources.pytorch import dtensor, kernels

    assert kernels.available()
    error = TorchCompatError("torch has no torch._C._dispatch_has_kernel_for_dispatch_key")
    stand_in = _compat._stand_in(SYMBOLS["dispatch_has_kernel_for_dispatch_key"], error)
    monkeypatch.setattr(_compat, "dispatch_has_kernel_for_dispatch_key", stand_in)
    assert not kernels.available()
    assert dtensor.collective_hook() == dtensor.DISPATCH_MODE


def test_dynamo_state_is_never_imported_for_the_graph_mode_watch(monkeypatch) -> None:
    import sys

    monkeypatch.delitem(sys.modules, "torch._dynamo.eval_frame", raising=False)
    assert _compat.loaded_dynamo_tls() is None
