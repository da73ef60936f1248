"""Putting the ranks side by side: the first divergence, the hang suspect, the stragglers.

Each rank's spans file (`CommDebugMode.write_spans`, or what the hang watchdog wrote)
holds its collectives with `hp.collective.seq`: their order on each process group within
a window.  Ranks of one group must issue the same collectives in the same order; this
module lines them up by (window, group, seq) and reports

- the first divergence of each group: the first seq where ranks issued different
  collectives (op, shapes, dtype, reduce op);
- ranks that never reached a collective others issued (the hang suspect: the others
  wait for it in that collective);
- for collectives every rank reached, the arrival skew (last issue − first issue) and
  which rank was last: the straggler table.

It works on any engine's spans; the clocks of ranks on different hosts differ by their
offset, which the skew includes.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hp_otel import codec
from hp_otel import schema as s
from hp_otel.call_tree import span_attributes
from hp_otel.otlp_json import SpanFileError, read_trace_file

# Ops whose shapes legitimately differ between ranks (uneven splits, point to point).
_SHAPE_FREE_OPS = frozenset({"all_to_all", "send", "recv", "gather", "scatter"})
_P2P_OPS = frozenset({"send", "recv"})
_RANK_IN_NAME = re.compile(r"rank[_-]?(\d+)", re.IGNORECASE)


class RankInputError(ValueError):
    """A file `hp-otel ranks` cannot compare (missing, not spans, no rank, two files of one rank)."""


@dataclass(frozen=True)
class RankCall:
    """One collective as one rank issued it."""

    rank: int
    window: str
    group: str
    group_ranks: tuple[int, ...]
    seq: int
    op: str
    name: str
    input_shape: tuple[int, ...]
    output_shape: tuple[int, ...]
    dtype: str
    reduce_op: str
    module: str
    phase: str
    start_ns: int
    end_ns: int
    in_flight: bool

    def signature(self) -> tuple[Any, ...]:
        """What must be equal on every rank of the group."""
        op = "send/recv" if self.op in _P2P_OPS else self.op
        if self.op in _SHAPE_FREE_OPS:
            return (op, self.dtype, self.reduce_op)
        return (op, self.input_shape, self.output_shape, self.dtype, self.reduce_op)

    def where(self) -> str:
        return f"Module({self.module})" if self.module else "no module"

    def describe(self) -> str:
        shapes = f"input {_shape(self.input_shape)} output {_shape(self.output_shape)}"
        reduce = f" {self.reduce_op}" if self.reduce_op else ""
        state = " (in flight)" if self.in_flight else ""
        return f"{self.op} {shapes} {self.dtype}{reduce} in {self.where()} [{self.phase}]{state}"

    def to_json(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "seq": self.seq,
            "op": self.op,
            "name": self.name,
            "input_shape": list(self.input_shape),
            "output_shape": list(self.output_shape),
            "dtype": self.dtype,
            "reduce_op": self.reduce_op,
            "module": self.module,
            "phase": self.phase,
            "start_ns": self.start_ns,
            "in_flight": self.in_flight,
        }


def _shape(shape: Sequence[int]) -> str:
    return "(" + ", ".join(map(str, shape)) + ")"


@dataclass
class RankFile:
    path: str
    rank: int
    calls: list[RankCall]
    unsequenced: int = 0  # collective spans without a seq (written by an older hp_otel)


# --- reading --------------------------------------------------------------------------


def _rank_of(path: str, resources: Sequence[Mapping[str, Any]]) -> int:
    ranks = {int(r[s.RESOURCE_RANK]) for r in resources if r.get(s.RESOURCE_RANK) is not None}
    if len(ranks) > 1:
        raise RankInputError(f"{path}: spans of several ranks {sorted(ranks)} in one file; give one file per rank")
    if ranks:
        return ranks.pop()
    found = _RANK_IN_NAME.search(os.path.basename(path))
    if found:
        return int(found.group(1))
    raise RankInputError(f"{path}: names no rank (no {s.RESOURCE_RANK} resource attribute, no 'rank<N>' in its name)")


def read_rank_file(path: str | os.PathLike[str]) -> RankFile:
    """One rank's collectives from its spans file (OTLP/JSON) or its JSON dump (`generate_json_dump`)."""
    text_path = os.fspath(path)
    dump = _json_dump(text_path)
    if dump is not None:
        return _read_dump(text_path, dump)
    try:
        spans, resources = read_trace_file(text_path)
    except SpanFileError as exc:
        raise RankInputError(str(exc)) from exc
    try:
        rank = _rank_of(text_path, resources)
    except (TypeError, ValueError) as exc:
        if isinstance(exc, RankInputError):
            raise
        raise RankInputError(f"{text_path}: its {s.RESOURCE_RANK} is not a rank ({exc})") from exc
    calls: list[RankCall] = []
    unsequenced = 0
    for span in spans:
        attrs = span_attributes(span)
        if attrs.get(s.CALL_KIND) != s.KIND_COLLECTIVE:
            continue
        try:
            call = _call_from_span(rank, span, attrs)
        except (TypeError, ValueError) as exc:  # attributes hp_otel did not write
            raise RankInputError(f"{text_path}: collective span {span.name!r} is malformed ({exc})") from exc
        if call is None:
            unsequenced += 1
        else:
            calls.append(call)
    return RankFile(text_path, rank, calls, unsequenced)


