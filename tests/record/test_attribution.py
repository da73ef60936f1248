"""Where a forward collective belongs when a parameter group issues it for a module not running
(FSDP's explicit forward prefetch): the group's module and the calls enclosing it."""

from __future__ import annotations

import pytest

from hp_otel.record.attribution import GroupCalls, forward_owner, outside_owner
from hp_otel.spans.infos import ModuleCall, ModuleInfo

pytestmark = pytest.mark.torch_free  # needs no torch: not rerun on torch 2.14.1 (tests/support/markers.py)


def _info(fqn: str) -> ModuleInfo:
    return ModuleInfo(fqn, fqn, "M")


def test_prefetch_of_the_next_layer_counts_for_it_and_the_open_root() -> None:
    owner = forward_owner([("(root)", "forward"), ("layers.0", "forward")], [(ModuleCall(_info("layers.1")),)])
    assert owner is not None
    assert owner.owners == {"(root)", "layers.1"}
    assert (owner.fqn, owner.issued_by, owner.under) == ("layers.1", "layers.0", ("(root)", "forward"))
    assert [m.fqn for m in owner.opened] == ["layers.1"]


def test_its_own_pre_forward_and_no_group_change_nothing() -> None:
    modules = [("(root)", "forward"), ("layers.0", "forward")]
    assert forward_owner(modules, [(ModuleCall(_info("layers.0")),)]) is None
    assert forward_owner(modules, None) is None
    assert forward_owner([], [(ModuleCall(_info("layers.0")),)]) is None


def test_an_enclosing_call_not_open_yet_comes_from_the_latest_call_chain() -> None:
    """blocks.0.layers.3 prefetching blocks.1.layers.0: blocks.1 (a call of the previous step) is opened too."""
    root = ModuleCall(_info("(root)"))
    block = ModuleCall(_info("blocks.1"), root)
    layer = ModuleCall(_info("blocks.1.layers.0"), block)
    modules = [("(root)", "forward"), ("blocks.0", "forward"), ("blocks.0.layers.3", "forward")]
    owner = forward_owner(modules, [layer.chain])
    assert owner is not None
    assert owner.owners == {"(root)", "blocks.1", "blocks.1.layers.0"}
    assert [m.fqn for m in owner.opened] == ["blocks.1", "blocks.1.layers.0"]
    assert owner.under == ("(root)", "forward")


def test_a_module_outside_every_open_call_nests_under_the_window() -> None:
    owner = forward_owner([("a", "forward")], [(ModuleCall(_info("b")),)])
    assert owner is not None and owner.under is None and owner.owners == {"b"}


def test_a_group_of_several_modules_counts_for_each_in_spans_inside_the_running_one() -> None:
    """`fully_shard([norm, lm_head])` gathering in norm's pre-forward: lm_head's span opens inside norm's."""
    root = ModuleCall(_info("(root)"))
    norm = ModuleCall(_info("norm"), root)
    modules = [("(root)", "forward"), ("norm", "forward")]
    owner = forward_owner(modules, [norm.chain, (ModuleCall(_info("lm_head")),)])
    assert owner is not None
    assert owner.owners == {"(root)", "norm", "lm_head"}
    assert [m.fqn for m in owner.opened] == ["lm_head"]
    assert (owner.fqn, owner.issued_by, owner.under) == ("lm_head", None, ("norm", "forward"))


def test_a_group_called_outside_every_module_counts_for_its_modules() -> None:
    """A pipeline schedule's `post_backward()` after the last micro-batch: in the method's phase."""
    stage = ModuleCall(_info("s2"))
    owner = outside_owner(GroupCalls((stage.chain,), "backward"))
    assert (owner.phase, owner.fqn, owner.owners, owner.under) == ("backward", "s2", {"s2"}, None)
    assert [m.fqn for m in owner.opened] == ["s2"]
