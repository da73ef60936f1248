"""The events the recorder hands to the span builder: one small typed record per kind.

The recorder appends them on the training step's hot path (a slotted dataclass costs
about as much as the tuple it replaced, plus a few hundred nanoseconds); the span builder
turns them into spans, live or when the spans are first read.  Every event carries its
own timestamps, so building later gives the same spans as building at once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from hp_otel.record.attribution import Attribution
from hp_otel.spans.bandwidth import Bandwidth
from hp_otel.spans.infos import CollectiveInfo, ModuleInfo, TensorInfo


@dataclass(slots=True)
class ModuleEnter:
    time_ns: int
    module: ModuleInfo
    phase: str  # schema.PHASE_FORWARD | PHASE_BACKWARD
    # (fqn, phase) of the open module span to nest under instead of the innermost open call
    # (("", ""): the window's root): FSDP prefetching another module's parameters (attribution.py)
    under: tuple[str, str] | None = None


@dataclass(slots=True)
class ModuleExit:
    time_ns: int
    fqn: str
    phase: str
    error: BaseException | None


@dataclass(slots=True)
class BackwardEnd:
    """The autograd pass finished: backward module spans still open close now."""

    time_ns: int


@dataclass(slots=True)
class OpEnter:
    time_ns: int
    name: str
    inputs: Sequence[TensorInfo]


@dataclass(slots=True)
class OpExit:
    time_ns: int
    name: str
    outputs: Sequence[TensorInfo]
    error: BaseException | None


@dataclass(slots=True)
class RedistributeEnter:
    time_ns: int
    src_placements: str
    dst_placements: str
    shape: tuple[int, ...]
    stack: tuple[str, ...] = ()  # the user's frames issuing it (call_stack.py), when asked for


@dataclass(slots=True)
class RedistributeExit:
    time_ns: int
    error: BaseException | None


@dataclass(slots=True, eq=False)
class CollectiveIssue:
    """A collective was issued and has not returned yet: its issue time, sequence number and place.

    Compared by identity: the recorder keeps the in-flight ones (what a hang watchdog
    writes) and the source hands this back as the ticket of the completing call.
    """

    start_ns: int
    info: CollectiveInfo
    seq: int  # index among this window's collectives on the group
    place: Attribution  # decided once, when issued: its collective's counts and span read it too
    dumped_to: str = ""  # set by the watchdog when it wrote a file while this was in flight
    waited_s: float = 0.0
    # After the call returned: says whether its work is done (a Work, an unwaited result), or None.
    pending: Callable[[], bool] | None = None
    returned: bool = False
    stack: tuple[str, ...] = ()  # the user's frames issuing it (call_stack.py), when asked for


class Launch:
    """A collective of a counts-only window no watchdog watches, from its issue to its completion: the
    staleness gauges' ticket (in flight from its issue) and, once its call returned without its work
    done, its own completion record: no span and no in-flight record need a `Collective` there, so the
    launch pays a few attribute stores (its duration histogram and gauges read the same times)."""

    __slots__ = ("completion", "end_ns", "info", "returned_ns", "start_ns")

    def __init__(self, start_ns: int, info: CollectiveInfo) -> None:
        self.start_ns = start_ns
        self.info = info
        self.completion = "call"  # schema.COMPLETION_*: LAUNCH from its launch until its completion is seen
        self.end_ns = start_ns  # the launch's end, then its completion's
        self.returned_ns = start_ns  # when the issuing call returned


@dataclass(slots=True, kw_only=True)
class Collective:
    """A collective call: a leaf span of the innermost open call."""

    start_ns: int
    end_ns: int
    info: CollectiveInfo
    error: BaseException | None
    place: Attribution  # its phase, module and issuer: the same object its counts were made from
    seq: int = -1
    issue: CollectiveIssue | None = None  # its issue record, when the source reported one
    # schema.COMPLETION_*: LAUNCH while a completion is awaited (end_ns is the launch's end
    # until then); the source's completion helper moves end_ns and sets WAIT or WORK.
    completion: str = "call"
    returned_ns: int = 0  # when the issuing call returned (end_ns moves on to the completion)
    waited_ns: int = 0  # how long a thread waited for it (wait_tensor, Work.wait)
    # CUDA: says the device time (ns) once the events around it are complete, else None (never syncs)
    device: Callable[[], int | None] | None = None
    stack: tuple[str, ...] = ()  # the user's frames issuing it (its issue's, when there is one)
    # Its bandwidth over `bw_ns` (collective_metrics.bandwidth_of): computed once, read by metrics and span
    bw: Bandwidth | None = None
    bw_ns: int = -1


@dataclass(slots=True)
class WindowEnd:
    """The CommDebugMode window closed: every span still open ends (with its error, if it raised)."""

    time_ns: int
    error: BaseException | None


Event = (
    ModuleEnter
    | ModuleExit
    | BackwardEnd
    | OpEnter
    | OpExit
    | RedistributeEnter
    | RedistributeExit
    | CollectiveIssue
    | Collective
    | WindowEnd
)
