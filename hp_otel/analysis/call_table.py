"""A rank's collectives in columns: what `hp-otel ranks` keeps of each file while it reads thousands.

A `RankCall` object costs about 1 KB; 4,096 ranks of a 140-collective step are 573,000
of them.  A `CallTable` keeps each call's numbers in typed arrays (57 bytes a call) and
what it is (window, group, op, shapes, module, ...) once per distinct `CallKind`, shared
by every call, rank and file of that kind (`intern` across files).  Iterating a table
gives `RankCall`s, so code written for lists keeps working.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, NamedTuple, overload

from hp_otel.analysis.rank_call import RankCall, signature


class CallKind(NamedTuple):
    """What a collective is, apart from its numbers (seq, times, bytes, bandwidths)."""

    window: str
    group: str
    group_ranks: tuple[int, ...]
    op: str
    name: str
    input_shape: tuple[int, ...]
    output_shape: tuple[int, ...]
    dtype: str
    reduce_op: str
    module: str
    phase: str
    stack: tuple[str, ...]

    @property
    def group_key(self) -> tuple[str, str, tuple[int, ...]]:
        """How ranks are lined up: (window, group name, group ranks)."""
        return (self.window, self.group, self.group_ranks)

    def signature(self) -> tuple[Any, ...]:
        """What must be equal on every rank of the group (see `RankCall.signature`)."""
        return signature(self.op, self.input_shape, self.output_shape, self.dtype, self.reduce_op)


def _kind_of(call: RankCall) -> CallKind:
    return CallKind(
        call.window,
        call.group,
        call.group_ranks,
        call.op,
        call.name,
        call.input_shape,
        call.output_shape,
        call.dtype,
        call.reduce_op,
        call.module,
        call.phase,
        call.stack,
    )


class CallTable:
    """One rank's collectives, in file order."""

    __slots__ = (
        "_index",
        "algbw",
        "busbw",
        "end_ns",
        "in_flight",
        "kind",
        "kinds",
        "nbytes",
        "rank",
        "seq",
        "start_ns",
    )

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.kinds: list[CallKind] = []
        self._index: dict[CallKind, int] = {}
        self.kind = array("l")
        self.seq = array("q")
        self.start_ns = array("q")
        self.end_ns = array("q")
        self.in_flight = array("b")
        self.nbytes = array("q")
        self.algbw = array("d")
        self.busbw = array("d")

    @classmethod
    def of(cls, rank: int, calls: Iterable[RankCall]) -> CallTable:
        table = cls(rank)
        for call in calls:
            table.append(call)
        return table

    def append(self, call: RankCall) -> None:
        kind = _kind_of(call)
        index = self._index.get(kind)
        if index is None:
            index = self._index[kind] = len(self.kinds)
            self.kinds.append(kind)
        # array raises OverflowError for numbers beyond int64: the reader reports the span
        self.seq.append(call.seq)
        self.start_ns.append(call.start_ns)
        self.end_ns.append(call.end_ns)
        self.nbytes.append(call.bytes)
        self.kind.append(index)
        self.in_flight.append(call.in_flight)
        self.algbw.append(call.algbw)
        self.busbw.append(call.busbw)

    def append_row(
        self, kind: int, seq: int, start_ns: int, end_ns: int, in_flight: bool, nbytes: int, algbw: float, busbw: float
    ) -> None:
        """A call of a kind the table holds (`kinds[kind]`), without building its `RankCall`."""
        if not 0 <= kind < len(self.kinds):
            raise IndexError(f"kind {kind} of {len(self.kinds)}")
        self.seq.append(seq)
        self.start_ns.append(start_ns)
        self.end_ns.append(end_ns)
        self.nbytes.append(nbytes)
        self.kind.append(kind)
        self.in_flight.append(in_flight)
        self.algbw.append(algbw)
        self.busbw.append(busbw)

    def __len__(self) -> int:
        return len(self.seq)

    def __iter__(self) -> Iterator[RankCall]:
        return (self.call(i) for i in range(len(self.seq)))

    @overload
    def __getitem__(self, index: int) -> RankCall: ...
    @overload
    def __getitem__(self, index: slice) -> list[RankCall]: ...
    def __getitem__(self, index: int | slice) -> RankCall | list[RankCall]:
        """`calls[i]`, `calls[1:]`: as on the list it was."""
        if isinstance(index, slice):
            return [self.call(i) for i in range(len(self.seq))[index]]
        return self.call(range(len(self.seq))[index])

    def __eq__(self, other: object) -> bool:
        """Equal to a table or a list of the same calls (code written when `RankFile.calls` was a list)."""
        if isinstance(other, (CallTable, list)):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def call(self, i: int) -> RankCall:
        k = self.kinds[self.kind[i]]
        return RankCall(
            rank=self.rank,
            window=k.window,
            group=k.group,
            group_ranks=k.group_ranks,
            seq=self.seq[i],
            op=k.op,
            name=k.name,
            input_shape=k.input_shape,
            output_shape=k.output_shape,
            dtype=k.dtype,
            reduce_op=k.reduce_op,
            module=k.module,
            phase=k.phase,
            start_ns=self.start_ns[i],
            end_ns=self.end_ns[i],
            in_flight=bool(self.in_flight[i]),
            bytes=self.nbytes[i],
            stack=k.stack,
            algbw=self.algbw[i],
            busbw=self.busbw[i],
        )

    def kind_of(self, i: int) -> CallKind:
        return self.kinds[self.kind[i]]

    def with_kinds(self, kinds: Sequence[CallKind]) -> CallTable:
        """The same calls with each kind replaced (one for one): windows renamed, kinds interned."""
        table = CallTable(self.rank)
        for name in ("kind", "seq", "start_ns", "end_ns", "in_flight", "nbytes", "algbw", "busbw"):
            setattr(table, name, getattr(self, name))
        table.kinds = list(kinds)
        table._index = {k: i for i, k in enumerate(table.kinds)}
        return table

    def without_windows(self, windows: Iterable[str]) -> CallTable:
        """The calls outside `windows` (their window labels), in order."""
        gone = set(windows)
        table = CallTable(self.rank)
        for i in range(len(self.seq)):
            if self.kinds[self.kind[i]].window not in gone:
                table.append(self.call(i))
        return table

    def __getstate__(self) -> tuple[Any, ...]:
        return (self.rank, self.kinds, self.kind, self.seq, self.start_ns, self.end_ns, self.in_flight, self.nbytes,
                self.algbw, self.busbw)  # fmt: skip

    def __setstate__(self, state: tuple[Any, ...]) -> None:
        (self.rank, self.kinds, self.kind, self.seq, self.start_ns, self.end_ns, self.in_flight, self.nbytes,
         self.algbw, self.busbw) = state  # fmt: skip
        self._index = {k: i for i, k in enumerate(self.kinds)}


class KindInterner:
    """One object per distinct kind (and per distinct string and tuple in it) across every file read."""

    def __init__(self) -> None:
        self._parts: dict[Any, Any] = {}
        self._kinds: dict[CallKind, CallKind] = {}

    def __call__(self, table: CallTable) -> CallTable:
        return table.with_kinds([self.kind(k) for k in table.kinds])

    def kind(self, kind: CallKind) -> CallKind:
        found = self._kinds.get(kind)
        if found is None:
            parts = self._parts
            found = self._kinds[kind] = CallKind(*(parts.setdefault(p, p) for p in kind))
        return found
