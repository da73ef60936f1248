"""Lining the ranks' collectives up by (window, group, seq): the first divergence of each
group, the ranks that never reached a collective others issued, and the arrival skews."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

# Ops whose shapes legitimately differ between ranks (uneven splits, point to point).
from ranks_before.flight_recorder import align_buffers, read_any_rank_file
from ranks_before.reading import RankCall, RankFile, RankInputError


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
        """Every group agrees, over the ranks that have a file (see `missing_ranks` for the others)."""
        return all(g.agree for g in self.groups)

    @property
    def ranks(self) -> list[int]:
        return sorted(f.rank for f in self.files)

    @property
    def missing_ranks(self) -> list[int]:
        """Ranks the files say exist (their `hp_otel.world.size`, their groups' members) without a file of their own:
        nothing about them was compared, so "the ranks agree" cannot be said."""
        expected = {r for g in self.groups for r in g.group_ranks}
        sizes = [f.world_size for f in self.files if f.world_size]
        if sizes:
            expected.update(range(max(sizes)))
        return sorted(expected - set(self.ranks))

    @property
    def complete(self) -> bool:
        return not self.missing_ranks


def compare_files(paths: Iterable[str | os.PathLike[str]]) -> RanksReport:
    files = [read_any_rank_file(p) for p in paths]  # spans files, JSON dumps, Flight Recorder dumps
    if not files:
        raise RankInputError("give at least one spans file")
    seen: dict[int, str] = {}
    for f in files:
        if f.rank in seen:
            raise RankInputError(f"{seen[f.rank]} and {f.path} are both rank {f.rank}; give one file per rank")
        seen[f.rank] = f.path
    files, notes = align_buffers(files)  # Flight Recorder rings: from the seq every rank still holds
    report = compare(files)
    report.notes[:0] = notes
    return report


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
    # The seqs some rank issued, in order: a file's seq may be any int (2**63 - 1), not a count to walk.
    seqs = sorted({seq for r in members for seq in per_rank.get(r, {})})
    reported_missing: set[int] = set()
    for seq in seqs:
        present = {r: per_rank[r][seq] for r in members if seq in per_rank.get(r, {})}
        absent = [r for r in members if r not in present]
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
