"""A traced collective's description is cached by what it is made of (`CollectiveSpec.describe`,
`complete`): calls alike share one info, and a call that differs in anything the info holds must
get its own, never a stale one."""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist

import hp_otel
from hp_otel.sources.pytorch import collectives

_ops = torch.ops._c10d_functional
_c10d = torch.ops.c10d


def _spec(op):
    return collectives.collective_specs()[op]


def _fresh(spec, args, kwargs=None, result=None, param_module=""):
    """What `describe` makes with no cache to read (the reference every cached call must equal)."""
    kept, spec._infos = spec._infos, {}
    try:
        return spec.describe(args, kwargs or {}, result, param_module)
    finally:
        spec._infos = kept


def _check(spec, base, variants) -> None:
    """`base` and each variant, described twice: the same object each time, equal to a fresh
    description, and every variant's info unlike the base's."""
    first = spec.describe(*base)
    assert spec.describe(*base) is first
    assert first == _fresh(spec, *base)
    for name, call in variants.items():
        info = spec.describe(*call)
        assert info == _fresh(spec, *call), name
        assert info != first, name
        assert spec.describe(*call) is info, name
        assert spec.describe(*base) is first, name


def test_functional_all_reduce_differs_in_group_shape_dtype_reduce_op_and_param_module(fake_world) -> None:
    spec = _spec(_ops.all_reduce.default)
    world = dist.group.WORLD.group_name
    other = dist.new_group(ranks=[0]).group_name  # another group: its own size, name and ranks
    t = torch.ones(4, 8)
    _check(
        spec,
        ((t, "sum", world), {}, None, ""),
        {
            "group": ((t, "sum", other), {}, None, ""),
            "shape": ((torch.ones(8, 4), "sum", world), {}, None, ""),
            "dtype": ((torch.ones(4, 8, dtype=torch.bfloat16), "sum", world), {}, None, ""),
            "reduce op": ((t, "max", world), {}, None, ""),
            "param_module": ((t, "sum", world), {}, None, "layers.0"),
        },
    )
    # another tensor of the same shape and dtype is the same collective
    assert spec.describe((torch.zeros(4, 8), "sum", world), {}, None, "") is spec.describe(
        (t, "sum", world), {}, None, ""
    )


def test_c10d_ops_differ_in_async_flag_reduce_op_output_and_bytes(fake_world) -> None:
    pg = dist.group.WORLD
    t = torch.ones(4)
    spec = _spec(_c10d.allreduce_.default)
    base = ([t], pg, dist.ReduceOp.SUM, None, False)
    _check(
        spec,
        (base, {}, None, ""),
        {
            "async": ((*base[:4], True), {}, None, ""),
            "async left to its default": (base[:4], {}, None, ""),
            "reduce op": ((*base[:2], dist.ReduceOp.MAX, *base[3:]), {}, None, ""),
        },
    )
    coalesced = _spec(_c10d.allreduce_coalesced_.default)
    _check(  # the same first tensor, more bytes after it
        coalesced,
        (([t, torch.ones(2)], pg, dist.ReduceOp.SUM), {}, None, ""),
        {"bytes": (([t, torch.ones(3)], pg, dist.ReduceOp.SUM), {}, None, "")},
    )
    gather = _spec(_c10d._allgather_base_.default)
    _check(
        gather,
        ((torch.ones(8), t, pg), {}, None, ""),
        {"output shape": ((torch.ones(2, 4), t, pg), {}, None, "")},
    )


def test_point_to_point_differs_in_peer_and_tag(fake_world) -> None:
    spec = _spec(_c10d.send.default)
    pg = dist.group.WORLD
    t = torch.ones(4)
    _check(
        spec,
        (([t], pg, 1, 0), {}, None, ""),
        {"peer": (([t], pg, 0, 0), {}, None, ""), "tag": (([t], pg, 1, 7), {}, None, "")},
    )
    assert spec.describe(([t], pg, 1, 7), {}, None, "").peers == (1,)


