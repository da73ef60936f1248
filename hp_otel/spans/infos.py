"""What sources report: typed descriptions of tensors, collectives and modules.

Sources build these from framework objects and hand them to the observer; they know
nothing about OpenTelemetry.  `hp_otel.spans.codec` turns them into span attributes and back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hp_otel.common.rank_set import RankSet
from hp_otel.spans import schema


@dataclass(frozen=True)
class TensorInfo:
    """A snapshot of one tensor's metadata (the design's TensorInfo)."""

    shape: tuple[int, ...]
    dtype: str
    is_dtensor: bool = False
    placements: tuple[str, ...] | None = None  # DTensor only, one per mesh dim
    mesh_shape: tuple[int, ...] | None = None  # DTensor only

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"shape": list(self.shape), "dtype": self.dtype, "is_dtensor": self.is_dtensor}
        if self.is_dtensor:
            out["placements"] = list(self.placements or ())
            out["mesh_shape"] = list(self.mesh_shape or ())
        return out

    def label(self) -> str:
        """`DTensor[4, 16]` or `Tensor[4, 16]`, as the table shows it."""
        kind = "DTensor" if self.is_dtensor else "Tensor"
        return f"{kind}[{', '.join(map(str, self.shape))}]"


@dataclass(frozen=True)
class OpInfo:
    """One op call as the user's `op_hook` sees it (made only when one is set)."""

    name: str  # e.g. "aten.mm.default"
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...] = ()  # () when the op raised or the window ended first


@dataclass(frozen=True)
class GroupDetails:
    """A collective's process group as a source resolved it (size, name, global ranks, backend)."""

    size: int
    name: str
    ranks: RankSet  # given as any ints, kept as a RankSet: hashed and compared per call in O(1)
    backend: str = ""  # the communication library: "nccl", "gloo", "hccl", "mccl", "fake", ... ("" unknown)
    mesh_dim: str = ""  # a DeviceMesh dimension's group: its name ("tp", "dp_shard"); "" otherwise

    def __post_init__(self) -> None:
        object.__setattr__(self, "ranks", RankSet.of(self.ranks))


NO_GROUP = GroupDetails(0, "", ())  # a call without a group argument the source could read


@dataclass(frozen=True)
class CollectiveInfo:
    """One collective call as a source saw it."""

    name: str  # the framework's own name, e.g. "_c10d_functional.all_reduce"
    op: str  # normalised, one of schema.NORMALISED_OPS
    group_size: int
    group: str = ""
    group_ranks: tuple[int, ...] | RankSet = ()  # sources give the group's RankSet (hashed per call in O(1))
    input_shape: tuple[int, ...] = ()
    output_shape: tuple[int, ...] = ()
    dtype: str = ""
    bytes: int = 0
    reduce_op: str = ""
    is_async: bool = False
    param_module: str = ""  # FSDP: the module whose parameters it gathers or reduces
    peers: tuple[int, ...] = ()  # point-to-point: the peer's global rank (one per op of a batch)
    tags: tuple[int, ...] = ()  # point-to-point: the tag (one per op of a batch)
    backend: str = ""  # the group's communication library ("nccl", "gloo", "hccl", "mccl", "fake"; "" unknown)
    mesh_dim: str = ""  # the group's DeviceMesh dimension ("tp"), "" when not a mesh's
    # all_to_all with split sizes (elements per peer along dim 0), at most schema.SPLIT_SIZES_MAX each
    input_split_sizes: tuple[int, ...] = ()
    output_split_sizes: tuple[int, ...] = ()

    @property
    def fake_group(self) -> bool:
        """On torch's fake process group: it returns at once, so no duration, bandwidth or overlap means anything."""
        return self.backend == schema.BACKEND_FAKE

    def with_output_shape(self, shape: tuple[int, ...]) -> CollectiveInfo:
        """This info with the output shape the op returned: its fields copied as they are, where
        `dataclasses.replace` walks every field and runs `__init__` again (nothing to re-check here;
        a traced window's gathers and scatters pay it at every call: docs/how-it-works/costs.md)."""
        copy = object.__new__(type(self))
        fields = copy.__dict__  # a frozen dataclass blocks setattr, not its instance dict
        fields.update(self.__dict__)
        fields["output_shape"] = shape
        return copy


@dataclass(frozen=True)
class ParameterInfo:
    """One parameter a module owns itself (not its children's)."""

    name: str  # "weight"
    shape: tuple[int, ...]
    dtype: str
    placements: str = ""  # "Shard(dim=0)" for a DTensor parameter (mesh dims joined by ";"), "" otherwise


@dataclass(frozen=True, eq=False)
class ModuleInfo:
    """A tracked module (torch `nn.Module`, MindSpore `Cell`), made once when tracking starts.

    Compared by identity: a source makes one per module, so span attribute encodings
    can be cached per object.
    """

    fqn: str  # "fc1"; the root is schema.ROOT_MODULE_FQN
    span_name: str  # the fqn, or the root's class name
    module_type: str  # the class's qualified name
    parameters: tuple[ParameterInfo, ...] = ()


class ModuleCall:
    """One forward call of a module (a module run twice in a window has two calls).

    Backward work is attributed to the call whose forward created the autograd node
    that runs it; `chain` is the calls enclosing this one when it ran, outermost
    first, itself last — the modules a backward collective counts for.
    """

    __slots__ = ("chain", "module")

    def __init__(self, module: ModuleInfo, parent: ModuleCall | None = None) -> None:
        self.module = module
        self.chain: tuple[ModuleCall, ...] = (*parent.chain, self) if parent is not None else (self,)

    def __repr__(self) -> str:
        return f"ModuleCall({'/'.join(c.module.fqn for c in self.chain)})"
