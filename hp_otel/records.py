"""Call records: what sources report, and typed views over finished spans.

Sources describe tensors and collectives with the small dataclasses below and know
nothing about OpenTelemetry.  The recorder encodes them into span attributes
(`encode_*`); the renderers decode spans back into `CallRecord` trees
(`build_call_tree`), reading nothing but span attributes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import StatusCode

from hp_otel import schema as s


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
class CollectiveInfo:
    """One collective call as a source saw it."""

    name: str  # the framework's own name, e.g. "_c10d_functional.all_reduce"
    op: str  # normalised, one of schema.NORMALISED_OPS
    group_size: int
    group: str = ""
    group_ranks: tuple[int, ...] = ()
    input_shape: tuple[int, ...] = ()
    output_shape: tuple[int, ...] = ()
    dtype: str = ""
    bytes: int = 0
    reduce_op: str = ""
    is_async: bool = False


# --- encoding into span attributes -------------------------------------------


def _shape_str(shape: Sequence[int]) -> str:
    return ",".join(map(str, shape))


def _shape_from_str(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",")) if text else ()


def encode_tensor_infos(infos: Sequence[TensorInfo], direction: str) -> dict[str, Any]:
    """Parallel attribute arrays for op inputs or outputs (`direction` is input|output)."""
    if direction == "input":
        keys = (
            s.OP_INPUT_SHAPES,
            s.OP_INPUT_DTYPES,
            s.OP_INPUT_IS_DTENSOR,
            s.OP_INPUT_PLACEMENTS,
            s.OP_INPUT_MESH_SHAPES,
        )
    else:
        keys = (
            s.OP_OUTPUT_SHAPES,
            s.OP_OUTPUT_DTYPES,
            s.OP_OUTPUT_IS_DTENSOR,
            s.OP_OUTPUT_PLACEMENTS,
            s.OP_OUTPUT_MESH_SHAPES,
        )
    return {
        keys[0]: tuple(_shape_str(i.shape) for i in infos),
        keys[1]: tuple(i.dtype for i in infos),
        keys[2]: tuple(i.is_dtensor for i in infos),
        keys[3]: tuple(";".join(i.placements or ()) for i in infos),
        keys[4]: tuple(_shape_str(i.mesh_shape or ()) for i in infos),
    }


_INFO_KEYS = {
    direction: tuple(
        f"hp.op.{direction}_{field}" for field in ("shapes", "dtypes", "is_dtensor", "placements", "mesh_shapes")
    )
    for direction in ("input", "output")
}
# Decoded infos by their attribute arrays: a step repeats the same few shapes, so a long
# window decodes each once (rendering 100 000 spans is dominated by this otherwise).
_decoded: dict[tuple[Any, ...], tuple[TensorInfo, ...]] = {}
_DECODED_LIMIT = 4096


def tensor_info_key(attrs: Mapping[str, Any], direction: str) -> tuple[Any, ...]:
    """The attribute arrays that describe an op's inputs or outputs (hashable: a cache key)."""
    get = attrs.get
    k = _INFO_KEYS[direction]
    return (get(k[0], ()), get(k[1], ()), get(k[2], ()), get(k[3], ()), get(k[4], ()))


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


def _decode_tensor_infos(
    shapes: Sequence[str],
    dtypes: Sequence[str],
    is_dt: Sequence[bool],
    placements: Sequence[str],
    meshes: Sequence[str],
) -> list[TensorInfo]:
    out = []
    for i, shape in enumerate(shapes):
        dtensor = bool(is_dt[i]) if i < len(is_dt) else False
        out.append(
            TensorInfo(
                shape=_shape_from_str(shape),
                dtype=dtypes[i] if i < len(dtypes) else "",
                is_dtensor=dtensor,
                placements=tuple(placements[i].split(";"))
                if dtensor and i < len(placements) and placements[i]
                else None,
                mesh_shape=_shape_from_str(meshes[i]) if dtensor and i < len(meshes) else None,
            )
        )
    return out


def encode_parameters(
    names: Sequence[str], shapes: Sequence[str], dtypes: Sequence[str], placements: Sequence[str]
) -> dict[str, Any]:
    """A module's own parameters as parallel span attribute arrays (empty: no attributes)."""
    if not names:
        return {}
    return {
        s.MODULE_PARAM_NAMES: tuple(names),
        s.MODULE_PARAM_SHAPES: tuple(shapes),
        s.MODULE_PARAM_DTYPES: tuple(dtypes),
        s.MODULE_PARAM_PLACEMENTS: tuple(placements),
    }