def _call_from_span(rank: int, span: Any, attrs: Mapping[str, Any]) -> RankCall | None:
    match = codec.decode_collective_match(attrs)
    if match.seq < 0:
        return None
    info = codec.decode_collective(attrs, span.name)
    return RankCall(
        rank=rank,
        window=match.window,
        group=info.group,
        group_ranks=tuple(int(r) for r in info.group_ranks),
        seq=match.seq,
        op=info.op or info.name,
        name=info.name,
        input_shape=tuple(int(d) for d in info.input_shape),
        output_shape=tuple(int(d) for d in info.output_shape),
        dtype=info.dtype,
        reduce_op=info.reduce_op,
        module=match.module,
        phase=str(attrs.get(s.PHASE, "")),
        start_ns=span.start_time or 0,
        end_ns=span.end_time or 0,
        in_flight=match.in_flight,
    )


def _json_dump(path: str) -> dict[str, Any] | None:
    """The file as a JSON dump (a dict with "records"), or None for anything else (read as spans)."""
    try:
        with open(path, encoding="utf-8") as handle:
            payload = json.load(handle)
    except (OSError, UnicodeDecodeError, ValueError):
        return None  # the spans reader says what is wrong
    return payload if isinstance(payload, dict) and "records" in payload and "resourceSpans" not in payload else None


def _read_dump(path: str, dump: dict[str, Any]) -> RankFile:
    """A JSON dump names no rank: it comes from the file name (`comm_rank1.json`)."""
    found = _RANK_IN_NAME.search(os.path.basename(path))
    if not found:
        raise RankInputError(f"{path}: a JSON dump names no rank; name the file with 'rank<N>' (comm_rank0.json)")
    rank = int(found.group(1))
    calls: list[RankCall] = []
    unsequenced = 0
    stack = list(dump.get("records") or [])
    try:
        while stack:
            node = stack.pop()
            stack.extend(node.get("children") or [])
            if node.get("type") != "collective":
                continue
            if "seq" not in node:
                unsequenced += 1
                continue
            start = int(node["start_ns"])
            calls.append(
                RankCall(
                    rank=rank,
                    window=str(node.get("window", "")),
                    group=str(node.get("group", "")),
                    group_ranks=tuple(int(r) for r in node.get("group_ranks", ())),
                    seq=int(node["seq"]),
                    op=str(node.get("op") or node.get("collective_type", "")),
                    name=str(node.get("collective_type", "")),
                    input_shape=tuple(int(d) for d in node.get("input_shape", ())),
                    output_shape=tuple(int(d) for d in node.get("output_shape", ())),
                    dtype=str(node.get("dtype", "")),
                    reduce_op=str(node.get("reduce_op", "")),
                    module=str(node.get("issued_in_module", "")),
                    phase=str(node.get("phase", "")),
                    start_ns=start,
                    end_ns=start + int(node.get("duration_ns", 0)),
                    in_flight=False,
                )
            )
    except (AttributeError, TypeError, ValueError, KeyError) as exc:
        raise RankInputError(f"{path}: not a JSON dump hp_otel wrote ({type(exc).__name__}: {exc})") from exc
    return RankFile(path, rank, calls, unsequenced)


