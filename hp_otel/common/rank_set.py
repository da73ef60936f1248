"""A process group's members as strided runs: `0-4095`, `3-4091:8`, `0,2,5`.

A world-sized group has thousands of members; every collective span, every call a reader
lines up and every report row used to carry them as a list.  Members are almost always one
strided run (a data-parallel group is every tp-th rank), so a `RankSet` keeps the runs, its
length and its hash: hashing, comparing and pickling one costs the same at 4,096 ranks as
at 2.  The text form is what files and spans carry (`RankSet.parse` reads it back).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Collection, Iterable, Iterator
from itertools import pairwise
from typing import Any

Run = tuple[int, int, int]  # (first, last, step): first, first + step, ..., last


def _runs_of(ranks: list[int]) -> tuple[Run, ...]:
    """Greedy strided runs of `ranks` in their order (a run needs 3 members; 2 stay single)."""
    runs: list[Run] = []
    i, n = 0, len(ranks)
    while i < n:
        first = ranks[i]
        if i + 2 < n and ranks[i + 1] > first and ranks[i + 2] - ranks[i + 1] == ranks[i + 1] - first:
            step = ranks[i + 1] - first
            j = i + 2
            while j + 1 < n and ranks[j + 1] - ranks[j] == step:
                j += 1
            runs.append((first, ranks[j], step))
            i = j + 1
        else:
            runs.append((first, first, 1))
            i += 1
    return tuple(runs)


def _canonical(runs: Iterable[Run]) -> tuple[Run, ...]:
    """The runs `_runs_of` gives for the members of `runs`, without listing them: one set of
    members has one form (so `parse("0-1") == of([0, 1])` and both hash alike), and a long run
    costs a few steps, not its length."""
    out: list[Run] = []
    pending: list[int] = []  # up to 2 members not yet placed in a run
    current: list[int] | None = None  # [first, last, step] of the run being extended

    def feed(rank: int) -> None:
        nonlocal current
        if current is not None:
            if rank - current[1] == current[2]:
                current[1] = rank
                return
            out.append((current[0], current[1], current[2]))
            current = None
        pending.append(rank)
        if len(pending) == 3:
            a, b, c = pending
            if b > a and c - b == b - a:
                current, pending[:] = [a, c, b - a], []
            else:
                out.append((a, a, 1))
                del pending[0]

    for first, last, step in runs:
        for rank in range(first, last + 1, step):
            feed(rank)
            if current is not None and current[2] == step and current[1] == rank:
                current[1] = last  # the rest of this run extends the current one
                break
    if current is not None:
        out.append((current[0], current[1], current[2]))
    out.extend((r, r, 1) for r in pending)
    return tuple(out)


def _run_text(run: Run) -> str:
    first, last, step = run
    if first == last:
        return str(first)
    return f"{first}-{last}" if step == 1 else f"{first}-{last}:{step}"


class RankSet:
    """Members of a group, in group order, as strided runs (immutable, hashable, cheap to pickle).

    Iterates, indexes and tests membership like the tuple of its ranks, and compares equal to
    that tuple (its hash is its runs', so do not mix both as keys of one dict)."""

    __slots__ = ("_hash", "_len", "runs")

    def __init__(self, runs: tuple[Run, ...] = ()) -> None:
        self.runs = runs = _canonical(runs)
        self._len = sum((last - first) // step + 1 for first, last, step in runs)
        self._hash = hash(runs)

    @classmethod
    def of(cls, ranks: Iterable[int]) -> RankSet:
        """The members `ranks` (ints, in group order); a RankSet is returned as it is."""
        if isinstance(ranks, RankSet):
            return ranks
        return cls(_runs_of([int(r) for r in ranks]))

    @classmethod
    def parse(cls, text: str) -> RankSet:
        """`"0-4095"`, `"3-4091:8,7"`, `""`: ValueError naming what is wrong otherwise."""
        runs: list[Run] = []
        for part in text.split(",") if text.strip() else ():
            span, _, step_text = part.strip().partition(":")
            first_text, dash, last_text = span.partition("-")
            try:
                first = int(first_text)
                last = int(last_text) if dash else first
                step = int(step_text) if step_text else 1
            except ValueError:
                raise ValueError(f"group members {_shown(text)}: {_shown(part)} is not N, N-M or N-M:S") from None
            if first < 0 or last < first or step < 1 or (last - first) % step:
                raise ValueError(
                    f"group members {_shown(text)}: {_shown(part)} is not a run of ranks N-M:S with M >= N >= 0"
                )
            runs.append((first, last, step) if first != last else (first, first, 1))
        return cls(tuple(runs))

    def __str__(self) -> str:
        return ",".join(_run_text(r) for r in self.runs)

    def __repr__(self) -> str:
        return f"RankSet({str(self)!r})"

    def __len__(self) -> int:
        return self._len

    def __bool__(self) -> bool:
        return self._len > 0

    def __iter__(self) -> Iterator[int]:
        for first, last, step in self.runs:
            yield from range(first, last + 1, step)

    def __contains__(self, rank: object) -> bool:
        if not isinstance(rank, int):
            return False
        return any(first <= rank <= last and (rank - first) % step == 0 for first, last, step in self.runs)

    def __getitem__(self, index: int) -> int:
        """The `index`-th member (a peer's global rank from its rank in the group)."""
        if index < 0:
            index += self._len
        if not 0 <= index < self._len:
            raise IndexError(f"member {index} of {self._len}")
        for first, last, step in self.runs:
            size = (last - first) // step + 1
            if index < size:
                return first + index * step
            index -= size
        raise IndexError(index)  # not reached

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RankSet):
            return self._hash == other._hash and self.runs == other.runs
        if isinstance(other, (tuple, list)):
            return len(other) == self._len and all(a == b for a, b in zip(self, other, strict=False))
        return NotImplemented

    def __reduce__(self) -> tuple[Any, ...]:
        return (RankSet, (self.runs,))

    @property
    def ascending(self) -> bool:
        """Members in rising order (every group hp_otel and torch make): ranges and gaps read off the runs."""
        runs = self.runs
        return all(a[1] < b[0] for a, b in pairwise(runs))

    def without(self, ranks: Collection[int]) -> RankSet:
        """These members less `ranks`, in group order: cut where they fall, never listed (the ranks
        of a 3-million-rank group that have no file are a run or two, not 3 million ints)."""
        removed = sorted(set(ranks))
        pieces: list[Run] = []
        for first, last, step in self.runs:
            start = first
            for rank in removed[bisect_left(removed, first) : bisect_right(removed, last)]:
                if (rank - first) % step == 0:
                    if start <= rank - step:
                        pieces.append((start, rank - step, step))
                    start = rank + step
            if start <= last:
                pieces.append((start, last, step))
        return RankSet(tuple(pieces))

    def among(self, ranks: Collection[int]) -> list[int]:
        """The members that are in `ranks`, in group order, at a cost of `ranks`' size, not the group's."""
        if self._len <= len(ranks):
            return [r for r in self if r in ranks]
        chosen = sorted(set(ranks))
        kept: list[int] = []
        for first, last, step in self.runs:
            kept.extend(
                r for r in chosen[bisect_left(chosen, first) : bisect_right(chosen, last)] if (r - first) % step == 0
            )
        return kept

    def __lt__(self, other: RankSet) -> bool:  # report rows are sorted by group
        return self.runs < other.runs


EMPTY = RankSet()


def union(sets: Iterable[RankSet]) -> RankSet:
    """Every member of `sets` once, in rising order.  Runs of step 1 merge as intervals; a strided
    run adds only the members no interval holds, so groups inside the world's range cost their runs."""
    runs = [run for ranks in sets for run in ranks.runs]
    strided = [run for run in runs if run[2] > 1]
    merged: list[list[int]] = []
    for first, last, _ in sorted(run for run in runs if run[2] == 1):
        if merged and first <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], last)
        else:
            merged.append([first, last])
    starts = [first for first, _ in merged]
    loose: set[int] = set()
    for first, last, step in strided:
        rank = first
        while rank <= last:
            i = bisect_right(starts, rank) - 1
            if i >= 0 and rank <= merged[i][1]:  # held: jump past the interval
                rank += ((merged[i][1] - rank) // step + 1) * step
            else:
                loose.add(rank)
                rank += step
    return RankSet(tuple(sorted([(a, b, 1) for a, b in merged] + [(r, r, 1) for r in loose])))


def ranks_with_exceptions(ranks: Iterable[int], limit: int) -> str:
    """A rank list as short text: its runs (`0-4095`), or the smallest run holding it with its gaps
    (`0-4095 except 17,18`) when that is shorter; at most `limit` pieces, then a count."""
    if isinstance(ranks, RankSet) and ranks.ascending:
        return _with_exceptions(ranks, limit)
    members = sorted(set(ranks))
    if not members:
        return ""
    listed = RankSet.of(members)
    first, last = members[0], members[-1]
    gaps = last - first + 1 - len(members)
    pieces = len(listed.runs)
    if 0 < gaps < pieces:
        held = set(members)
        missing = RankSet.of(r for r in range(first, last + 1) if r not in held)
        return _readable(f"{first}-{last} except {_cut(missing, limit)}", listed, limit)
    return _cut(listed, limit)


def _readable(excepted: str, ranks: RankSet, limit: int) -> str:
    """The except form, unless the ranks are a few single ones (`0,2`, not `0-2 except 1`)."""
    if len(ranks.runs) <= limit and all(first == last for first, last, _ in ranks.runs):
        return str(ranks)
    return excepted


def _with_exceptions(ranks: RankSet, limit: int) -> str:
    """`ranks_with_exceptions` read off the runs of rising members (no member listed)."""
    runs = ranks.runs
    if not runs:
        return ""
    first, last = runs[0][0], runs[-1][1]
    gaps = last - first + 1 - len(ranks)
    if 0 < gaps < len(runs):  # few gaps: all of them lie between runs of step 1 or inside short ones
        missing: list[int] = []
        previous = first - 1
        for start, end, step in runs:
            missing.extend(range(previous + 1, start))
            for rank in range(start, end, step):
                missing.extend(range(rank + 1, rank + step))
            previous = end
        return _readable(f"{first}-{last} except {_cut(RankSet.of(missing), limit)}", ranks, limit)
    return _cut(ranks, limit)


def _cut(ranks: RankSet, limit: int) -> str:
    runs = ranks.runs
    if len(runs) <= limit:
        return str(ranks)
    shown = ",".join(_run_text(r) for r in runs[:limit])
    return f"{shown},... ({len(ranks)} ranks in {len(runs)} runs)"


def _shown(text: str, limit: int = 60) -> str:
    """`text` for an error message: its start and its length when long (a file can name millions of ranks)."""
    return repr(text) if len(text) <= limit else f"{text[:limit]!r}... ({len(text):,} characters)"
