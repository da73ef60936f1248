"""Lining the ranks' collectives up by (window, group, seq): the first divergence of each
group, the ranks that never reached a collective others issued, and the arrival skews."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from hp_otel.analysis.call_table import CallKind
from hp_otel.analysis.flight_recorder import align_buffers
from hp_otel.analysis.reading import RankCall, RankFile, RankInputError, check_rank
from hp_otel.analysis.reading_pool import read_rank_files
from hp_otel.common.rank_set import EMPTY, RankSet, union


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
    absent_ranks: RankSet = EMPTY  # group members without a file (runs: a world-sized group's may be millions)

    @property
    def agree(self) -> bool:
        return self.divergence is None and not self.missing


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

    @cached_property
    def missing_ranks(self) -> RankSet:
        """Ranks the files say exist (their `hp_otel.world.size`, their groups' members) without a file of their own:
        nothing about them was compared, so "the ranks agree" cannot be said.  As runs, found without
        listing any group's members."""
        expected = {RankSet.of(g.group_ranks) for g in self.groups}
        sizes = [f.world_size for f in self.files if f.world_size]
        if sizes:
            expected.add(RankSet(((0, max(sizes) - 1, 1),)))
        return union(expected).without(self.ranks)

    @property
    def complete(self) -> bool:
        return not self.missing_ranks


def compare_files(
    paths: Iterable[str | os.PathLike[str]],
    jobs: int = 1,
    on_read: Callable[[int, int], None] | None = None,
    by_module: bool = True,
) -> RanksReport:
    """Read every rank's file (`jobs` processes at a time; `on_read(done, total)` after each) and compare them.

    `by_module`: keep each file's exposure per module (False: only per window and phase,
    the part of the report that does not grow with the model)."""
    files = read_rank_files([os.fspath(p) for p in paths], jobs, on_read, by_module)
    if not files:
        raise RankInputError("give at least one spans file")
    seen: dict[int, str] = {}
    for f in files:
        check_rank(f)
        if f.rank in seen:
            raise RankInputError(f"{seen[f.rank]} and {f.path} are both rank {f.rank}; give one file per rank")
        seen[f.rank] = f.path
    if not any(len(f.calls) for f in files):  # "agree" over no collectives would say nothing true
        raise RankInputError(
            f"nothing to compare: none of the {len(files)} files holds a collective "
            "(were the spans recorded with hp_otel's collective tracing on, inside a window?)"
        )
    files, notes = align_buffers(files)  # Flight Recorder rings: from the seq every rank still holds
    report = compare(files)
    report.notes[:0] = notes
    return report


# A call's place in the files compared: file index * _ROW_SPAN + its row (one int, not a tuple, per call).
_ROW_SPAN = 1 << 32
GroupKey = tuple[str, str, tuple[int, ...]]


def compare(files: Sequence[RankFile]) -> RanksReport:
    """Line the ranks' collectives up by (window, group, seq) and report where they part."""
    file_ranks = sorted(f.rank for f in files)
    files, notes = _trim_rings(files)
    files, aligned = _align_windows(files)
    notes += aligned
    by_group: dict[GroupKey, dict[int, dict[int, int]]] = {}  # key -> rank -> seq -> call's place
    for fi, f in enumerate(files):
        table = f.calls
        keys = [k.group_key for k in table.kinds]
        seqs, kinds, in_flight = table.seq, table.kind, table.in_flight
        for i in sorted(range(len(table)), key=seqs.__getitem__):
            per_rank = by_group.get(keys[kinds[i]])
            if per_rank is None:
                per_rank = by_group[keys[kinds[i]]] = {}
            calls = per_rank.get(f.rank)
            if calls is None:
                calls = per_rank[f.rank] = {}
            seq = seqs[i]
            if seq not in calls or in_flight[i]:  # a returned op whose work is pending: in flight
                calls[seq] = fi * _ROW_SPAN + i
    ranks_with_files = set(file_ranks)
    groups = []
    for key in sorted(by_group, key=_window_order):
        groups.append(_compare_group(key, by_group.pop(key), ranks_with_files, files))
    return RanksReport(list(files), groups, _stragglers(groups, file_ranks), notes)


def _step_number(window: str) -> int | None:
    kind, _, number = window.partition(" ")
    return int(number) if kind == "step" and number.lstrip("-").isdigit() else None


def _trim_rings(files: Sequence[RankFile]) -> tuple[list[RankFile], list[str]]:
    """Step loops' files hold each rank's last steps, written as each step ends, so one rank's file
    may already have dropped a step another's still holds.  Steps older than the newest first step
    of those files are left out of every one of them (not a hang: a ring that moved on); a newer
    step some rank lacks stays, and is reported as that rank's missing collectives."""
    held = {i: _windows_in_order(f) for i, f in enumerate(files) if f.ring and len(f.calls)}
    if len(held) < 2:
        return list(files), []
    numbers = {w: _step_number(w) for windows in held.values() for w in windows}
    if all(n is not None for n in numbers.values()):
        first = max(min(numbers[w] for w in windows) for windows in held.values())  # type: ignore[type-var]
        gone = {w for w, n in numbers.items() if n < first}  # type: ignore[operator]
        kept = f"from step {first} on, which every file holds"
    else:  # steps named by text: no order across ranks but each file's own; the steps every file holds
        common = set.intersection(*(set(w) for w in held.values()))
        gone = set(numbers) - common
        kept = "the steps every file holds"
    if not gone:
        return list(files), []
    out = list(files)
    for i in held:
        if gone & set(held[i]):
            out[i] = dataclasses.replace(files[i], calls=files[i].calls.without_windows(gone))
    shown = ", ".join(sorted(gone, key=lambda w: (numbers[w] is None, numbers[w] or 0, w))[:8])
    more = f" and {len(gone) - 8} more" if len(gone) > 8 else ""
    return out, [f"the step loops' files keep each rank's last steps: compared {kept} ({shown}{more} left out)"]


def _align_windows(files: Sequence[RankFile]) -> tuple[list[RankFile], list[str]]:
    """Windows are matched by label (`step 3`, `window 0`); when the files' labels differ (ranks
    opened a different number of windows before), by their order in each file instead — except
    for step loops' files, whose windows are steps every rank numbers alike."""
    order = [_windows_in_order(f) for f in files]
    if len({tuple(sorted(w)) for w in order}) <= 1 or any(f.ring for f in files):
        return list(files), []
    aligned = []
    for f, windows in zip(files, order, strict=True):
        rename = {w: f"window #{k}" for k, w in enumerate(windows)}
        kinds = [k._replace(window=rename[k.window]) for k in f.calls.kinds]
        aligned.append(dataclasses.replace(f, calls=f.calls.with_kinds(kinds)))
    shown = "; ".join(f"rank {f.rank}: {', '.join(w)}" for f, w in zip(files, order, strict=True))
    return aligned, [f"the files' windows differ ({shown}); matched by their order in each file"]


def _windows_in_order(f: RankFile) -> list[str]:
    first: dict[str, int] = {}
    table = f.calls
    for i, start in enumerate(table.start_ns):
        window = table.kinds[table.kind[i]].window
        first[window] = min(first.get(window, start), start)
    return sorted(first, key=lambda w: first[w])


def _window_order(key: GroupKey) -> tuple[Any, ...]:
    window, group, ranks = key
    kind, _, number = window.partition(" ")
    return (kind, int(number) if number.isdigit() else 0, number, group, ranks)


def _compare_group(
    key: GroupKey, per_rank: dict[int, dict[int, int]], ranks_with_files: set[int], files: Sequence[RankFile]
) -> GroupReport:
    window, group, group_ranks = key
    named = RankSet.of(group_ranks)
    members = named.among(ranks_with_files) if named else sorted(per_rank)
    absent = named.without(ranks_with_files)
    report = GroupReport(window, group, group_ranks, members, absent_ranks=absent)

    def call(place: int) -> RankCall:
        return files[place // _ROW_SPAN].calls.call(place % _ROW_SPAN)

    def row(place: int) -> tuple[CallKind, int, int]:  # (kind, start_ns, in flight)
        table = files[place // _ROW_SPAN].calls
        i = place % _ROW_SPAN
        return table.kinds[table.kind[i]], table.start_ns[i], table.in_flight[i]

    member_calls = [(r, per_rank.get(r, {})) for r in members]
    # The seqs some rank issued, in order: a file's seq may be any int (2**63 - 1), not a count to walk.
    seqs = sorted({seq for _, calls in member_calls for seq in calls})
    reported_missing: set[int] = set()
    for seq in seqs:
        present = {r: calls[seq] for r, calls in member_calls if seq in calls}
        rows = {r: row(place) for r, place in present.items()}
        if report.divergence is None and len({kind.signature() for kind, _, _ in rows.values()}) > 1:
            report.divergence = Divergence(seq, {r: call(place) for r, place in present.items()})
        if len(present) < len(members):
            for rank in members:
                if rank not in present and rank not in reported_missing:
                    reported_missing.add(rank)
                    issued_by = sorted(present)
                    reference = call(present[issued_by[0]])
                    in_flight_on = [r for r in issued_by if rows[r][2]]
                    report.missing.append(Missing(rank, seq, reference, issued_by, in_flight_on))
            continue
        if len(rows) > 1 and all(flight for _, _, flight in rows.values()):
            report.stuck_together.append(seq)
        report.compared += 1
        last = max(rows, key=lambda r: (rows[r][1], r))
        first = min(rows, key=lambda r: (rows[r][1], r))
        first_kind, first_start, _ = rows[first]
        report.skews.append(Skew(seq, first_kind.op, first_kind.module, rows[last][1] - first_start, last))
    return report


def _stragglers(groups: Sequence[GroupReport], ranks: list[int]) -> list[StragglerRow]:
    """Per rank: the collectives it was last in (skew > 0) over those of its groups every rank reached."""
    compared = dict.fromkeys(ranks, 0)
    last: dict[int, list[int]] = {rank: [] for rank in ranks}
    for g in groups:
        if len(g.ranks) <= 1:
            continue
        for rank in g.ranks:
            compared[rank] += len(g.skews)
        for k in g.skews:
            if k.skew_ns > 0:
                last[k.last_rank].append(k.skew_ns)
    rows = []
    for rank in ranks:
        mine = last[rank]
        mean = sum(mine) / len(mine) if mine else 0.0
        rows.append(StragglerRow(rank, len(mine), compared[rank], sum(mine), mean, max(mine, default=0)))
    return sorted(rows, key=lambda r: (-r.total_skew_ns, -r.last, r.rank))