# --- comparing ------------------------------------------------------------------------


@dataclass
class Divergence:
    seq: int
    calls: dict[int, RankCall]  # rank -> what it issued at this seq


@dataclass
class Missing:
    """`rank` never reached collective `seq`, which `issued_by` issued (`reference` is one of theirs)."""

    rank: int
    seq: int
    reference: RankCall
    issued_by: list[int]
    in_flight_on: list[int]  # of those, the ranks still waiting in it when their file was written


@dataclass
class Skew:
    seq: int
    op: str
    module: str
    skew_ns: int
    last_rank: int


@dataclass
class GroupReport:
    window: str
    group: str
    group_ranks: tuple[int, ...]
    ranks: list[int]  # the ranks compared (files given for them)
    compared: int = 0  # seqs every rank reached
    divergence: Divergence | None = None
    missing: list[Missing] = field(default_factory=list)
    stuck_together: list[int] = field(default_factory=list)  # seqs in flight on every rank
    skews: list[Skew] = field(default_factory=list)
    absent_ranks: list[int] = field(default_factory=list)  # group members without a file

    @property
    def agree(self) -> bool:
        return self.divergence is None and not self.missing

    def title(self) -> str:
        ranks = ",".join(map(str, self.group_ranks or self.ranks))
        return f"group {self.group or '?'} (ranks {ranks}), {self.window or 'no window'}"


@dataclass
class StragglerRow:
    rank: int
    last: int  # collectives where it issued last
    compared: int
    total_skew_ns: int  # what the others waited for it, summed over the collectives it was last in
    mean_skew_ns: float
    max_skew_ns: int


@dataclass
class RanksReport:
    files: list[RankFile]
    groups: list[GroupReport]
    stragglers: list[StragglerRow]
    notes: list[str] = field(default_factory=list)

    @property
    def agree(self) -> bool:
        return all(g.agree for g in self.groups)

    @property
    def ranks(self) -> list[int]:
        return sorted(f.rank for f in self.files)


def compare_files(paths: Iterable[str | os.PathLike[str]]) -> RanksReport:
    files = [read_rank_file(p) for p in paths]
    if not files:
        raise RankInputError("give at least one spans file")
    seen: dict[int, str] = {}
    for f in files:
        if f.rank in seen:
            raise RankInputError(f"{seen[f.rank]} and {f.path} are both rank {f.rank}; give one file per rank")
        seen[f.rank] = f.path
    return compare(files)


def compare(files: Sequence[RankFile]) -> RanksReport:
    """Line the ranks' collectives up by (window, group, seq) and report where they part."""
    file_ranks = sorted(f.rank for f in files)
    files, notes = _align_windows(files)
    by_group: dict[tuple[str, str, tuple[int, ...]], dict[int, dict[int, RankCall]]] = {}
    for f in files:
        for call in sorted(f.calls, key=lambda c: c.seq):
            per_rank = by_group.setdefault((call.window, call.group, call.group_ranks), {})
            calls = per_rank.setdefault(f.rank, {})
            if call.seq not in calls or call.in_flight:  # a returned op whose work is pending: in flight
                calls[call.seq] = call
    groups = [
        _compare_group(window, group, group_ranks, per_rank, file_ranks)
        for (window, group, group_ranks), per_rank in sorted(by_group.items(), key=lambda kv: _window_order(kv[0]))
    ]
    return RanksReport(list(files), groups, _stragglers(groups, file_ranks), notes)


