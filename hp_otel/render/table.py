"""The tracing table (the design's section 3.5 format), from the call tree.

Two spaces of indent per depth, the type word padded so that Detail starts at column
21 on every line, a header and an 80-dash rule.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from types import MappingProxyType
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan

from hp_otel.common.safe_text import printable
from hp_otel.render.levels import NoiseLevel, noise_level
from hp_otel.spans import codec, exposure, schema
from hp_otel.spans.bandwidth import format_rate
from hp_otel.spans.call_tree import CallRecord, build_call_tree

EMPTY_TABLE = "(no operations recorded)"
_TYPE_COLUMN = 21
HEADER = "Type".ljust(_TYPE_COLUMN) + "Detail"
RULE = "-" * 80


def visible(roots: Iterable[CallRecord], level: NoiseLevel, depth: int = 0) -> Iterator[tuple[CallRecord, int]]:
    """(record, depth) in tree order for the lines of a table at this noise level.

    Iterative: a tree read from a file may be deeper than Python's recursion limit.
    """
    stack: list[tuple[Iterator[CallRecord], int]] = [(iter(roots), depth)]
    while stack:
        records, at = stack[-1]
        record = next(records, None)
        if record is None:
            stack.pop()
            continue
        if level.is_node(record):
            if level.shows(record):
                yield record, at
            stack.append((iter(record.children), at + 1))
        else:
            stack.append((iter(record.children), at))


def _shape(values: Iterable[int]) -> str:
    return repr(tuple(values))


_label_cache: dict[tuple[Any, ...], str] = {}


def _labels(attrs: Any, direction: str) -> str:
    """`DTensor[4, 16], DTensor[32, 16]` for an op's inputs or outputs (cached: steps repeat shapes)."""
    key = (direction, *codec.tensor_info_key(attrs, direction))
    try:
        text = _label_cache.get(key)
    except TypeError:  # unhashable (list-valued) attributes
        return ", ".join(i.label() for i in codec.decode_tensor_infos(attrs, direction))
    if text is None:
        if len(_label_cache) >= 4096:
            _label_cache.clear()
        text = _label_cache[key] = ", ".join(i.label() for i in codec.decode_tensor_infos(attrs, direction))
    return text


# What a module line says after its name: [enter], [backward], [recompute].
_MODULE_EVENTS = MappingProxyType(
    {
        schema.PHASE_FORWARD: "enter",
        schema.PHASE_BACKWARD: "backward",
        schema.PHASE_RECOMPUTE: "recompute",
        schema.PHASE_OPTIMIZER: "optimizer",
    }
)


def describe(record: CallRecord, level: NoiseLevel) -> tuple[str, str]:
    """(type word, detail) of one table line."""
    if record.kind == schema.KIND_MODULE:
        event = _MODULE_EVENTS.get(record.phase, record.phase)
        kind, detail = "Module", f"Module({record.fqn}) [{event}]"
    elif record.kind == schema.KIND_OP:
        inputs = _labels(record.attributes, "input")
        outputs = _labels(record.attributes, "output")
        kind, detail = "Op", f"Op({record.op_name}) inputs=[{inputs}] outputs=[{outputs}]"
    elif record.kind == schema.KIND_COLLECTIVE:
        c = record.collective
        detail = (
            f"Collective({c.name}) group_size={c.group_size}"
            f" input_shape={_shape(c.input_shape)} output_shape={_shape(c.output_shape)}"
        )
        if level.collective_detail:
            detail += f" dtype={c.dtype} bytes={c.bytes}"
            if c.reduce_op:
                detail += f" reduce_op={c.reduce_op}"
            detail += f" phase={record.phase}"
            if c.peers:
                detail += f" peers={','.join(map(str, c.peers))} tags={','.join(map(str, c.tags))}"
            if c.param_module:
                detail += f" params_of={c.param_module}"
            detail += bandwidth_detail(record.attributes)
        kind = "Collective"
    else:
        src, dst, shape = codec.decode_redistribute(record.attributes)
        kind, detail = "Redistribute", f"Redistribute({src} -> {dst}) shape={_shape(shape)}"
    if record.error:
        detail += f" [error: {record.error}]"
    return kind, detail


_STACKED_KINDS = (schema.KIND_COLLECTIVE, schema.KIND_REDISTRIBUTE)


def _stack_lines(record: CallRecord) -> list[str]:
    """Where the call was issued (`stack=`): one line a frame under its line, innermost first."""
    pad = " " * _TYPE_COLUMN
    return [
        f"{pad}  {'at' if i == 0 else 'from'} {printable(frame)}"
        for i, frame in enumerate(codec.decode_call_stack(record.attributes))
    ]


def bandwidth_detail(attrs: Any) -> str:
    """` busbw=12.3 GB/s algbw=6.1 GB/s` when the span has a bandwidth (level 3), else ``."""
    busbw = attrs.get(schema.COLLECTIVE_BUSBW)
    algbw = attrs.get(schema.COLLECTIVE_ALGBW)
    if busbw is None or algbw is None:
        return ""
    return f" busbw={format_rate(float(busbw))} algbw={format_rate(float(algbw))}"


def render_table(spans: Iterable[ReadableSpan], level: int | NoiseLevel | None, dropped: int = 0) -> str:
    """The table; lines starting `!` after it say what it cannot show (spans the cap dropped, a damaged tree)."""
    flags = noise_level(level)
    problems: list[str] = []
    if flags.collective_detail:
        spans = list(spans)  # read twice: the tree, then the exposure footer
    roots = build_call_tree(spans, problems)
    if dropped:
        problems.insert(
            0,
            f"{dropped} span(s) were dropped by the max_spans cap and are not in this table "
            "(get_comm_counts() still counts every collective)",
        )
    notes = [f"! {printable(problem)}" for problem in problems]
    if not roots:
        return "\n".join([EMPTY_TABLE, *notes])
    lines = [HEADER, RULE]
    for record, depth in visible(roots, flags):
        kind, detail = describe(record, flags)
        type_column = "  " * depth + kind
        lines.append(type_column.ljust(_TYPE_COLUMN - 1) + " " + printable(detail))  # names: not for the terminal
        if flags.collective_detail and record.kind in _STACKED_KINDS:
            lines.extend(_stack_lines(record))
    if flags.collective_detail:
        lines.extend(printable(line) for line in exposure_footer(spans))
    lines.extend(notes)
    return "\n".join(lines)


def exposure_footer(spans: Iterable[ReadableSpan]) -> list[str]:
    """The footer at level 3: each window's communication time, exposed and overlapped (docs/overlap.md);
    for collectives on torch's fake process group, why it has no such figures."""
    spans = list(spans)
    reports = exposure.by_window(spans)
    lines: list[str] = []
    for window, report in reports.items():
        lines.extend(exposure.footer_lines(report, window if len(reports) > 1 else ""))
    fake = sum(1 for span in spans if (span.attributes or {}).get(schema.COLLECTIVE_BACKEND) == schema.BACKEND_FAKE)
    if fake:
        lines.append(exposure.FAKE_GROUP_NOTE.format(count=fake))
    return [RULE, *lines] if lines else []
