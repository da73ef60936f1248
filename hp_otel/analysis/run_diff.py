"""Two runs side by side (`hp-otel diff A B`, communication snapshots): what a change did to communication.

A run is summarised per rank as cells keyed by (module, phase, normalised op), each with
its count and bytes (the inputs' bytes, `hp_otel.collective.input.size`); the module is the
innermost module open when the collective was issued (`hp_otel.collective.module`, as
`hp-otel ranks` names it). A run is read from a spans file or JSON dump (one process), a
folder of per-rank files, a snapshot (`hp_otel.testing.assert_comm_snapshot`), or a
mode's own spans. Two summaries compared give the cells that appeared, vanished or
changed, rank by rank (a change every compared rank shows is said once), then totals.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from hp_otel.analysis.reading import RankCall, RankFile, RankInputError, calls_from_spans, read_rank_file
from hp_otel.common.input_files import InputFileError, checked_int, read_json
from hp_otel.spans import schema

SNAPSHOT_FORMAT = "hp_otel.comm_snapshot"
SNAPSHOT_VERSION = 1
_PHASE_ORDER = MappingProxyType({schema.PHASE_FORWARD: 0, schema.PHASE_BACKWARD: 1, schema.PHASE_RECOMPUTE: 2})
_TOLERANCE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(%?)\s*$")


class DiffInputError(ValueError):
    """A run `hp-otel diff` cannot read (missing, not hp_otel's, ranks twice, a folder without files)."""


@dataclass(frozen=True, order=True)
class CellKey:
    """Where collectives were issued: module (innermost open), phase, normalised op."""

    module: str
    phase: str
    op: str

    def sort_key(self) -> tuple[str, int, str, str]:
        return (self.module, _PHASE_ORDER.get(self.phase, len(_PHASE_ORDER)), self.phase, self.op)

    def where(self) -> str:
        return f"{self.module or schema.OUTSIDE_FQN} {self.phase}"


@dataclass
class Cell:
    count: int = 0
    bytes: int = 0


@dataclass
class RunSummary:
    """One run: per rank (None: one process, rank not compared), its cells; where it was read from."""

    source: str
    ranks: dict[int | None, dict[CellKey, Cell]] = field(default_factory=dict)
    windows: dict[int | None, set[str]] = field(default_factory=dict)  # per rank, the windows its calls count in
    unsequenced: int = 0  # collective spans without a seq (older files): not counted

    def total(self) -> Cell:
        out = Cell()
        for cells in self.ranks.values():
            for cell in cells.values():
                out.count += cell.count
                out.bytes += cell.bytes
        return out

    def by_op(self) -> dict[str, Cell]:
        out: dict[str, Cell] = {}
        for cells in self.ranks.values():
            for key, cell in cells.items():
                total = out.setdefault(key.op, Cell())
                total.count += cell.count
                total.bytes += cell.bytes
        return out

    def window_count(self) -> int:
        """The most windows one rank recorded (0: none known, e.g. a snapshot)."""
        return max((len(w) for w in self.windows.values()), default=0)

    def describe(self) -> str:
        ranks = [r for r in self.ranks if r is not None]
        who = f"{len(ranks)} ranks" if len(ranks) > 1 else (f"rank {ranks[0]}" if ranks else "1 process")
        count = self.window_count()
        windows = f", {_plural(count, 'window')}" if count else ""
        return f"{self.source} ({who}{windows})"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _add_calls(cells: dict[CellKey, Cell], calls: Iterable[RankCall]) -> set[str]:
    windows: set[str] = set()
    for call in calls:
        cell = cells.setdefault(CellKey(call.module, call.phase, call.op), Cell())
        cell.count += 1
        cell.bytes += call.bytes
        windows.add(call.window)
    return windows


def summarize_spans(spans: Iterable[Any], source: str = "spans") -> RunSummary:
    """A summary of finished spans (a CommDebugMode's `get_finished_spans()`), as one process."""
    try:
        calls, unsequenced = calls_from_spans(spans, 0, source)
    except RankInputError as exc:
        raise DiffInputError(str(exc)) from exc
    cells: dict[CellKey, Cell] = {}
    windows = _add_calls(cells, calls)
    return RunSummary(source, {None: cells}, {None: windows}, unsequenced)


# --- snapshots: the summary as stable, sorted JSON ------------------------------------------


def snapshot_json(summary: RunSummary) -> dict[str, Any]:
    """One process's summary as a snapshot: cells sorted by module, phase (forward first), op."""
    if len(summary.ranks) > 1:
        raise ValueError(f"a snapshot holds one process's collectives; {summary.source} holds {len(summary.ranks)}")
    cells = next(iter(summary.ranks.values()), {})
    total = summary.total()
    return {
        "format": SNAPSHOT_FORMAT,
        "version": SNAPSHOT_VERSION,
        "collectives": [
            {"module": key.module, "phase": key.phase, "op": key.op, "count": cell.count, "bytes": cell.bytes}
            for key, cell in sorted(cells.items(), key=lambda item: item[0].sort_key())
        ],
        "total": {"count": total.count, "bytes": total.bytes},
    }


def snapshot_text(summary: RunSummary) -> str:
    """The snapshot file's text: one cell a line, so a review diff shows one line per changed cell."""
    data = snapshot_json(summary)
    rows = ",\n".join("    " + json.dumps(row, sort_keys=False) for row in data["collectives"])
    return (
        "{\n"
        f'  "format": {json.dumps(data["format"])},\n'
        f'  "version": {data["version"]},\n'
        '  "collectives": [' + (f"\n{rows}\n  " if rows else "") + "],\n"
        f'  "total": {json.dumps(data["total"])}\n'
        "}\n"
    )


def _is_snapshot(payload: Any) -> bool:
    return isinstance(payload, dict) and payload.get("format") == SNAPSHOT_FORMAT


def summary_from_snapshot(payload: Mapping[str, Any], source: str) -> RunSummary:
    if payload.get("version") != SNAPSHOT_VERSION:
        raise DiffInputError(
            f"{source}: snapshot version {payload.get('version')!r}; this hp_otel reads {SNAPSHOT_VERSION}"
        )
    cells: dict[CellKey, Cell] = {}
    try:
        for row in payload["collectives"]:
            key = CellKey(str(row["module"]), str(row["phase"]), str(row["op"]))
            count, size = checked_int(row["count"], "count"), checked_int(row["bytes"], "bytes")
            if count < 0 or size < 0 or key in cells:
                raise ValueError(f"row {row!r}: negative, or its (module, phase, op) listed twice")
            cells[key] = Cell(count, size)
    except (KeyError, TypeError, ValueError) as exc:
        raise DiffInputError(f"{source}: not a snapshot hp_otel wrote ({type(exc).__name__}: {exc})") from exc
    return RunSummary(source, {None: cells})


# --- reading a run --------------------------------------------------------------------------


def read_run(path: str | os.PathLike[str]) -> RunSummary:
    """A run from a file (spans, JSON dump, snapshot: one process) or a folder of per-rank files (*.json)."""
    name = os.fspath(path)
    if os.path.isdir(name):
        return _read_folder(name)
    if not os.path.exists(name):
        raise DiffInputError(f"{name}: no such file or folder")
    try:
        payload = read_json(name, "spans file")  # read once, within the size limit, by the bounded reader
    except InputFileError as exc:
        raise DiffInputError(str(exc)) from None
    if _is_snapshot(payload):
        return summary_from_snapshot(payload, name)
    try:
        rank_file = read_rank_file(name, default_rank=0, payload=payload)
    except RankInputError as exc:
        raise DiffInputError(str(exc)) from exc
    cells: dict[CellKey, Cell] = {}
    windows = _add_calls(cells, rank_file.calls)
    return RunSummary(name, {None: cells}, {None: windows}, rank_file.unsequenced)


def _read_folder(folder: str) -> RunSummary:
    """Every .json file a rank's; a rank with both a spans file and a JSON dump (what `hp-otel demo`
    writes) is read from its spans file, which holds the same collectives and more."""
    files = sorted(os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(".json"))
    if not files:
        raise DiffInputError(f"{folder}: a folder with no per-rank .json files")
    chosen: dict[int, tuple[str, bool, RankFile]] = {}  # rank -> (path, a JSON dump?, its collectives)
    for path in files:
        try:
            payload = read_json(path, "spans file")
            rank_file = read_rank_file(path, payload=payload)
        except (InputFileError, RankInputError) as exc:
            raise DiffInputError(f"{exc} (in folder {folder}: every .json file there is read as one rank's)") from exc
        dump = _is_dump(payload)
        seen = chosen.get(rank_file.rank)
        if seen is not None and seen[1] == dump:
            raise DiffInputError(
                f"{folder}: rank {rank_file.rank} twice ({os.path.basename(seen[0])} and "
                f"{os.path.basename(path)}); keep one file per rank (or one spans file and one JSON dump)"
            )
        if seen is None or seen[1]:  # the first file of this rank, or a spans file after its dump
            chosen[rank_file.rank] = (path, dump, rank_file)
    summary = RunSummary(folder)
    for rank, (_, _, rank_file) in sorted(chosen.items()):
        summary.windows[rank] = _add_calls(summary.ranks.setdefault(rank, {}), rank_file.calls)
        summary.unsequenced += rank_file.unsequenced
    return summary


def _is_dump(payload: Any) -> bool:
    """A JSON dump (`generate_json_dump`), as `read_rank_file` tells it from a spans file."""
    return isinstance(payload, dict) and "records" in payload and "resourceSpans" not in payload


# --- comparing ------------------------------------------------------------------------------


@dataclass(frozen=True)
class BytesTolerance:
    """How far bytes may move before a cell counts as changed: absolute bytes, or a fraction of before."""

    absolute: int = 0
    fraction: float = 0.0

    def allows(self, before: int, after: int) -> bool:
        return abs(after - before) <= max(self.absolute, self.fraction * before)

    def text(self) -> str:
        return f"{self.fraction * 100:g}%" if self.fraction else f"{self.absolute} B"


def parse_bytes_tolerance(text: str) -> BytesTolerance:
    """`1024` (bytes) or `5%` (of the bytes before) -> a BytesTolerance; ValueError names what is allowed."""
    found = _TOLERANCE.match(str(text))
    if not found:
        raise ValueError(f"bytes tolerance must be a number of bytes (4096) or a percentage (5%), got {text!r}")
    number, percent = found.groups()
    if percent:
        return BytesTolerance(fraction=float(number) / 100)
    if float(number) != int(float(number)):
        raise ValueError(f"bytes tolerance in bytes must be a whole number, got {text!r}")
    return BytesTolerance(absolute=int(float(number)))


@dataclass(frozen=True)
class CellChange:
    """One (module, phase, op) whose count or bytes differ, on `ranks` (None: one process each)."""

    key: CellKey
    ranks: tuple[int | None, ...]
    before: Cell
    after: Cell

    @property
    def status(self) -> str:
        if self.before.count == 0:
            return "appeared"
        if self.after.count == 0:
            return "vanished"
        return "changed"


@dataclass
class RunDiff:
    a: RunSummary
    b: RunSummary
    tolerance: BytesTolerance
    changes: list[CellChange]
    ranks_only_in_a: list[int]
    ranks_only_in_b: list[int]

    @property
    def same(self) -> bool:
        return not self.changes and not self.ranks_only_in_a and not self.ranks_only_in_b


def _pairs(a: RunSummary, b: RunSummary) -> list[tuple[int | None, dict[CellKey, Cell], dict[CellKey, Cell]]]:
    if None in a.ranks or None in b.ranks:  # one process on a side: compared with the other's only rank
        if len(a.ranks) > 1 or len(b.ranks) > 1:
            many = a if len(a.ranks) > 1 else b
            raise DiffInputError(
                f"cannot compare one process's file with {many.source}, which holds {len(many.ranks)} ranks; "
                "give two files, or two folders of per-rank files"
            )
        return [(None, next(iter(a.ranks.values()), {}), next(iter(b.ranks.values()), {}))]
    return [(r, a.ranks.get(r, {}), b.ranks.get(r, {})) for r in sorted(set(a.ranks) | set(b.ranks))]  # type: ignore[type-var]


def diff_runs(a: RunSummary, b: RunSummary, tolerance: BytesTolerance | None = None) -> RunDiff:
    """The cells whose count differs, or whose bytes differ beyond `tolerance`, rank by rank.

    A change identical on several ranks is one `CellChange` naming them all; a rank present
    in one run only has all of its cells appear (or vanish).
    """
    tolerance = tolerance or BytesTolerance()
    grouped: dict[tuple[CellKey, int, int, int, int], list[int | None]] = {}
    for rank, before, after in _pairs(a, b):
        for key in set(before) | set(after):
            x, y = before.get(key, Cell()), after.get(key, Cell())
            if x.count != y.count or not tolerance.allows(x.bytes, y.bytes):
                grouped.setdefault((key, x.count, x.bytes, y.count, y.bytes), []).append(rank)
    changes = [
        CellChange(key, tuple(ranks), Cell(ca, ba), Cell(cb, bb)) for (key, ca, ba, cb, bb), ranks in grouped.items()
    ]
    changes.sort(key=lambda c: (c.key.sort_key(), [r if r is not None else -1 for r in c.ranks]))
    ranks_a = {r for r in a.ranks if r is not None}
    ranks_b = {r for r in b.ranks if r is not None}
    return RunDiff(a, b, tolerance, changes, sorted(ranks_a - ranks_b), sorted(ranks_b - ranks_a))


def diff_paths(
    a: str | os.PathLike[str], b: str | os.PathLike[str], tolerance: BytesTolerance | None = None
) -> RunDiff:
    return diff_runs(read_run(a), read_run(b), tolerance)


# --- text and JSON --------------------------------------------------------------------------


def format_bytes(n: int) -> str:
    """1023 B, 4.0 KiB, 4.0 MiB: binary units, one decimal."""
    size = float(abs(n))
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            text = f"{int(size)} {unit}" if unit == "B" else f"{size:.1f} {unit}"
            return ("-" if n < 0 else "") + text
        size /= 1024
    raise AssertionError("unreachable")


def _signed_bytes(n: int) -> str:
    return ("+" if n >= 0 else "-") + format_bytes(abs(n))


def _ranks_text(ranks: Sequence[int | None], compared: int) -> str:
    if ranks == (None,) or (compared > 1 and len(ranks) == compared):
        return ""
    named = [str(r) for r in ranks]
    return f"rank {named[0]}: " if len(named) == 1 else f"ranks {','.join(named)}: "


def format_change(change: CellChange, compared_ranks: int = 1) -> str:
    """`layers.3.attention backward: +1 all_gather (4.0 MiB)`, or before → after when both ran it."""
    prefix = _ranks_text(change.ranks, compared_ranks) + change.key.where() + ": "
    op, x, y = change.key.op, change.before, change.after
    if change.status == "appeared":
        return f"{prefix}+{y.count} {op} ({format_bytes(y.bytes)})"
    if change.status == "vanished":
        return f"{prefix}-{x.count} {op} ({format_bytes(x.bytes)})"
    delta = y.count - x.count
    counts = f"{op} {x.count} → {y.count}" + (f" ({delta:+d})" if delta else "")
    return f"{prefix}{counts}, {format_bytes(x.bytes)} → {format_bytes(y.bytes)} ({_signed_bytes(y.bytes - x.bytes)})"


def _compared_ranks(diff: RunDiff) -> int:
    return len({r for r in diff.a.ranks} | {r for r in diff.b.ranks})


def format_diff(diff: RunDiff) -> str:
    """The report: what changed where (one line a cell), ranks in one run only, then the totals."""
    compared = _compared_ranks(diff)
    lines = [f"A: {diff.a.describe()}", f"B: {diff.b.describe()}"]
    if compared > 1:
        lines.append(f"per rank; a line without ranks holds on all {compared}")
    wa, wb = diff.a.window_count(), diff.b.window_count()
    if wa and wb and wa != wb:
        lines.append(f"note: A has {_plural(wa, 'window')} a rank, B {wb}: counts add up over windows")
    for side, count in (("A", diff.a.unsequenced), ("B", diff.b.unsequenced)):
        if count:
            lines.append(f"note: {side} has {count} collective span(s) without a seq (an older hp_otel): not counted")
    for rank in diff.ranks_only_in_a:
        lines.append(f"rank {rank}: only in A")
    for rank in diff.ranks_only_in_b:
        lines.append(f"rank {rank}: only in B")
    if diff.same:
        tolerance = f" (bytes within {diff.tolerance.text()})" if diff.tolerance != BytesTolerance() else ""
        lines.append(f"same communication{tolerance}")
    else:
        lines.append("")
        lines.extend(format_change(change, compared) for change in diff.changes)
    lines.append("")
    lines.extend(_totals_lines(diff))
    return "\n".join(lines)


def _totals_lines(diff: RunDiff) -> list[str]:
    ta, tb = diff.a.total(), diff.b.total()
    scope = f" (all {_compared_ranks(diff)} ranks)" if _compared_ranks(diff) > 1 else ""
    lines = [
        f"total{scope}: {ta.count} → {tb.count} collectives ({tb.count - ta.count:+d}), "
        f"{format_bytes(ta.bytes)} → {format_bytes(tb.bytes)} ({_signed_bytes(tb.bytes - ta.bytes)})"
    ]
    oa, ob = diff.a.by_op(), diff.b.by_op()
    for op in sorted(set(oa) | set(ob)):
        x, y = oa.get(op, Cell()), ob.get(op, Cell())
        mark = "" if (x.count, x.bytes) != (y.count, y.bytes) else "  (same)"
        lines.append(f"  {op}: {x.count} → {y.count}, {format_bytes(x.bytes)} → {format_bytes(y.bytes)}{mark}")
    return lines


def _cell_json(cell: Cell) -> dict[str, int]:
    return {"count": cell.count, "bytes": cell.bytes}


def diff_to_json(diff: RunDiff) -> dict[str, Any]:
    """The report as JSON: `same`, the changes (ranks null: one process each), totals per side and by op."""

    def side(summary: RunSummary) -> dict[str, Any]:
        return {
            "source": summary.source,
            "ranks": sorted(r for r in summary.ranks if r is not None),
            "windows": summary.window_count(),
            "unsequenced": summary.unsequenced,
            "total": _cell_json(summary.total()),
            "by_op": {op: _cell_json(cell) for op, cell in sorted(summary.by_op().items())},
        }

    return {
        "same": diff.same,
        "bytes_tolerance": {"bytes": diff.tolerance.absolute, "fraction": diff.tolerance.fraction},
        "a": side(diff.a),
        "b": side(diff.b),
        "ranks_only_in_a": diff.ranks_only_in_a,
        "ranks_only_in_b": diff.ranks_only_in_b,
        "changes": [
            {
                "module": c.key.module or schema.OUTSIDE_FQN,
                "phase": c.key.phase,
                "op": c.key.op,
                "status": c.status,
                "ranks": None if c.ranks == (None,) else list(c.ranks),
                "before": _cell_json(c.before),
                "after": _cell_json(c.after),
            }
            for c in diff.changes
        ],
    }