def _align_windows(files: Sequence[RankFile]) -> tuple[list[RankFile], list[str]]:
    """Windows are matched by label (`step 3`, `window 0`); when the files' labels differ (ranks
    opened a different number of windows before), by their order in each file instead."""
    order = [_windows_in_order(f) for f in files]
    if len({tuple(sorted(w)) for w in order}) <= 1:
        return list(files), []
    aligned = []
    for f, windows in zip(files, order, strict=True):
        rename = {w: f"window #{k}" for k, w in enumerate(windows)}
        calls = [dataclasses.replace(c, window=rename[c.window]) for c in f.calls]
        aligned.append(dataclasses.replace(f, calls=calls))
    shown = "; ".join(f"rank {f.rank}: {', '.join(w)}" for f, w in zip(files, order, strict=True))
    return aligned, [f"the files' windows differ ({shown}); matched by their order in each file"]


def _windows_in_order(f: RankFile) -> list[str]:
    first: dict[str, int] = {}
    for c in f.calls:
        first[c.window] = min(first.get(c.window, c.start_ns), c.start_ns)
    return sorted(first, key=lambda w: first[w])


def _window_order(key: tuple[str, str, tuple[int, ...]]) -> tuple[Any, ...]:
    window, group, ranks = key
    kind, _, number = window.partition(" ")
    return (kind, int(number) if number.isdigit() else 0, number, group, ranks)


def _compare_group(
    window: str,
    group: str,
    group_ranks: tuple[int, ...],
    per_rank: dict[int, dict[int, RankCall]],
    file_ranks: list[int],
) -> GroupReport:
    members = [r for r in group_ranks if r in file_ranks] if group_ranks else sorted(per_rank)
    absent = [r for r in group_ranks if r not in file_ranks]
    report = GroupReport(window, group, group_ranks, members, absent_ranks=absent)
    last_seq = max((seq for calls in per_rank.values() for seq in calls), default=-1)
    reported_missing: set[int] = set()
    for seq in range(last_seq + 1):
        present = {r: per_rank[r][seq] for r in members if seq in per_rank.get(r, {})}
        absent = [r for r in members if r not in present]
        if not present:
            continue
        if report.divergence is None and len({c.signature() for c in present.values()}) > 1:
            report.divergence = Divergence(seq, present)
        for rank in absent:
            if rank not in reported_missing:
                reported_missing.add(rank)
                issued_by = sorted(present)
                reference = present[issued_by[0]]
                in_flight_on = [r for r in issued_by if present[r].in_flight]
                report.missing.append(Missing(rank, seq, reference, issued_by, in_flight_on))
        if absent:
            continue
        if len(present) > 1 and all(c.in_flight for c in present.values()):
            report.stuck_together.append(seq)
        report.compared += 1
        starts = {r: c.start_ns for r, c in present.items()}
        last = max(starts, key=lambda r: (starts[r], r))
        first = present[min(starts, key=lambda r: (starts[r], r))]
        report.skews.append(Skew(seq, first.op, first.module, starts[last] - min(starts.values()), last))
    return report


def _stragglers(groups: Sequence[GroupReport], ranks: list[int]) -> list[StragglerRow]:
    rows = []
    for rank in ranks:
        mine = [k for g in groups if rank in g.ranks and len(g.ranks) > 1 for k in g.skews]
        last = [k.skew_ns for k in mine if k.last_rank == rank and k.skew_ns > 0]
        mean = sum(last) / len(last) if last else 0.0
        rows.append(StragglerRow(rank, len(last), len(mine), sum(last), mean, max(last, default=0)))
    return sorted(rows, key=lambda r: (-r.total_skew_ns, -r.last, r.rank))


# --- output ---------------------------------------------------------------------------


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.3f} ms"


