"""The tracing table and the JSON dump, rendered from finished spans only.

Nothing here knows which source or framework produced the spans: a table can be
rebuilt from spans read back from a file or a trace backend.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan

from hp_otel import schema as s
from hp_otel.records import CallRecord, build_call_tree, decode_tensor_infos, tensor_info_key

NOISE_LEVELS = (0, 1, 2, 3)
DEFAULT_NOISE_LEVEL = 1
EMPTY_TABLE = "(no operations recorded)"
_TYPE_COLUMN = 21
HEADER = "Type".ljust(_TYPE_COLUMN) + "Detail"
RULE = "-" * 80
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_UMASK = os.umask(0o022)  # read once (reading it means setting it), then put it back
os.umask(_UMASK)


def check_noise_level(noise_level: Any) -> int:
    """Return a valid noise level (None means the default) or raise ValueError naming the allowed ones."""
    if noise_level is None:
        return DEFAULT_NOISE_LEVEL
    if isinstance(noise_level, bool) or not isinstance(noise_level, int) or noise_level not in NOISE_LEVELS:
        raise ValueError(f"noise_level must be one of {', '.join(map(str, NOISE_LEVELS))} or None, got {noise_level!r}")
    return noise_level


def _structural(record: CallRecord, noise_level: int) -> bool:
    """Whether a record is a node of the tree at this level (counts for indentation)."""
    kind = record.kind
    if kind in (s.KIND_OP, s.KIND_COLLECTIVE):
        return True
    if kind == s.KIND_MODULE:
        return noise_level >= 3 or (noise_level == 2 and record.phase == s.PHASE_FORWARD)
    return noise_level >= 3  # redistribute


def _shown(record: CallRecord, noise_level: int) -> bool:
    if noise_level == 0:
        return record.kind == s.KIND_COLLECTIVE  # ops hidden, but they still indent their collectives
    return _structural(record, noise_level)


shown = _shown  # whether a record is a line of the table / a node of the JSON dump at a noise level


def visible(roots: Iterable[CallRecord], noise_level: int, depth: int = 0) -> Iterator[tuple[CallRecord, int]]:
    """(record, depth) in tree order for the lines of a table at this noise level."""
    for record in roots:
        if _structural(record, noise_level):
            if _shown(record, noise_level):
                yield record, depth
            yield from visible(record.children, noise_level, depth + 1)
        else:
            yield from visible(record.children, noise_level, depth)


def _shape(values: Iterable[int]) -> str:
    return repr(tuple(values))


_label_cache: dict[tuple[Any, ...], str] = {}


def _labels(attrs: Any, direction: str) -> str:
    """`DTensor[4, 16], DTensor[32, 16]` for an op's inputs or outputs (cached: steps repeat shapes)."""
    key = (direction, *tensor_info_key(attrs, direction))
    try:
        text = _label_cache.get(key)
    except TypeError:  # unhashable (list-valued) attributes
        return ", ".join(i.label() for i in decode_tensor_infos(attrs, direction))
    if text is None:
        if len(_label_cache) >= 4096:
            _label_cache.clear()
        text = _label_cache[key] = ", ".join(i.label() for i in decode_tensor_infos(attrs, direction))
    return text


