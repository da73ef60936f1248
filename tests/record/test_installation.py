"""Hooks kept between windows (`hp_otel.install()` / `hp_otel.uninstall()`) and the
cheaper windows: counts-only (`record_spans=False`) and `ops=False`.

Counts are checked against the independent referee (tests/support/referee.py) on the TP + SP
transformer, forward and backward; "installed" is checked on what torch holds: the
module hook dicts and the functions the redistribute wrapper replaces.
"""

from __future__ import annotations

import logging
import sys

import pytest
import torch
import torch.distributed as dist
from referee import Referee
from torch.overrides import _get_current_function_mode_stack

import hp_otel
from hp_otel import CommDebugMode
from hp_otel.always_on.instrumentor import HpOtelInstrumentor
from hp_otel.record import installation
from hp_otel.sources.pytorch import dtensor as torch_dtensor
from hp_otel.sources.pytorch import kernels as torch_kernels
from hp_otel.spans import schema
from hp_otel.workloads.tp_transformer import build_tp_transformer, demo_tokens

_REDISTRIBUTE = "redistribute_local_tensor"


def _redistribute_functions() -> list[object]:
    return [vars(sys.modules[name])[_REDISTRIBUTE] for name in torch_dtensor._REDISTRIBUTE_MODULES]


def _hook_counts(model: torch.nn.Module) -> list[tuple[int, int]]:
    return [(len(m._forward_pre_hooks), len(m._forward_hooks)) for m in model.modules()]


@pytest.fixture
def transformer(fake_world):
    model = build_tp_transformer(fake_world)
    return model, demo_tokens()


@pytest.fixture(autouse=True)
def _nothing_kept():
    hp_otel.uninstall()
    yield
    hp_otel.uninstall()
    assert installation.lingering_count() == 0


def _step(model, tokens) -> None:
    model(tokens).sum().backward()
    model.zero_grad(set_to_none=True)


def _refereed(model, tokens, **window) -> tuple[CommDebugMode, Referee]:
    with Referee(model) as referee, CommDebugMode(module=model, **window) as mode:
        _step(model, tokens)
    return mode, referee


def test_without_install_every_window_removes_its_hooks(transformer) -> None:
    model, tokens = transformer
    functions, hooks = _redistribute_functions(), _hook_counts(model)
    with CommDebugMode(module=model):
        _step(model, tokens)
        assert _hook_counts(model) != hooks
    assert _hook_counts(model) == hooks
    assert all(a is b for a, b in zip(_redistribute_functions(), functions, strict=True))
    assert installation.lingering_count() == 0 and not torch_kernels.registered()  # the collective kernels too


def test_install_keeps_hooks_between_windows_and_uninstall_restores_exactly(transformer) -> None:
    model, tokens = transformer
    functions, hooks = _redistribute_functions(), _hook_counts(model)
    hp_otel.install()
    with CommDebugMode(module=model) as first:
        _step(model, tokens)
    installed = _hook_counts(model)
    assert installed != hooks  # still hooked after the window closed
    assert any(a is not b for a, b in zip(_redistribute_functions(), functions, strict=True))
    # module hook set, redistribute and FSDP wrappers, Work.wait's timer, kernels
    assert installation.lingering_count() == 5

    _step(model, tokens)  # between windows: nothing records
    assert first.get_total_counts() > 0

    mode, referee = _refereed(model, tokens)  # the next window takes the hooks over: none added
    assert _hook_counts(model) == installed
    assert mode.get_comm_counts() == dict(referee.counts) == first.get_comm_counts()
    assert mode.get_comm_module_counts() == referee.module_counts_dict() == first.get_comm_module_counts()
    assert len(mode.get_finished_spans()) == len(first.get_finished_spans())

    hp_otel.uninstall()
    assert _hook_counts(model) == hooks
    assert all(a is b for a, b in zip(_redistribute_functions(), functions, strict=True))
    with CommDebugMode(module=model):  # after uninstall, windows install and remove their own again
        _step(model, tokens)
    assert _hook_counts(model) == hooks and installation.lingering_count() == 0 and not torch_kernels.registered()