def format_report(report: RanksReport, top: int = 5) -> str:
    lines = []
    total = sum(len(f.calls) for f in report.files)
    lines.append(
        f"ranks {','.join(map(str, report.ranks))}: {len(report.files)} files, {total} collectives, "
        f"{len(report.groups)} group windows"
    )
    for note in report.notes:
        lines.append(f"note: {note}")
    for f in report.files:
        if f.unsequenced:
            lines.append(f"note: {f.path} has {f.unsequenced} collectives without {s.COLLECTIVE_SEQ} (not compared)")
    for g in report.groups:
        verdict = "agree" if g.agree else "DIVERGE" if g.divergence is not None else "INCOMPLETE"
        lines.append(f"\n{g.title()}: {verdict} ({g.compared} collectives reached by every rank)")
        if g.absent_ranks:
            lines.append(f"  no file for ranks {','.join(map(str, g.absent_ranks))} (not compared)")
        if g.divergence is not None:
            d = g.divergence
            lines.append(f"  first divergence at seq #{d.seq}:")
            for rank in sorted(d.calls):
                lines.append(f"    rank {rank}: {d.calls[rank].describe()}")
        for m in g.missing:
            ref = m.reference
            waiting = f"; rank {','.join(map(str, m.in_flight_on))} waiting in it" if m.in_flight_on else ""
            lines.append(
                f"  hang suspect: rank {m.rank} never reached {ref.op} #{m.seq} in {ref.where()} "
                f"(issued by rank {','.join(map(str, m.issued_by))}{waiting})"
            )
        for seq in g.stuck_together:
            lines.append(f"  every rank is waiting in seq #{seq}: the collective itself does not complete")
    lines.append("\nstragglers (arrival skew = last issue - first issue, over collectives every rank reached):")
    lines.append(f"  {'rank':>4}  {'last':>9}  {'others waited':>14}  {'mean skew when last':>20}  {'max skew':>12}")
    for row in report.stragglers:
        last = f"{row.last}/{row.compared}"
        lines.append(
            f"  {row.rank:>4}  {last:>9}  {_ms(row.total_skew_ns):>14}  {_ms(row.mean_skew_ns):>20}"
            f"  {_ms(row.max_skew_ns):>12}"
        )
    worst = sorted(((k, g) for g in report.groups for k in g.skews), key=lambda kg: -kg[0].skew_ns)[:top]
    if worst and worst[0][0].skew_ns > 0:
        lines.append("  largest skews:")
        for k, g in worst:
            where = f"Module({k.module})" if k.module else "no module"
            lines.append(f"    {k.op} #{k.seq} in {where}, {g.window}: {_ms(k.skew_ns)}, rank {k.last_rank} last")
    lines.append(
        "\nverdict: ranks agree" if report.agree else "\nverdict: ranks DIVERGE or miss collectives (exit status 3)"
    )
    return "\n".join(lines)


def report_to_json(report: RanksReport) -> dict[str, Any]:
    return {
        "agree": report.agree,
        "ranks": report.ranks,
        "notes": report.notes,
        "files": [{"path": f.path, "rank": f.rank, "collectives": len(f.calls)} for f in report.files],
        "groups": [
            {
                "window": g.window,
                "group": g.group,
                "group_ranks": list(g.group_ranks),
                "ranks": g.ranks,
                "compared": g.compared,
                "agree": g.agree,
                "absent_ranks": g.absent_ranks,
                "divergence": None
                if g.divergence is None
                else {"seq": g.divergence.seq, "calls": [c.to_json() for _, c in sorted(g.divergence.calls.items())]},
                "missing": [
                    {
                        "rank": m.rank,
                        "seq": m.seq,
                        "op": m.reference.op,
                        "module": m.reference.module,
                        "issued_by": m.issued_by,
                        "in_flight_on": m.in_flight_on,
                    }
                    for m in g.missing
                ],
                "stuck_together": g.stuck_together,
                "skews": [
                    {"seq": k.seq, "op": k.op, "module": k.module, "skew_ns": k.skew_ns, "last_rank": k.last_rank}
                    for k in g.skews
                ],
            }
            for g in report.groups
        ],
        "stragglers": [
            {
                "rank": r.rank,
                "last": r.last,
                "compared": r.compared,
                "total_skew_ns": r.total_skew_ns,
                "mean_skew_ns": r.mean_skew_ns,
                "max_skew_ns": r.max_skew_ns,
            }
            for r in report.stragglers
        ],
    }
