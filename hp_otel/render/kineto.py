"""What Kineto (torch.profiler's trace writer) puts on a collective, so Kineto readers read ours.

torch.profiler's trace of an NCCL run carries, on each collective's `record_param_comms` event and
kernel, the args torch's `saveNcclMeta` writes (torch/csrc/profiler/util.cpp): `Collective name`,
`In msg nelems`, `Out msg nelems`, `Group size`, `dtype` (c10's ScalarType name: `Float`),
`In split size` / `Out split size` and `Process Group Ranks` (lists as text, `"[0, 1]"`, cut to 30
entries as `"[0, 1, ..., 63]"`), `Process Group Name` (the group's name, `"0"`) and `Process Group
Description` (`"mesh_tp"`); and the file a `distributedInfo` (rank, world size, backend, and each
group's name, description and ranks).  Holistic Trace Analysis reads one such file per rank.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from math import prod
from types import MappingProxyType
from typing import Any

from hp_otel.spans import schema
from hp_otel.spans.groups import Group, GroupTable

TRUNCATE = 30  # torch's kTruncateLength: a list over this many entries is cut
# torch's names for the call on its ProcessGroup (what ProcessGroupNCCL records), by normalised op
_COLLECTIVE_NAMES = MappingProxyType(
    {
        "all_reduce": "allreduce",
        "all_gather": "all_gather",
        "reduce_scatter": "reduce_scatter",
        "all_to_all": "all_to_all",
        "broadcast": "broadcast",
        "barrier": "barrier",
        "send": "send",
        "recv": "recv",
        "p2p": "batch_isend_irecv",
        "gather": "gather",
        "scatter": "scatter",
        "reduce": "reduce",
    }
)
# "torch.float32" -> c10::toString(ScalarType)
_SCALAR_TYPES = MappingProxyType(
    {
        "float32": "Float",
        "float64": "Double",
        "float16": "Half",
        "bfloat16": "BFloat16",
        "int64": "Long",
        "int32": "Int",
        "int16": "Short",
        "int8": "Char",
        "uint8": "Byte",
        "bool": "Bool",
        "complex64": "ComplexFloat",
        "complex128": "ComplexDouble",
        "float8_e4m3fn": "Float8_e4m3fn",
        "float8_e5m2": "Float8_e5m2",
    }
)


def format_list(values: Sequence[Any]) -> str:
    """A list as torch.profiler writes one: `"[0, 1]"`, over 30 entries the first 29, `...` and the last."""
    items = [str(v) for v in values]
    if len(items) > TRUNCATE:
        items = [*items[: TRUNCATE - 1], "...", items[-1]]
    return f"[{', '.join(items)}]"


def scalar_type(dtype: str) -> str:
    """hp_otel's dtype (`torch.float32`, MindSpore's `Float32`) as c10 names it (`Float`); unknown ones as given."""
    short = dtype.rsplit(".", 1)[-1]
    return _SCALAR_TYPES.get(short.lower(), short)


def _nelems(shape: Any) -> int:
    """Elements of a tensor of this shape (0 when the span has none)."""
    return prod(int(d) for d in shape) if isinstance(shape, (tuple, list)) else 0


def group_desc(group: Group) -> str:
    """torch's `group_desc` of a group: `mesh_<dim>` for a DeviceMesh dimension's group, "" otherwise."""
    return f"mesh_{group.mesh_dim}" if group.mesh_dim else ""


def _ranks_text(group: Group) -> str:
    """The members as torch.profiler lists them, without walking a large group: 29 firsts, `...`, the last."""
    members = group.members
    n = len(members)
    if n <= TRUNCATE:
        return format_list(list(members))
    return f"[{', '.join(str(members[i]) for i in range(TRUNCATE - 1))}, ..., {members[n - 1]}]"


def collective_args(attrs: Mapping[str, Any], group: Group) -> dict[str, Any]:
    """Kineto's args for a collective span's attributes and its group (those it cannot tell are left out)."""
    op = str(attrs.get(schema.COLLECTIVE_OP, ""))
    splits_in = attrs.get(schema.COLLECTIVE_INPUT_SPLIT_SIZES) or ()
    splits_out = attrs.get(schema.COLLECTIVE_OUTPUT_SPLIT_SIZES) or ()
    name = _COLLECTIVE_NAMES.get(op, op)
    if op == "all_to_all" and (splits_in or splits_out):
        name = "all_to_allv"  # torch's name for all_to_all_single with split sizes
    args: dict[str, Any] = {
        "Collective name": name,
        "In msg nelems": _nelems(attrs.get(schema.COLLECTIVE_INPUT_SHAPE)),
        "Out msg nelems": _nelems(attrs.get(schema.COLLECTIVE_OUTPUT_SHAPE)),
        "Group size": int(attrs.get(schema.COLLECTIVE_GROUP_SIZE, 0) or 0),
        "dtype": scalar_type(str(attrs.get(schema.COLLECTIVE_DTYPE, ""))),
        "In split size": format_list(splits_in),
        "Out split size": format_list(splits_out),
    }
    if group.name:
        args["Process Group Name"] = group.name
    desc = group_desc(group)
    if desc:
        args["Process Group Description"] = desc
    if group.members:
        args["Process Group Ranks"] = _ranks_text(group)
    return args


def distributed_info(rank: int, world_size: int, collectives: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The file's `distributedInfo`: this rank, the world, and each group its collectives ran on (first seen)."""
    groups: dict[str, dict[str, Any]] = {}
    backends: list[str] = []
    table = GroupTable.of(collectives)
    for attrs in collectives:
        backend = str(attrs.get(schema.COLLECTIVE_BACKEND, ""))
        if backend and backend not in backends:
            backends.append(backend)
        group = table.group_of(attrs)
        if group.name and group.name not in groups:
            groups[group.name] = {
                "pg_name": group.name,
                "pg_desc": group_desc(group),
                "backend_config": backend,
                "pg_size": int(attrs.get(schema.COLLECTIVE_GROUP_SIZE, 0) or 0),
                "ranks": list(group.members),
            }
    return {
        "backend": ",".join(backends),
        "rank": rank,
        "world_size": world_size,
        "pg_count": len(groups),
        "pg_config": list(groups.values()),
    }