def test_all_to_all_differs_in_split_sizes(fake_world) -> None:
    spec = _spec(_ops.all_to_all_single.default)
    world = dist.group.WORLD.group_name
    t = torch.ones(4, 2)
    _check(
        spec,
        ((t, [1, 3], [2, 2], world), {}, None, ""),
        {
            "output splits": ((t, [3, 1], [2, 2], world), {}, None, ""),
            "input splits": ((t, [1, 3], [3, 1], world), {}, None, ""),
        },
    )


def test_complete_shares_the_completed_info_and_keeps_each_output(fake_world) -> None:
    spec = _spec(_ops.all_gather_into_tensor.default)
    world = dist.group.WORLD.group_name
    info = spec.describe((torch.ones(4, 8), 2, world), {}, None, "")
    done = spec.complete(info, torch.ones(8, 8))
    assert done == dataclasses.replace(info, output_shape=(8, 8))
    assert type(done.output_shape) is tuple
    assert spec.complete(info, torch.ones(8, 8)) is done
    assert spec.complete(info, torch.ones(4, 16)).output_shape == (4, 16)
    assert spec.complete(info, torch.ones(4, 8)) is info  # the shape described at issue
    other = spec.describe((torch.ones(2, 8), 2, world), {}, None, "")
    assert spec.complete(other, torch.ones(8, 8)) == dataclasses.replace(other, output_shape=(8, 8))


def test_eager_reduce_ops_are_told_apart_though_boxed_anew_each_call(fake_world) -> None:
    seen = []
    spec = _spec(_c10d.allreduce_.default)
    original = spec.describe

    def spy(*args, **kwargs):
        seen.append(original(*args, **kwargs))
        return seen[-1]

    spec.describe = spy
    try:
        t = torch.ones(4)
        with hp_otel.CommDebugMode():
            for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.SUM, dist.ReduceOp.MIN):
                dist.all_reduce(t, op=op)
    finally:
        del spec.describe
    assert [info.reduce_op for info in seen] == ["sum", "max", "sum", "min"]
    assert seen[0] is seen[2]


def test_the_cache_is_bounded(fake_world, monkeypatch) -> None:
    monkeypatch.setattr(collectives, "_MAX_CACHED_INFOS", 3)
    spec = _spec(_ops.all_reduce.default)
    monkeypatch.setattr(spec, "_infos", {})
    world = dist.group.WORLD.group_name
    infos = [spec.describe((torch.ones(n), "sum", world), {}, None, "") for n in range(1, 6)]
    assert len(spec._infos) <= 3
    assert [i.input_shape for i in infos] == [(n,) for n in range(1, 6)]
    # full, it starts again: the latest shapes are the ones found, not the first three
    assert spec.describe((torch.ones(5), "sum", world), {}, None, "") is infos[-1]


def _symbolic(shape: tuple[int, ...]) -> torch.Tensor:
    """A fake tensor of symbolic sizes (as tracing sees one): its shape does not hash."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

    mode = FakeTensorMode(shape_env=ShapeEnv())
    context = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC] * len(shape))
    return mode.from_tensor(torch.ones(shape), symbolic_context=context)


def test_a_symbolic_shape_is_described_not_cached(fake_world, monkeypatch) -> None:
    spec = _spec(_ops.all_gather_into_tensor.default)
    monkeypatch.setattr(spec, "_infos", {})
    monkeypatch.setattr(spec, "_completed", {})
    world = dist.group.WORLD.group_name
    t = _symbolic((4, 8))
    info = spec.describe((t, 2, world), {}, None, "")
    assert spec._infos == {}
    done = spec.complete(info, _symbolic((8, 8)))
    assert spec._completed == {}
    assert len(info.input_shape) == 2 and len(done.output_shape) == 2
    assert info.dtype == spec.describe((torch.ones(4, 8), 2, world), {}, None, "").dtype