def describe(record: CallRecord, noise_level: int) -> tuple[str, str]:
    """(type word, detail) of one table line."""
    a = record.attributes
    if record.kind == s.KIND_MODULE:
        event = "enter" if record.phase == s.PHASE_FORWARD else "backward"
        detail = f"Module({record.fqn}) [{event}]"
        kind = "Module"
    elif record.kind == s.KIND_OP:
        inputs = _labels(a, "input")
        outputs = _labels(a, "output")
        detail = f"Op({a.get(s.OP_NAME, record.name)}) inputs=[{inputs}] outputs=[{outputs}]"
        kind = "Op"
    elif record.kind == s.KIND_COLLECTIVE:
        detail = (
            f"Collective({a.get(s.COLLECTIVE_NAME, record.name)}) group_size={a.get(s.COLLECTIVE_GROUP_SIZE, 0)}"
            f" input_shape={_shape(a.get(s.COLLECTIVE_INPUT_SHAPE, ()))}"
            f" output_shape={_shape(a.get(s.COLLECTIVE_OUTPUT_SHAPE, ()))}"
        )
        if noise_level >= 3:
            detail += f" dtype={a.get(s.COLLECTIVE_DTYPE, '')} bytes={a.get(s.COLLECTIVE_BYTES, 0)}"
            if a.get(s.COLLECTIVE_REDUCE_OP):
                detail += f" reduce_op={a[s.COLLECTIVE_REDUCE_OP]}"
            detail += f" phase={record.phase}"
        kind = "Collective"
    else:
        src = a.get(s.REDISTRIBUTE_SRC_PLACEMENTS, "")
        dst = a.get(s.REDISTRIBUTE_DST_PLACEMENTS, "")
        detail = f"Redistribute({src} -> {dst}) shape={_shape(a.get(s.TENSOR_SHAPE, ()))}"
        kind = "Redistribute"
    if record.error:
        detail += f" [error: {record.error}]"
    return kind, detail


def render_table(spans: Iterable[ReadableSpan], noise_level: int) -> str:
    noise_level = check_noise_level(noise_level)
    roots = build_call_tree(spans)
    if not roots:
        return EMPTY_TABLE
    lines = [HEADER, RULE]
    for record, depth in visible(roots, noise_level):
        kind, detail = describe(record, noise_level)
        type_column = "  " * depth + kind
        lines.append(type_column.ljust(_TYPE_COLUMN - 1) + " " + detail)
    return "\n".join(lines)


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)


# --- JSON ---------------------------------------------------------------------


def record_to_json(record: CallRecord) -> dict[str, Any]:
    a = record.attributes
    out: dict[str, Any]
    if record.kind == s.KIND_MODULE:
        out = {
            "type": "module",
            "module_fqn": record.fqn,
            "module_type": a.get(s.MODULE_TYPE, ""),
            "event_type": "enter" if record.phase == s.PHASE_FORWARD else "backward",
        }
    elif record.kind == s.KIND_OP:
        out = {
            "type": "op",
            "op_name": a.get(s.OP_NAME, record.name),
            "inputs": [i.to_json() for i in record.inputs],
            "outputs": [o.to_json() for o in record.outputs],
        }
    elif record.kind == s.KIND_COLLECTIVE:
        out = {
            "type": "collective",
            "collective_type": a.get(s.COLLECTIVE_NAME, record.name),
            "op": a.get(s.COLLECTIVE_OP, ""),
            "group_size": a.get(s.COLLECTIVE_GROUP_SIZE, 0),
            "group": a.get(s.COLLECTIVE_GROUP, ""),
            "group_ranks": list(a.get(s.COLLECTIVE_GROUP_RANKS, ())),
            "input_shape": list(a.get(s.COLLECTIVE_INPUT_SHAPE, ())),
            "output_shape": list(a.get(s.COLLECTIVE_OUTPUT_SHAPE, ())),
            "dtype": a.get(s.COLLECTIVE_DTYPE, ""),
            "bytes": a.get(s.COLLECTIVE_BYTES, 0),
            "reduce_op": a.get(s.COLLECTIVE_REDUCE_OP, ""),
            "async": a.get(s.COLLECTIVE_ASYNC, False),
        }
    else:
        out = {
            "type": "redistribute",
            "src_placements": a.get(s.REDISTRIBUTE_SRC_PLACEMENTS, ""),
            "dst_placements": a.get(s.REDISTRIBUTE_DST_PLACEMENTS, ""),
            "tensor_shape": list(a.get(s.TENSOR_SHAPE, ())),
        }
    out["phase"] = record.phase
    out["duration_ns"] = max(record.end_ns - record.start_ns, 0)
    if record.error:
        out["error"] = record.error
    out["children"] = []
    return out


def records_to_json(roots: Iterable[CallRecord], noise_level: int) -> list[dict[str, Any]]:
    """The call tree as the design's nested records, keeping the nodes shown at this level."""
    out: list[dict[str, Any]] = []
    for record in roots:
        children = records_to_json(record.children, noise_level)
        if _shown(record, noise_level):
            node = record_to_json(record)
            node["children"] = children
            out.append(node)
        else:
            out.extend(children)
    return out