def test_uninstall_during_a_window_removes_its_hooks_when_it_closes(transformer) -> None:
    model, tokens = transformer
    functions, hooks = _redistribute_functions(), _hook_counts(model)
    hp_otel.install()
    with Referee(model) as referee, CommDebugMode(module=model) as mode:
        hp_otel.uninstall()
        _step(model, tokens)  # the open window keeps recording
    assert mode.get_comm_module_counts() == referee.module_counts_dict()
    assert _hook_counts(model) == hooks
    assert all(a is b for a, b in zip(_redistribute_functions(), functions, strict=True))


def test_uninstall_unregisters_the_collective_kernels_unless_a_window_uses_them(fake_world) -> None:
    hp_otel.install()
    with CommDebugMode():
        dist.all_reduce(torch.ones(2))
    assert torch_kernels.registered()  # kept
    hp_otel.uninstall()
    assert not torch_kernels.registered()
    dist.all_reduce(torch.ones(2))  # torch's own kernels again
    hp_otel.install()
    with CommDebugMode() as mode:  # registered anew
        hp_otel.uninstall()  # a window records through them: they stay
        assert torch_kernels.registered()
        dist.all_reduce(torch.ones(2))
    assert mode.get_comm_counts() == {"c10d.allreduce_": 1}
    assert not torch_kernels.registered()  # the window was the last user, and nothing keeps them


def test_nested_windows_on_one_model_with_kept_hooks(transformer) -> None:
    model, tokens = transformer
    hooks = _hook_counts(model)
    hp_otel.install()
    with CommDebugMode(module=model) as outer:
        with CommDebugMode(module=model) as inner:  # the outer window's hooks are busy: the inner gets its own
            _step(model, tokens)
        _step(model, tokens)
    assert inner.get_total_counts() == outer.get_total_counts() > 0
    assert inner.get_comm_module_counts() == outer.get_comm_module_counts()
    hp_otel.uninstall()
    assert _hook_counts(model) == hooks


def test_kept_hooks_follow_a_model_that_changed(transformer) -> None:
    model, tokens = transformer
    hp_otel.install()
    with CommDebugMode(module=model):
        _step(model, tokens)
    model.extra = torch.nn.Identity()  # a module added between windows (not called: no counts)
    model.layers[0].attention.wq.weight = torch.nn.Parameter(model.layers[0].attention.wq.weight.detach().clone())
    mode, referee = _refereed(model, tokens)
    assert len(model.extra._forward_pre_hooks) == 1
    assert mode.get_comm_module_counts() == referee.module_counts_dict()
    assert mode.get_parameter_info()["layers.0.attention.wq"]["weight"]["placements"] == "Shard(dim=0)"
    hp_otel.uninstall()
    assert len(model.extra._forward_pre_hooks) == 0


@pytest.mark.parametrize("kept", [False, True], ids=["per-window", "kept"])
def test_counts_only_window_installs_only_what_counting_needs(transformer, kept) -> None:
    model, tokens = transformer
    if kept:
        hp_otel.install()
    functions = _redistribute_functions()
    full, _ = _refereed(model, tokens)
    with Referee(model) as referee, CommDebugMode(module=model, record_spans=False) as mode:
        modes = _get_current_function_mode_stack()
        _step(model, tokens)
    assert not any(type(m).__name__ == "_OpMode" for m in modes)  # no op mode
    if not kept:
        assert all(a is b for a, b in zip(_redistribute_functions(), functions, strict=True))
    assert mode.get_finished_spans() == ()
    assert mode.get_comm_counts() == dict(referee.counts) == full.get_comm_counts()
    assert mode.get_comm_module_counts() == referee.module_counts_dict() == full.get_comm_module_counts()


