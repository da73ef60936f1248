"""Which aten-level ops are collectives, and how to read a CollectiveInfo from a call.

Covers the functional collectives (`_c10d_functional.*`, their autograd variants and
`_dtensor.shard_dim_alltoall`) and the eager c10d ops (`c10d.allreduce_`, ...,
`barrier`, `send`, `recv_`) — including the ones torch's CommDebugMode does not
count.  Arguments are found by their names in each op's schema, once per op.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import torch
import torch.distributed as dist

from hp_otel.sources.function_collectives import reduce_op_name, torch_backend_name
from hp_otel.sources.pytorch import _compat
from hp_otel.sources.pytorch.tensors import dtype_name
from hp_otel.spans import schema
from hp_otel.spans.groups import mesh_dim_of
from hp_otel.spans.infos import NO_GROUP, CollectiveInfo, GroupDetails

# framework op name (namespace.op) -> normalised op
_NORMALISED: Mapping[str, str] = MappingProxyType(
    {
        "_c10d_functional.all_reduce": "all_reduce",
        "_c10d_functional.all_reduce_": "all_reduce",
        "_c10d_functional.all_reduce_coalesced": "all_reduce",
        "_c10d_functional.all_reduce_coalesced_": "all_reduce",
        "_c10d_functional.all_gather_into_tensor": "all_gather",
        "_c10d_functional.all_gather_into_tensor_out": "all_gather",
        "_c10d_functional.all_gather_into_tensor_coalesced": "all_gather",
        "_c10d_functional.reduce_scatter_tensor": "reduce_scatter",
        "_c10d_functional.reduce_scatter_tensor_out": "reduce_scatter",
        "_c10d_functional.reduce_scatter_tensor_coalesced": "reduce_scatter",
        "_c10d_functional.all_to_all_single": "all_to_all",
        "_c10d_functional.broadcast": "broadcast",
        "_c10d_functional.broadcast_": "broadcast",
        "_c10d_functional.isend": "send",
        "_c10d_functional.irecv": "recv",
        "_c10d_functional.batch_p2p_ops": "p2p",
        "_c10d_functional_autograd.all_reduce": "all_reduce",
        "_c10d_functional_autograd.all_gather_into_tensor": "all_gather",
        "_c10d_functional_autograd.reduce_scatter_tensor": "reduce_scatter",
        "_c10d_functional_autograd.all_to_all_single": "all_to_all",
        "_dtensor.shard_dim_alltoall": "all_to_all",
        "c10d.allreduce_": "all_reduce",
        "c10d.allreduce_coalesced_": "all_reduce",
        "c10d.allgather_": "all_gather",
        "c10d._allgather_base_": "all_gather",
        "c10d.allgather_coalesced_": "all_gather",
        "c10d.allgather_into_tensor_coalesced_": "all_gather",
        "c10d.reduce_scatter_": "reduce_scatter",
        "c10d._reduce_scatter_base_": "reduce_scatter",
        "c10d.reduce_scatter_tensor_coalesced_": "reduce_scatter",
        "c10d.alltoall_": "all_to_all",
        "c10d.alltoall_base_": "all_to_all",
        "c10d.broadcast_": "broadcast",
        "c10d.barrier": "barrier",
        "c10d.monitored_barrier_": "barrier",
        "c10d.send": "send",
        "c10d.recv_": "recv",
        "c10d.recv_any_source_": "recv",
        "c10d.gather_": "gather",
        "c10d.gather_into_tensor_": "gather",  # torch 2.14's dist.gather_single (absent before: skipped)
        "c10d.scatter_": "scatter",
        "c10d.reduce_": "reduce",
    }
)

_MAX_CACHED_INFOS = 256  # infos kept per collective op, each kind (a step has a few shapes)
_INPUT_ARGS = ("input", "self", "input_tensor", "input_tensors", "inputs", "tensors", "tensor")
_OUTPUT_ARGS = ("output", "out", "output_tensor", "output_tensors")
_GROUP_ARGS = ("group_name", "process_group", "group")
_REDUCE_ARGS = ("reduce_op", "reduceOp")
_PEER_ARGS = ("dst", "src", "peer_list")  # group ranks of point-to-point ops
_TAG_ARGS = ("tag", "tag_list")
_SPLIT_ARGS = ("input_split_sizes", "output_split_sizes")  # all_to_all_single (functional and c10d)


def _first_tensor(value: Any) -> torch.Tensor | None:
    while isinstance(value, (list, tuple)):
        if not value:
            return None
        value = value[0]
    return value if isinstance(value, torch.Tensor) else None


def _total_bytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_total_bytes(v) for v in value)
    return 0


# id(ProcessGroup) -> (a weak reference to it, info).  Keyed by the group object, not its name:
# names are reused when a process group is destroyed and re-created.  Weak, so that
# `destroy_process_group()` really frees the group: one kept alive here until interpreter
# shutdown has gloo's worker threads torn down there, which can abort the process
# ("terminate called without an active exception", see pytorch/pytorch#179291).
_groups: dict[int, tuple[weakref.ref[Any], GroupDetails]] = {}
_resolve_process_group = _compat.resolve_process_group


def _group_info(group: Any) -> GroupDetails:
    """Size, name and ranks of a group given by name (functional ops) or ProcessGroup (c10d ops)."""
    if isinstance(group, str):
        pg = _resolve_process_group(group)
    elif isinstance(group, dist.ProcessGroup):
        pg = group
    else:  # eager c10d ops get the group boxed as a TorchScript object
        pg = dist.ProcessGroup.unbox(group)
    key = id(pg)
    cached = _groups.get(key)
    if cached is not None and cached[0]() is pg:
        return cached[1]
    try:
        ranks = tuple(dist.get_process_group_ranks(pg))
    except Exception:  # a group the default-group registry does not know
        ranks = ()
    info = GroupDetails(
        size=int(pg.size()),
        name=str(getattr(pg, "group_name", group)),
        ranks=ranks,
        backend=torch_backend_name(pg),
        mesh_dim=mesh_dim_of(str(getattr(pg, "group_desc", "") or "")),
    )
    _groups[key] = (weakref.ref(pg, functools.partial(_forget_group, key)), info)
    return info


def _forget_group(key: int, reference: weakref.ref[Any]) -> None:
    """A cached group was freed: drop its entry (unless a new group took its id meanwhile)."""
    cached = _groups.get(key)
    if cached is not None and cached[0] is reference:
        del _groups[key]


def _ints(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]


def _global_rank(group: GroupDetails, group_rank: int) -> int:
    """A point-to-point op names its peer by rank in its group; spans give the global rank."""
    return group.ranks[group_rank] if 0 <= group_rank < len(group.ranks) else group_rank


def _keep(cache: dict[Any, Any], key: Any, value: Any) -> None:
    """Store in a per-op info cache, bounded: a full one starts again, so a run whose shapes keep
    changing (sequence lengths) still finds the current ones instead of the first few hundred."""
    if len(cache) >= _MAX_CACHED_INFOS:
        cache.clear()
    cache[key] = value


def _reduce_key(value: Any) -> Any:
    """What a reduce op's name depends on, hashable: a TorchScript ReduceOp is boxed anew at every
    call (its identity says nothing), its `op()` is the RedOpType it names."""
    if isinstance(value, torch.ScriptObject):
        return value.op()
    return _reduce_name(value)


def _reduce_name(value: Any) -> str:
    """Eager c10d ops pass a TorchScript ReduceOp, whose only accessor is its `op()` method: unbox it first."""
    if isinstance(value, torch.ScriptObject):
        value = dist.ReduceOp.RedOpType(value.op())
    return reduce_op_name(value)


class CollectiveSpec:
    """Where one collective op keeps its input, output, group and reduce op."""

    def __init__(self, op: _compat.OpOverload, name: str, normalised: str) -> None:
        self.name = name
        self.normalised = normalised
        self.functional = name.startswith(("_c10d_functional", "_dtensor"))
        arg_names = [a.name for a in _compat.op_schema(op).arguments]
        self._index = {n: i for i, n in enumerate(arg_names)}
        self._input = next((n for n in _INPUT_ARGS if n in self._index), None)
        self._output = next((n for n in _OUTPUT_ARGS if n in self._index), None)
        self._group = next((n for n in _GROUP_ARGS if n in self._index), None)
        self._reduce = next((n for n in _REDUCE_ARGS if n in self._index), None)
        self._async = "async_op" if "async_op" in self._index else None
        # The dispatcher leaves out trailing arguments equal to their default (async_op=True):
        # a missing one is its schema's default, not False.
        self._async_default = next(
            (bool(a.default_value) for a in _compat.op_schema(op).arguments if a.name == "async_op"), False
        )
        self._peer = next((n for n in _PEER_ARGS if n in self._index), None)
        self._tag = next((n for n in _TAG_ARGS if n in self._index), None)
        self._splits = all(n in self._index for n in _SPLIT_ARGS)
        # (group name, group size, dtype, bytes) -> the counts-only info (frozen: shared by every call like it)
        self._counts_infos: dict[tuple[str, int, Any, int], CollectiveInfo] = {}
        # what `describe` reads from a call -> (the group's details, kept alive for their id; the info)
        self._infos: dict[tuple[Any, ...], tuple[GroupDetails, CollectiveInfo]] = {}
        # (id of an info described at issue, the output shape returned) -> (that info, kept alive for its
        # id; it completed)
        self._completed: dict[tuple[int, Any], tuple[CollectiveInfo, CollectiveInfo]] = {}

    def _arg(self, name: str | None, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if name is None:
            return None
        if name in kwargs:
            return kwargs[name]
        i = self._index[name]
        return args[i] if i < len(args) else None

    def describe(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], result: Any, param_module: str = ""
    ) -> CollectiveInfo:
        inputs = self._arg(self._input, args, kwargs)
        outputs = self._arg(self._output, args, kwargs)
        if outputs is None:
            outputs = result if isinstance(result, torch.Tensor) else inputs  # in place: output is the input
        first_in = inputs if isinstance(inputs, torch.Tensor) else _first_tensor(inputs)
        first_out = outputs if isinstance(outputs, torch.Tensor) else _first_tensor(outputs)
        group = self._arg(self._group, args, kwargs)
        ginfo = _group_info(group) if group is not None else NO_GROUP
        asked = self._arg(self._async, args, kwargs)
        is_async = True if self.functional else bool(self._async_default if asked is None else asked)
        nbytes = inputs.numel() * inputs.element_size() if first_in is inputs else _total_bytes(inputs)
        reduce = self._arg(self._reduce, args, kwargs)
        peer_ranks: tuple[int, ...] = ()
        tags: tuple[int, ...] = ()
        if self._peer is not None:
            peer_ranks = tuple(_ints(self._arg(self._peer, args, kwargs)))
            tags = tuple(_ints(self._arg(self._tag, args, kwargs)))
        splits_in, splits_out = self._split_sizes(args, kwargs, ginfo.size) if self._splits else ((), ())
        # Everything the info is made of, as the call gave it: the group by its details' identity (the
        # entry keeps them alive, so the id is not reused), the reduce op by what names it.
        key: tuple[Any, ...] | None = (
            id(ginfo),
            first_in.shape if first_in is not None else None,
            first_in.dtype if first_in is not None else None,
            nbytes,
            first_out.shape if first_out is not None else None,
            reduce if reduce is None or type(reduce) is str else _reduce_key(reduce),
            is_async,
            param_module,
            peer_ranks,
            tags,
            splits_in,
            splits_out,
        )
        try:
            cached = self._infos.get(key)
        except TypeError:  # a part that does not hash (a symbolic shape, while tracing): described, not kept
            key, cached = None, None
        if cached is not None:  # a step repeats the same few collectives: described once, not per call
            return cached[1]
        peers = tuple(_global_rank(ginfo, p) for p in peer_ranks)
        info = CollectiveInfo(
            name=self.name,
            op=self.normalised,
            group_size=ginfo.size,
            group=ginfo.name,
            group_ranks=ginfo.ranks,
            input_shape=tuple(first_in.shape) if first_in is not None else (),
            output_shape=tuple(first_out.shape) if first_out is not None else (),
            dtype=dtype_name(first_in.dtype) if first_in is not None else "",
            bytes=nbytes,
            reduce_op=_reduce_name(reduce),
            is_async=is_async,
            param_module=param_module,
            peers=peers,
            tags=tags,
            backend=ginfo.backend,
            mesh_dim=ginfo.mesh_dim,
            input_split_sizes=splits_in,
            output_split_sizes=splits_out,
        )
        if key is not None:
            _keep(self._infos, key, (ginfo, info))
        return info

    def _split_sizes(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], group_size: int
    ) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """all_to_all_single's split sizes as given ((), () when even, or the group is over SPLIT_SIZES_MAX)."""
        if not self._splits or group_size > schema.SPLIT_SIZES_MAX:
            return (), ()
        given = [tuple(_ints(self._arg(name, args, kwargs))) for name in _SPLIT_ARGS]
        return given[0], given[1]

    def describe_counts(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> CollectiveInfo:
        """Only what counting and the metrics need (name, op, group size, dtype, bytes): a
        counts-only window skips the reduce op (a TorchScript call), ranks, peers and shapes."""
        inputs = self._arg(self._input, args, kwargs)
        first_in = inputs if isinstance(inputs, torch.Tensor) else _first_tensor(inputs)
        group = self._arg(self._group, args, kwargs)
        ginfo = _group_info(group) if group is not None else NO_GROUP
        dtype = first_in.dtype if first_in is not None else None
        nbytes = inputs.numel() * inputs.element_size() if first_in is inputs else _total_bytes(inputs)
        key = (ginfo.name, ginfo.size, dtype, nbytes)
        info = self._counts_infos.get(key)
        if info is None:  # a step repeats the same few: made once, not per call
            info = CollectiveInfo(
                name=self.name,
                op=self.normalised,
                group_size=ginfo.size,
                group=ginfo.name,  # what the oldest in-flight gauge names
                dtype=dtype_name(dtype) if dtype is not None else "",
                bytes=nbytes,
                is_async=self.functional,
                backend=ginfo.backend,
            )
            _keep(self._counts_infos, key, info)
        return info

    def complete(self, info: CollectiveInfo, result: Any) -> CollectiveInfo:
        """The info described at issue, with the output the op returned (functional ops return theirs)."""
        if self._output is None and isinstance(result, torch.Tensor):
            shape = result.shape
            if shape != info.output_shape:
                try:
                    cached = self._completed.get((id(info), shape))
                except TypeError:  # a symbolic shape, while tracing
                    return info.with_output_shape(tuple(shape))
                if cached is not None:  # the same described info, the same output: completed once
                    return cached[1]
                done = info.with_output_shape(tuple(shape))
                _keep(self._completed, (id(info), shape), (info, done))
                return done
        return info

    def first_input(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor | None:
        return _first_tensor(self._arg(self._input, args, kwargs))


@functools.cache
def collective_specs() -> dict[Any, CollectiveSpec]:
    """OpOverload -> spec for every collective this torch build has (missing ones skipped)."""
    specs: dict[Any, CollectiveSpec] = {}
    for name, normalised in _NORMALISED.items():
        namespace, op_name = name.split(".", 1)
        try:
            packet = getattr(getattr(torch.ops, namespace), op_name)
        except (AttributeError, RuntimeError):
            continue
        for overload_name in packet.overloads():
            overload = getattr(packet, overload_name)
            specs[overload] = CollectiveSpec(overload, name, normalised)
    return specs