def sharding_info(roots: Iterable[CallRecord]) -> dict[str, str]:
    """`{"fc2.weight": "Shard(dim=1)"}` for DTensor parameters, from module span attributes."""
    return sharding_from_parameters(parameter_info(roots))


def sharding_from_parameters(parameters: dict[str, dict[str, dict[str, Any]]]) -> dict[str, str]:
    """`sharding_info` from an already computed `parameter_info` (one walk of the tree, not two)."""
    flat: dict[str, str] = {}
    for fqn, params in parameters.items():
        prefix = "" if fqn == s.ROOT_MODULE_FQN else fqn + "."
        for name, info in params.items():
            if info["placements"]:
                flat[prefix + name] = info["placements"]
    return flat


def parameter_info(roots: Iterable[CallRecord]) -> dict[str, dict[str, dict[str, Any]]]:
    """`{module fqn: {param name: {shape, dtype, placements}}}` from module span attributes."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for record in _module_records(roots):
        a = record.attributes
        names = a.get(s.MODULE_PARAM_NAMES, ())
        shapes = a.get(s.MODULE_PARAM_SHAPES, ())
        dtypes = a.get(s.MODULE_PARAM_DTYPES, ())
        placements = a.get(s.MODULE_PARAM_PLACEMENTS, ())
        params = out.setdefault(record.fqn, {})
        for i, name in enumerate(names):
            params[name] = {
                "shape": [int(x) for x in shapes[i].split(",")] if i < len(shapes) and shapes[i] else [],
                "dtype": dtypes[i] if i < len(dtypes) else "",
                "placements": placements[i] if i < len(placements) else "",
            }
    return {fqn: params for fqn, params in out.items() if params}


def _module_records(roots: Iterable[CallRecord]) -> Iterator[CallRecord]:
    for root in roots:
        for record in root.walk():
            if record.kind == s.KIND_MODULE and record.phase == s.PHASE_FORWARD:
                yield record


def build_json_dump(
    spans: Iterable[ReadableSpan],
    noise_level: int,
    comm_counts: Mapping[str, int],
    comm_module_counts: Mapping[str, Any],
    dropped_records: int,
) -> dict[str, Any]:
    roots = build_call_tree(spans)
    return {
        "comm_counts": dict(comm_counts),
        "total_counts": sum(comm_counts.values()),
        "comm_module_counts": comm_module_counts,
        "sharding_info": sharding_info(roots),
        "parameter_info": parameter_info(roots),
        "noise_level": noise_level,
        "dropped_records": dropped_records,
        "records": records_to_json(roots, noise_level),
    }


def write_text_atomically(path: str | os.PathLike[str], write: Any, argument: str = "path") -> None:
    """Write through a temporary file in the same folder, then rename: no partial file on failure.

    A path that cannot be written raises the OSError's own type, naming `argument`.
    """
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
        raise TypeError(f"{argument} must be a non-empty path (str or os.PathLike), got {path!r}")
    target = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(target))
    try:
        fd, tmp = tempfile.mkstemp(prefix=".hp_otel.", dir=folder)
    except OSError as exc:
        raise type(exc)(exc.errno, f"{argument}: cannot write {target!r} ({exc.strerror})") from exc
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            write(handle)
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; give the file the usual permissions
        try:
            os.replace(tmp, target)
        except OSError as exc:
            raise type(exc)(exc.errno, f"{argument}: cannot write {target!r} ({exc.strerror})") from exc
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_json(path: str | os.PathLike[str], payload: Any) -> None:
    write_text_atomically(path, lambda handle: json.dump(payload, handle, indent=2))


def count_collectives(spans: Iterable[ReadableSpan]) -> dict[str, int]:
    """Collective counts read back from spans (exact only while no span was dropped)."""
    counts: dict[str, int] = {}
    for span in spans:
        attrs = span.attributes or {}
        if attrs.get(s.CALL_KIND) == s.KIND_COLLECTIVE:
            name = str(attrs.get(s.COLLECTIVE_NAME, span.name))
            counts[name] = counts.get(name, 0) + 1
    return counts