def test_counts_only_window_records_the_same_metrics(transformer, hp_meter_provider, hp_metric_reader) -> None:
    from hp_otel.spans import schema
    from hp_otel.testing import metric_points

    model, tokens = transformer

    def totals() -> dict[tuple, int]:
        points = metric_points(hp_metric_reader, schema.METRIC_CALLS)
        return {tuple(sorted(p.attributes.items())): p.value for p in points}

    with CommDebugMode(module=model, meter_provider=hp_meter_provider):
        _step(model, tokens)
    after_full = totals()
    with CommDebugMode(module=model, meter_provider=hp_meter_provider, record_spans=False):
        _step(model, tokens)
    after_counts = totals()
    assert after_full and {k: 2 * v for k, v in after_full.items()} == after_counts


def test_ops_false_leaves_out_op_spans_only(transformer) -> None:
    model, tokens = transformer
    full, _ = _refereed(model, tokens)
    mode, referee = _refereed(model, tokens, ops=False)
    kinds = {span.attributes.get(schema.CALL_KIND) for span in mode.get_finished_spans()}
    full_kinds = {span.attributes.get(schema.CALL_KIND) for span in full.get_finished_spans()}
    assert "op" in full_kinds and "op" not in kinds
    assert kinds == full_kinds - {"op"}
    assert mode.get_comm_counts() == dict(referee.counts)
    assert mode.get_comm_module_counts() == referee.module_counts_dict()
    table = mode.generate_comm_debug_tracing_table(noise_level=2)
    assert "all_gather" in table and "linear" not in table


def test_bad_ops_argument_is_refused() -> None:
    with pytest.raises(TypeError, match="ops must be True or False, got 'no'"):
        CommDebugMode(ops="no")


def test_instrumentor_keeps_hooks_while_instrumented(transformer, hp_meter_provider) -> None:
    from opentelemetry.sdk.trace import TracerProvider

    model, tokens = transformer
    functions, hooks = _redistribute_functions(), _hook_counts(model)
    instrumentor = HpOtelInstrumentor()
    instrumentor.instrument(module=model, tracer_provider=TracerProvider(), meter_provider=hp_meter_provider)
    try:
        for n in range(3):
            with hp_otel.step(n):
                _step(model, tokens)
        assert _hook_counts(model) != hooks  # kept between its steps
    finally:
        instrumentor.uninstrument()
    assert _hook_counts(model) == hooks
    assert all(a is b for a, b in zip(_redistribute_functions(), functions, strict=True))
    assert installation.lingering_count() == 0


def test_kept_hooks_do_not_keep_a_model_alive(fake_world) -> None:
    import gc
    import weakref

    model = build_tp_transformer(fake_world)
    hp_otel.install()
    with CommDebugMode(module=model):
        _step(model, demo_tokens())
    gone = weakref.ref(model)
    del model
    gc.collect()
    assert gone() is None
    hp_otel.uninstall()  # the lingering set of a model that went away is removed without error


def test_install_after_a_window_says_what_it_did(transformer, caplog) -> None:
    """Before: silent. The window that closed already removed its hooks; install() says the next window
    installs them and they stay from then on, and a second install() says it changed nothing."""
    model, tokens = transformer
    with CommDebugMode(module=model):
        _step(model, tokens)
    try:
        with caplog.at_level(logging.INFO, logger="hp_otel"):
            hp_otel.install()
            hp_otel.install()
        first, second = [r.getMessage() for r in caplog.records if r.getMessage().startswith("hp_otel.install()")]
        assert "until hp_otel.uninstall()" in first and "the next window installs them" in first, first
        assert "already keeping hooks" in second and "nothing changed" in second, second
        with CommDebugMode(module=model):
            _step(model, tokens)
        assert installation.lingering_count() == 5  # as it said: the next window's hooks stayed
    finally:
        hp_otel.uninstall()