def encode_collective(info: CollectiveInfo) -> dict[str, Any]:
    return {
        s.CALL_KIND: s.KIND_COLLECTIVE,
        s.COLLECTIVE_NAME: info.name,
        s.COLLECTIVE_OP: info.op,
        s.COLLECTIVE_GROUP_SIZE: info.group_size,
        s.COLLECTIVE_GROUP: info.group,
        s.COLLECTIVE_GROUP_RANKS: info.group_ranks,
        s.COLLECTIVE_INPUT_SHAPE: info.input_shape,
        s.COLLECTIVE_OUTPUT_SHAPE: info.output_shape,
        s.COLLECTIVE_DTYPE: info.dtype,
        s.COLLECTIVE_BYTES: info.bytes,
        s.COLLECTIVE_REDUCE_OP: info.reduce_op,
        s.COLLECTIVE_ASYNC: info.is_async,
    }


# --- typed views over finished spans ----------------------------------------


@dataclass(slots=True)
class CallRecord:
    """One node of the call tree, read back from a finished span."""

    kind: str
    name: str
    attributes: Mapping[str, Any]
    start_ns: int
    end_ns: int
    error: str | None = None
    children: list[CallRecord] = field(default_factory=list)

    @property
    def phase(self) -> str:
        return str(self.attributes.get(s.PHASE, s.PHASE_FORWARD))

    @property
    def fqn(self) -> str:
        return str(self.attributes.get(s.MODULE_FQN, ""))

    @property
    def inputs(self) -> list[TensorInfo]:
        return decode_tensor_infos(self.attributes, "input")

    @property
    def outputs(self) -> list[TensorInfo]:
        return decode_tensor_infos(self.attributes, "output")

    def walk(self) -> Iterable[CallRecord]:
        yield self
        for child in self.children:
            yield from child.walk()


def span_attributes(span: ReadableSpan) -> Mapping[str, Any]:
    """The span's attributes as a plain dict where the SDK keeps one (read-only use).

    `span.attributes` wraps them in a new mapping proxy over a lock-guarded mapping on
    every access; reading 100 000 spans that way costs more than rendering them.
    """
    raw = getattr(span, "_attributes", None)
    inner = getattr(raw, "_dict", None)  # the SDK's BoundedAttributes
    if isinstance(inner, dict):
        return inner
    if isinstance(raw, dict):  # a ReadableSpan built from a file
        return raw
    return span.attributes or {}


def _record_from_span(span: ReadableSpan, attrs: Mapping[str, Any]) -> CallRecord:
    status = span.status
    error = (status.description or "error") if status is not None and status.status_code is StatusCode.ERROR else None
    return CallRecord(
        kind=str(attrs.get(s.CALL_KIND, "")),
        name=span.name,
        attributes=attrs,
        start_ns=span.start_time or 0,
        end_ns=span.end_time or 0,
        error=error,
    )


def build_call_tree(spans: Iterable[ReadableSpan]) -> list[CallRecord]:
    """Rebuild the call tree from spans in any order (exporters deliver children first).

    Spans that are not hp_otel calls are skipped; a span whose parent is missing (not
    hp_otel's, dropped by the retention cap, or never exported) becomes a root.
    Siblings are ordered by start time.
    """
    nodes: dict[int, CallRecord] = {}
    links: list[tuple[CallRecord, int | None]] = []
    kinds = s.CALL_KINDS
    for span in spans:
        attrs = span_attributes(span)
        context = span.context
        if attrs.get(s.CALL_KIND) not in kinds or context is None:
            continue
        record = nodes[context.span_id] = _record_from_span(span, attrs)
        parent = span.parent
        links.append((record, parent.span_id if parent is not None else None))
    roots: list[CallRecord] = []
    get = nodes.get
    for record, parent_id in links:
        parent = get(parent_id) if parent_id is not None else None
        (parent.children if parent is not None and parent is not record else roots).append(record)
    key = _start_time  # stable sort keeps export order on ties
    for node in nodes.values():
        if len(node.children) > 1:
            node.children.sort(key=key)
    roots.sort(key=key)
    return roots


def _start_time(record: CallRecord) -> int:
    return record.start_ns
