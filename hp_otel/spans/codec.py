"""The one place that turns typed infos into span attributes and span attributes back.

Span attribute values must be primitives or homogeneous arrays of them, so tensors
and parameters travel as parallel arrays (index i = tensor i); an op's shapes as one int
array of every tensor's dims with the dims per tensor beside it (the form of collective
spans' shapes), a module's parameter shapes as strings like `"4,16"`.
Everything that writes or reads those arrays goes through this module; the keys come
from `hp_otel.spans.schema`.  Renderers decode spans saved to a file or pulled from a backend
the same way, so they cache what repeats every step.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, NamedTuple

from hp_otel.common.input_files import checked_int
from hp_otel.spans import groups, schema
from hp_otel.spans.groups import Group
from hp_otel.spans.infos import CollectiveInfo, ModuleInfo, ParameterInfo, TensorInfo

# Attribute keys of op inputs / outputs: TensorInfo's fields in order, then the dims per shape.
_TENSOR_KEYS: Mapping[str, tuple[str, str, str, str, str, str, str]] = MappingProxyType(
    {
        "input": (
            schema.OP_INPUT_SHAPES,
            schema.OP_INPUT_DTYPES,
            schema.OP_INPUT_IS_DTENSOR,
            schema.OP_INPUT_PLACEMENTS,
            schema.OP_INPUT_MESH_SHAPES,
            schema.OP_INPUT_NDIMS,
            schema.OP_INPUT_MESH_NDIMS,
        ),
        "output": (
            schema.OP_OUTPUT_SHAPES,
            schema.OP_OUTPUT_DTYPES,
            schema.OP_OUTPUT_IS_DTENSOR,
            schema.OP_OUTPUT_PLACEMENTS,
            schema.OP_OUTPUT_MESH_SHAPES,
            schema.OP_OUTPUT_NDIMS,
            schema.OP_OUTPUT_MESH_NDIMS,
        ),
    }
)
PLACEMENT_SEPARATOR = ";"  # between mesh dims in one placements string


def shape_text(shape: Sequence[int]) -> str:
    """`(4, 16)` as `"4,16"` (a scalar is `""`)."""
    return ",".join(map(str, shape))


def shape_from_text(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",")) if text else ()


_placements_texts: dict[Any, str] = {}
_PLACEMENTS_CACHE_LIMIT = 1024


def placements_text(placements: Sequence[Any]) -> str:
    """Placements of all mesh dims as one string: `Shard(dim=0);Replicate()` (every engine's).

    Cached by the placements: they repeat every step (a redistribute, a parameter).
    """
    try:
        text = _placements_texts.get(placements)
    except TypeError:  # unhashable placements (a list, another framework's objects): format without the cache
        return _join_placements(placements)
    if text is None:
        if len(_placements_texts) >= _PLACEMENTS_CACHE_LIMIT:
            _placements_texts.clear()
        text = _placements_texts[placements] = _join_placements(placements)
    return text


def _join_placements(placements: Sequence[Any]) -> str:
    return PLACEMENT_SEPARATOR.join(p if isinstance(p, str) else repr(p) for p in placements)


# --- encode: infos -> span attributes -----------------------------------------


def encode_tensor_infos(infos: Sequence[TensorInfo], direction: str) -> dict[str, Any]:
    """Parallel attribute arrays for op inputs or outputs (`direction` is "input" or "output"), in one pass."""
    shapes: list[int] = []
    ranks: list[int] = []
    dtypes: list[str] = []
    dtensors: list[bool] = []
    placements: list[str] = []
    meshes: list[int] = []
    mesh_ranks: list[int] = []
    for info in infos:
        shape, mesh = info.shape, info.mesh_shape
        shapes += map(int, shape)
        ranks.append(len(shape))
        dtypes.append(info.dtype)
        dtensors.append(info.is_dtensor)
        placements.append(PLACEMENT_SEPARATOR.join(info.placements or ()))
        if mesh:
            meshes += map(int, mesh)
            mesh_ranks.append(len(mesh))
        else:
            mesh_ranks.append(0)
    keys = _TENSOR_KEYS[direction]
    return {
        keys[0]: tuple(shapes),
        keys[5]: tuple(ranks),
        keys[1]: tuple(dtypes),
        keys[2]: tuple(dtensors),
        keys[3]: tuple(placements),
        keys[4]: tuple(meshes),
        keys[6]: tuple(mesh_ranks),
    }


def encode_op(name: str, inputs: Sequence[TensorInfo], phase: str) -> dict[str, Any]:
    attrs = encode_tensor_infos(inputs, "input")
    attrs[schema.CALL_KIND] = schema.KIND_OP
    attrs[schema.OP_NAME] = name
    attrs[schema.PHASE] = phase
    return attrs


class SharedAttributes(dict):  # type: ignore[type-arg]
    """Span attributes encoded once and shared by every span that has them (a module's, an op's, a
    redistribute's): never written on (a span copies them first).  `split` is them as (keys, values)
    tuples, made once: what the local store keeps of a span."""

    __slots__ = ("split",)

    def __init__(self, attrs: dict[str, Any]) -> None:
        super().__init__(attrs)
        keys, values = self.split = (tuple(attrs), tuple(attrs.values()))
        _keep_encoded(_shared_by_values, _ENCODED_CACHE_LIMIT, id(values), (keys, values, self))


# Shared encodings by their split's values tuple (the entry holds it: the id stays its own), so a span
# kept as that split is read back with the encoding itself instead of a dict made again.
_shared_by_values: dict[int, tuple[tuple[str, ...], tuple[Any, ...], SharedAttributes]] = {}


def shared_attributes(keys: tuple[str, ...], values: tuple[Any, ...]) -> SharedAttributes | None:
    """The shared encoding whose split these tuples are (the same objects), if it is still known."""
    entry = _shared_by_values.get(id(values))
    return entry[2] if entry is not None and entry[0] is keys else None


_module_attrs: dict[tuple[Any, ...], tuple[Any, SharedAttributes]] = {}
_ENCODED_CACHE_LIMIT = 4096


def encoded_module(module: ModuleInfo, phase: str) -> SharedAttributes:
    """`encode_module`'s attributes, shared (never write on them): made once per module and phase for
    as long as its parameters stay the same objects (a window makes new ModuleInfos; the values repeat)."""
    parameters = module.parameters
    key = (module.fqn, module.span_name, module.module_type, id(parameters), phase)
    hit = _module_attrs.get(key)
    if hit is not None and hit[0] is parameters:
        return hit[1]
    attrs = SharedAttributes(encode_module(module, phase))
    _keep_encoded(_module_attrs, _ENCODED_CACHE_LIMIT, key, (parameters, attrs))
    return attrs


# An op span's attributes by its tensor infos' identity: the sources hand out cached TensorInfos
# (one per DTensor spec, or plain shape and dtype), so a step's ops repeat the same few objects.
# An entry holds its infos, so the ids in its key stay theirs (a source that makes new infos for
# every op only churns the bounded cache).
_op_attrs: dict[tuple[Any, ...], tuple[Any, SharedAttributes]] = {}
_CALL_CACHE_LIMIT = 1024  # ops' and redistributes' encodings, each


def encoded_op(name: str, inputs: Sequence[TensorInfo], phase: str) -> SharedAttributes:
    """`encode_op`'s attributes, shared (never write on them): made once per op, phase and input infos."""
    key = (name, phase, *map(id, inputs))
    hit = _op_attrs.get(key)
    if hit is not None:
        return hit[1]
    attrs = SharedAttributes(encode_op(name, inputs, phase))
    _keep_encoded(_op_attrs, _CALL_CACHE_LIMIT, key, (tuple(inputs), attrs))
    return attrs


def encoded_op_outputs(attrs: SharedAttributes, outputs: Sequence[TensorInfo]) -> SharedAttributes:
    """Shared op attributes (`encoded_op`'s) with its outputs' added: shared in turn, made once per pair."""
    key = (id(attrs), *map(id, outputs))
    hit = _op_attrs.get(key)
    if hit is not None:
        return hit[1]
    combined = SharedAttributes({**attrs, **encode_tensor_infos(outputs, "output")})
    _keep_encoded(_op_attrs, _CALL_CACHE_LIMIT, key, ((attrs, tuple(outputs)), combined))
    return combined


def _keep_encoded(cache: dict[tuple[Any, ...], Any], limit: int, key: tuple[Any, ...], entry: Any) -> None:
    """Store an encoding; a full cache starts again (what a run repeats now is found again)."""
    if len(cache) >= limit:
        cache.clear()
    cache[key] = entry


def encode_module(module: ModuleInfo, phase: str) -> dict[str, Any]:
    """A module span's attributes; its own parameters go on the forward span only."""
    attrs: dict[str, Any] = {
        schema.CALL_KIND: schema.KIND_MODULE,
        schema.MODULE_FQN: module.fqn,
        schema.MODULE_TYPE: module.module_type,
        schema.PHASE: phase,
    }
    params = module.parameters
    if params and phase == schema.PHASE_FORWARD:
        attrs[schema.MODULE_PARAM_NAMES] = tuple(p.name for p in params)
        attrs[schema.MODULE_PARAM_SHAPES] = tuple(shape_text(p.shape) for p in params)
        attrs[schema.MODULE_PARAM_DTYPES] = tuple(p.dtype for p in params)
        attrs[schema.MODULE_PARAM_PLACEMENTS] = tuple(p.placements for p in params)
    return attrs


def encode_collective(info: CollectiveInfo) -> dict[str, Any]:
    """A collective span's attributes, without the phase (the recorder knows it, not the source)."""
    attrs = {
        schema.CALL_KIND: schema.KIND_COLLECTIVE,
        schema.COLLECTIVE_NAME: info.name,
        schema.COLLECTIVE_OP: info.op,
        schema.COLLECTIVE_GROUP_SIZE: info.group_size,
        schema.COLLECTIVE_GROUP_ID: group_of(info).id,  # name and members: once per group (group_of(info))
        schema.COLLECTIVE_INPUT_SHAPE: info.input_shape,
        schema.COLLECTIVE_OUTPUT_SHAPE: info.output_shape,
        schema.COLLECTIVE_DTYPE: info.dtype,
        schema.COLLECTIVE_BYTES: info.bytes,
        schema.COLLECTIVE_REDUCE_OP: info.reduce_op,
        schema.COLLECTIVE_ASYNC: info.is_async,
    }
    if info.backend:
        attrs[schema.COLLECTIVE_BACKEND] = info.backend
    if info.param_module:
        attrs[schema.COLLECTIVE_PARAM_MODULE] = info.param_module
    if info.peers:
        attrs[schema.COLLECTIVE_PEERS] = info.peers
        attrs[schema.COLLECTIVE_TAGS] = info.tags
    if info.input_split_sizes or info.output_split_sizes:
        attrs[schema.COLLECTIVE_INPUT_SPLIT_SIZES] = info.input_split_sizes
        attrs[schema.COLLECTIVE_OUTPUT_SPLIT_SIZES] = info.output_split_sizes
    return attrs


def group_of(info: CollectiveInfo) -> Group:
    """The group a collective ran on, with its id: what `Group.attributes()` describes once per window."""
    return groups.group(info.group, info.group_ranks, info.mesh_dim)


def encode_collective_place(attrs: Mapping[str, Any], phase: str, fqn: str) -> dict[str, Any]:
    """A collective's encoded attributes plus where it was issued (phase, innermost module)."""
    return {**attrs, schema.PHASE: phase, schema.COLLECTIVE_MODULE: fqn}


def encode_collective_match(seq: int, window: str, match_id: str) -> dict[str, Any]:
    """What identifies one collective across ranks: its sequence number in the window, and the shared id."""
    return {schema.COLLECTIVE_SEQ: seq, schema.COLLECTIVE_WINDOW: window, schema.COLLECTIVE_MATCH_ID: match_id}


def _no_module(path: str) -> str | None:
    return None


def encode_call_stack(
    attrs: dict[str, Any], stack: Sequence[str], module_of: Callable[[str], str | None] = _no_module
) -> None:
    """Add the user's frames (innermost first) and the innermost one as OTel's code attributes,
    the function fully qualified with the module `module_of(file)` names (semconv 1.33+)."""
    if not stack:
        return
    attrs[schema.CALL_STACK] = tuple(stack)
    path, line, function = split_frame(stack[0])
    attrs[schema.CODE_FILE_PATH] = path
    attrs[schema.CODE_LINE_NUMBER] = line
    module = module_of(path)
    attrs[schema.CODE_FUNCTION_NAME] = f"{module}.{function}" if module and function else function


def split_frame(text: str) -> tuple[str, int, str]:
    """`"a/b.py:12:Model.forward"` as (file, line, function); the file may hold ':' (a Windows drive)."""
    rest, _, function = text.rpartition(":")
    path, _, line = rest.rpartition(":")
    if not line.isdigit():  # not "file:line:function": keep it whole as the path
        return text, 0, ""
    return path, int(line), function


def decode_call_stack(attrs: Mapping[str, Any]) -> tuple[str, ...]:
    """The user's frames issuing the call, innermost first (empty when not recorded)."""
    stack = attrs.get(schema.CALL_STACK)
    if not stack or isinstance(stack, str):
        return (str(stack),) if stack else ()
    return tuple(str(frame) for frame in stack)


def encode_redistribute(src_placements: str, dst_placements: str, shape: tuple[int, ...], phase: str) -> dict[str, Any]:
    return {
        schema.CALL_KIND: schema.KIND_REDISTRIBUTE,
        schema.REDISTRIBUTE_SRC_PLACEMENTS: src_placements,
        schema.REDISTRIBUTE_DST_PLACEMENTS: dst_placements,
        schema.TENSOR_SHAPE: shape,
        schema.PHASE: phase,
    }


_redistribute_attrs: dict[tuple[Any, ...], SharedAttributes] = {}


def encoded_redistribute(
    src_placements: str, dst_placements: str, shape: tuple[int, ...], phase: str
) -> dict[str, Any]:
    """`encode_redistribute`'s attributes, shared (never write on them) unless the shape does not hash
    (symbolic): a step repeats the same few redistributes."""
    key = (src_placements, dst_placements, shape, phase)
    try:
        attrs = _redistribute_attrs.get(key)
    except TypeError:
        return encode_redistribute(src_placements, dst_placements, shape, phase)
    if attrs is None:
        attrs = SharedAttributes(encode_redistribute(src_placements, dst_placements, shape, phase))
        _keep_encoded(_redistribute_attrs, _CALL_CACHE_LIMIT, key, attrs)
    return attrs


# --- decode: span attributes -> infos -----------------------------------------

# Decoded infos by their attribute arrays: a step repeats the same few shapes, so a long
# window decodes each once (rendering 100 000 spans is dominated by this otherwise).
_decoded: dict[tuple[Any, ...], tuple[TensorInfo, ...]] = {}
_DECODED_LIMIT = 4096


def tensor_info_key(attrs: Mapping[str, Any], direction: str) -> tuple[Any, ...]:
    """The attribute arrays that describe an op's inputs or outputs (hashable: a cache key)."""
    get = attrs.get
    k = _TENSOR_KEYS[direction]
    return (
        get(k[0], ()),
        get(k[1], ()),
        get(k[2], ()),
        get(k[3], ()),
        get(k[4], ()),
        get(k[5]),
        get(k[6]),
    )


def decode_tensor_infos(attrs: Mapping[str, Any], direction: str) -> list[TensorInfo]:
    key = tensor_info_key(attrs, direction)
    try:
        infos = _decoded.get(key)
    except TypeError:  # list-valued attributes (spans made elsewhere): nothing to cache by
        return _decode_tensor_infos(*key)
    if infos is None:
        if len(_decoded) >= _DECODED_LIMIT:
            _decoded.clear()
        infos = _decoded[key] = tuple(_decode_tensor_infos(*key))
    return list(infos)


def _split_dims(flat: Sequence[Any], ndims: Sequence[Any]) -> list[tuple[int, ...]]:
    """(4, 16, 32) with ndims (2, 1) -> [(4, 16), (32,)]."""
    out, at = [], 0
    for n in ndims:
        out.append(tuple(int(d) for d in flat[at : at + int(n)]))
        at += int(n)
    return out


def _per_tensor(values: Sequence[Any], ndims: Sequence[Any] | None) -> list[tuple[int, ...]]:
    """One shape per tensor from the int form (with its ndims) or an older file's "4,16" strings."""
    if ndims is None:
        return [shape_from_text(str(v)) for v in values]
    return _split_dims(values, ndims)


def _decode_tensor_infos(
    flat_shapes: Sequence[Any],
    dtypes: Sequence[str],
    is_dt: Sequence[bool],
    placements: Sequence[str],
    flat_meshes: Sequence[Any],
    ndims: Sequence[int] | None = None,
    mesh_ndims: Sequence[int] | None = None,
) -> list[TensorInfo]:
    shapes = _per_tensor(flat_shapes, ndims)
    meshes = _per_tensor(flat_meshes, mesh_ndims if ndims is not None else None)
    out = []
    for i, shape in enumerate(shapes):
        dtensor = bool(is_dt[i]) if i < len(is_dt) else False
        out.append(
            TensorInfo(
                shape=shape,
                dtype=dtypes[i] if i < len(dtypes) else "",
                is_dtensor=dtensor,
                placements=tuple(placements[i].split(PLACEMENT_SEPARATOR))
                if dtensor and i < len(placements) and placements[i]
                else None,
                mesh_shape=meshes[i] if dtensor and i < len(meshes) else None,
            )
        )
    return out


def decode_parameters(attrs: Mapping[str, Any]) -> list[ParameterInfo]:
    """A module span's own parameters (empty when it has none, or on a backward span)."""
    names = attrs.get(schema.MODULE_PARAM_NAMES, ())
    shapes = attrs.get(schema.MODULE_PARAM_SHAPES, ())
    dtypes = attrs.get(schema.MODULE_PARAM_DTYPES, ())
    placements = attrs.get(schema.MODULE_PARAM_PLACEMENTS, ())
    return [
        ParameterInfo(
            name=name,
            shape=shape_from_text(shapes[i]) if i < len(shapes) else (),
            dtype=dtypes[i] if i < len(dtypes) else "",
            placements=placements[i] if i < len(placements) else "",
        )
        for i, name in enumerate(names)
    ]


def decode_collective(
    attrs: Mapping[str, Any], span_name: str = "", table: groups.GroupTable | None = None
) -> CollectiveInfo:
    """A collective span's attributes as the source reported them (missing ones as defaults); its
    group from `table` (the groups its file or trace describes; None: only what the span itself says)."""
    get = attrs.get
    group = (table or groups.GroupTable()).group_of(attrs)
    return CollectiveInfo(
        name=str(get(schema.COLLECTIVE_NAME, span_name)),
        op=str(get(schema.COLLECTIVE_OP, "")),
        group_size=checked_int(get(schema.COLLECTIVE_GROUP_SIZE, 0), schema.COLLECTIVE_GROUP_SIZE),
        group=group.name,
        group_ranks=group.members,
        mesh_dim=group.mesh_dim,
        input_shape=tuple(get(schema.COLLECTIVE_INPUT_SHAPE, ())),
        output_shape=tuple(get(schema.COLLECTIVE_OUTPUT_SHAPE, ())),
        dtype=str(get(schema.COLLECTIVE_DTYPE, "")),
        bytes=checked_int(get(schema.COLLECTIVE_BYTES, 0), schema.COLLECTIVE_BYTES),
        reduce_op=str(get(schema.COLLECTIVE_REDUCE_OP, "")),
        is_async=bool(get(schema.COLLECTIVE_ASYNC, False)),
        param_module=str(get(schema.COLLECTIVE_PARAM_MODULE, "")),
        peers=tuple(get(schema.COLLECTIVE_PEERS, ())),
        tags=tuple(get(schema.COLLECTIVE_TAGS, ())),
        backend=str(get(schema.COLLECTIVE_BACKEND, "")),
        input_split_sizes=tuple(get(schema.COLLECTIVE_INPUT_SPLIT_SIZES, ())),
        output_split_sizes=tuple(get(schema.COLLECTIVE_OUTPUT_SPLIT_SIZES, ())),
    )


@dataclass(frozen=True)
class CollectiveMatch:
    """A collective span's cross-rank identity, decoded (seq -1: recorded without one)."""

    seq: int
    window: str
    module: str
    match_id: str
    in_flight: bool


def decode_collective_match(attrs: Mapping[str, Any]) -> CollectiveMatch:
    get = attrs.get
    return CollectiveMatch(
        seq=checked_int(get(schema.COLLECTIVE_SEQ, -1), schema.COLLECTIVE_SEQ),
        window=str(get(schema.COLLECTIVE_WINDOW, "")),
        module=str(get(schema.COLLECTIVE_MODULE, "")),
        match_id=str(get(schema.COLLECTIVE_MATCH_ID, "")),
        in_flight=bool(get(schema.COLLECTIVE_IN_FLIGHT, False)),
    )


def decode_redistribute(attrs: Mapping[str, Any]) -> tuple[str, str, tuple[int, ...]]:
    """(source placements, destination placements, global shape) of a redistribute span."""
    return (
        str(attrs.get(schema.REDISTRIBUTE_SRC_PLACEMENTS, "")),
        str(attrs.get(schema.REDISTRIBUTE_DST_PLACEMENTS, "")),
        tuple(attrs.get(schema.TENSOR_SHAPE, ())),
    )


class MetricKey(NamedTuple):
    """One series of the collective metrics: the attribute values, by name (see `metric_attributes`).

    Bounded cardinality only (no shapes, no ranks).  A tuple: the recorder's totals are
    keyed by it, so the hot path hashes it as it would any tuple.
    """

    collective_name: str
    collective_op: str
    backend: str  # "" when the source could not tell: the attribute is dropped
    group_size: int
    dtype: str
    phase: str
    module_fqn: str | None  # None: the attribute is dropped (metric_module_depth "none")
    error_type: str  # "" when the call succeeded

    @classmethod
    def of(cls, info: CollectiveInfo, phase: str, fqn: str | None, error: BaseException | None = None) -> MetricKey:
        """The one place a key is made: a collective's series, in `phase` inside module `fqn`."""
        return cls(
            info.name,
            info.op,
            info.backend,
            info.group_size,
            info.dtype,
            phase,
            fqn,
            "" if error is None else error_type(error),
        )


def metric_attributes(key: MetricKey) -> dict[str, Any]:
    """A series' metric attributes (`schema.METRIC_ATTRIBUTE_KEYS`), with `error.type` only for failed calls."""
    attrs: dict[str, Any] = {
        schema.COLLECTIVE_NAME: key.collective_name,
        schema.COLLECTIVE_OP: key.collective_op,
        **({schema.COLLECTIVE_BACKEND: key.backend} if key.backend else {}),
        schema.COLLECTIVE_GROUP_SIZE: key.group_size,
        schema.COLLECTIVE_DTYPE: key.dtype,
        schema.PHASE: key.phase,
    }
    if key.module_fqn is not None:
        attrs[schema.MODULE_FQN] = key.module_fqn
    if key.error_type:
        attrs[schema.ERROR_TYPE] = key.error_type
    return attrs


def error_type(error: BaseException) -> str:
    """`error.type` as OTel's conventions define it: the exception's fully qualified class name."""
    cls = type(error)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
