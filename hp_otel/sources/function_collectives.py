"""Collectives that are plain Python functions: wrap them, read their arguments, report them.

Used for frameworks whose collectives are functions rather than dispatcher ops
(hyper-parallel's platform collectives, MindSpore's `mint.distributed`).  Arguments are
read by binding the call to the function's signature — callers pass `group` by
keyword, or only keywords — never by position.  Nothing here imports a framework: a
tensor is anything with `shape` and `dtype`, a group is a ProcessGroup-like object
(`size()`), a hyper-parallel `group_info` (`rank_size`), a MindSpore group-name string
or None (the world).
"""

from __future__ import annotations

import functools
import inspect
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from hp_otel.record.observer import Observer
from hp_otel.sources.patching import ObserverSlot
from hp_otel.spans.groups import mesh_dim_of
from hp_otel.spans.infos import NO_GROUP, CollectiveInfo, GroupDetails

_INPUT_NAMES = ("data", "input_data", "input_tensor", "input", "tensor", "x")
_OUTPUT_NAMES = ("output_tensor", "output", "tensor_list", "output_tensor_list", "gather_list")
_GROUP_NAMES = ("group", "group_info", "process_group")
_REDUCE_NAMES = ("op", "reduce_op")


def is_tensor_like(value: Any) -> bool:
    return hasattr(value, "shape") and hasattr(value, "dtype") and not isinstance(value, type)


def first_tensor(value: Any) -> Any:
    while isinstance(value, (list, tuple)):
        if not value:
            return None
        value = value[0]
    return value if is_tensor_like(value) else None


def shape_of(tensor: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in tensor.shape)


def nbytes_of(value: Any) -> int:
    if isinstance(value, (list, tuple)):
        return sum(nbytes_of(v) for v in value)
    if not is_tensor_like(value):
        return 0
    nbytes = getattr(value, "nbytes", None)
    if nbytes is not None:
        return int(nbytes)
    return int(value.numel()) * int(value.element_size())


# --- groups ---------------------------------------------------------------------------


def torch_backend_name(pg: Any) -> str:
    """A torch group's communication library as torch names it ("gloo", "nccl", "fake"; "" if it cannot
    say): the one rule for this module's groups and the torch source's (`sources.pytorch.collectives`)."""
    import torch.distributed as dist

    try:
        return str(dist.get_backend(pg)).lower()
    except Exception:  # a group the default-group registry does not know
        return ""


def _torch_group(pg: Any) -> GroupDetails:
    import torch.distributed as dist

    try:
        ranks = tuple(dist.get_process_group_ranks(pg))
    except Exception:  # a group the default-group registry does not know
        ranks = ()
    desc = str(getattr(pg, "group_desc", "") or "")
    return GroupDetails(int(pg.size()), str(getattr(pg, "group_name", "") or ""), ranks, torch_backend_name(pg),
                        mesh_dim_of(desc))  # fmt: skip


def _mindspore_backend() -> str:
    """MindSpore's one communication library of the process (`init()` chose it: hccl, nccl or mccl)."""
    try:
        from mindspore.communication import GlobalComm

        return str(GlobalComm.BACKEND).lower()
    except Exception:  # a MindSpore without it
        return ""


def _named_group(name: str) -> GroupDetails:
    """A group given by name: MindSpore's communication groups, else a torch group name."""
    if "mindspore.communication" in sys.modules:
        from mindspore import communication

        size = int(communication.get_group_size(name))
        try:
            ranks = tuple(int(r) for r in communication.get_process_group_ranks(name))
        except Exception:
            ranks = ()
        return GroupDetails(size, name, ranks, _mindspore_backend())
    if "torch.distributed" in sys.modules:
        from hp_otel.sources.pytorch._compat import resolve_process_group

        details = _torch_group(resolve_process_group(name))
        return GroupDetails(details.size, name, details.ranks, details.backend, details.mesh_dim)
    return GroupDetails(0, name, ())


def _world_group() -> GroupDetails:
    if "torch.distributed" in sys.modules:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return _torch_group(dist.group.WORLD)
    if "mindspore.communication" in sys.modules:
        from mindspore.communication import GlobalComm

        return _named_group(GlobalComm.WORLD_COMM_GROUP)
    return NO_GROUP


class GroupResolver:
    """Size, name and ranks of a group argument; names are cached (one lookup per group per window)."""

    def __init__(self) -> None:
        self._by_name: dict[str, GroupDetails] = {}
        self._world: GroupDetails | None = None

    def __call__(self, group: Any) -> GroupDetails:
        if group is None:
            if self._world is None:
                self._world = _world_group()
            return self._world
        if isinstance(group, str):
            cached = self._by_name.get(group)
            if cached is None:
                cached = self._by_name[group] = _named_group(group)
            return cached
        rank_size = getattr(group, "rank_size", None)
        if rank_size is not None:  # hyper-parallel's group_info: .group, .rank_size, .group_name
            inner = getattr(group, "group", None)
            inner_details = self(inner) if inner is not None and not isinstance(inner, str) else None
            name = getattr(group, "group_name", None) or (inner if isinstance(inner, str) else "")
            ranks = inner_details.ranks if inner_details is not None else ()
            backend = inner_details.backend if inner_details is not None else ""
            if not backend and isinstance(inner, str):
                backend = self(inner).backend
            return GroupDetails(
                int(rank_size), str(name or (inner_details.name if inner_details else "")), ranks, backend
            )
        if callable(getattr(group, "size", None)):
            return _torch_group(group)
        return NO_GROUP


# --- reading one call -----------------------------------------------------------------


def reduce_op_name(value: Any) -> str:
    """ "sum" from a string, or from a reduce-op object (torch's ReduceOp wraps a RedOpType in `.op`)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value.lower()
    op = getattr(value, "op", value)  # torch ReduceOp wraps a RedOpType
    return str(getattr(op, "name", op)).lower()


class CallReader:
    """Reads a CollectiveInfo from one call of `function`, by parameter names of its signature."""

    def __init__(self, name: str, op: str, function: Callable[..., Any], resolve_group: GroupResolver) -> None:
        self.name = name
        self.op = op
        self._resolve_group = resolve_group
        self._signature = inspect.signature(function)
        params = list(self._signature.parameters)
        self._input = next((n for n in _INPUT_NAMES if n in params), None)
        if self._input is None and params:
            self._input = params[0]
        self._output = next((n for n in _OUTPUT_NAMES if n in params and n != self._input), None)
        self._group = next((n for n in _GROUP_NAMES if n in params), None)
        self._reduce = next((n for n in _REDUCE_NAMES if n in params), None)
        self._async_arg = "async_op" if "async_op" in params else None
        self.always_async = name.endswith("_async")

    def bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        bound = self._signature.bind_partial(*args, **kwargs)
        bound.apply_defaults()
        return bound.arguments

    def is_async(self, arguments: dict[str, Any]) -> bool:
        return self.always_async or bool(self._async_arg and arguments.get(self._async_arg))

    def describe(self, arguments: dict[str, Any], result: Any) -> CollectiveInfo:
        inputs = arguments.get(self._input) if self._input else None
        outputs = arguments.get(self._output) if self._output else None
        if outputs is None:
            outputs = result if first_tensor(result) is not None else inputs  # in place: the output is the input
        first_in = first_tensor(inputs)
        first_out = first_tensor(outputs)
        group = self._resolve_group(arguments.get(self._group)) if self._group else NO_GROUP
        return CollectiveInfo(
            name=self.name,
            op=self.op,
            group_size=group.size,
            group=group.name,
            group_ranks=group.ranks,
            mesh_dim=group.mesh_dim,
            input_shape=shape_of(first_in) if first_in is not None else (),
            output_shape=shape_of(first_out) if first_out is not None else (),
            dtype=str(first_in.dtype) if first_in is not None else "",
            bytes=nbytes_of(inputs),
            reduce_op=reduce_op_name(arguments.get(self._reduce)) if self._reduce else "",
            is_async=self.is_async(arguments),
            backend=group.backend,
        )


# --- the wrapper ----------------------------------------------------------------------

_inside = threading.local()  # a traced collective is running on this thread


class AsyncHandles:
    """Async collectives: reported when their handle's `wait()` returns, or when the window ends.

    `wait` is shadowed on the handle instance and the shadow removed once it ran, so
    the handle's own class is never touched.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[int, tuple[Any, Callable[[int], object], Any]] = {}

    def track(self, handle: Any, report: Callable[[int], object], owner: Any) -> bool:
        original_wait = getattr(handle, "wait", None)
        if not callable(original_wait):
            return False
        key = id(handle)

        def wait(*args: Any, **kwargs: Any) -> Any:
            try:
                return original_wait(*args, **kwargs)
            finally:
                self._close(key, time.monotonic_ns())

        try:
            handle.wait = wait
        except (AttributeError, TypeError):  # a handle without instance attributes
            return False
        with self._lock:
            self._pending[key] = (handle, report, owner)
        return True

    def _close(self, key: int, end_ns: int) -> None:
        with self._lock:
            entry = self._pending.pop(key, None)
        if entry is None:
            return
        handle, report, _ = entry
        try:
            del handle.wait
        except AttributeError:
            pass
        report(end_ns)

    def close_all(self, owner: Any) -> None:
        """`owner`'s window ends: report what it never waited for, with the window's end as its end."""
        now = time.monotonic_ns()
        with self._lock:
            keys = [key for key, entry in self._pending.items() if entry[2] is owner]
        for key in keys:
            self._close(key, now)


def wrap_collective(
    function: Callable[..., Any],
    reader: CallReader,
    slot: ObserverSlot[Observer],
    handles: AsyncHandles,
    phase_of: Callable[[], str | None] = lambda: None,
) -> Callable[..., Any]:
    """A drop-in for `function` that reports each call; a collective called by another traced one is not reported."""

    @functools.wraps(function)
    def traced_collective(*args: Any, **kwargs: Any) -> Any:
        observer = slot.current()
        if observer is None or not observer.accepting or getattr(_inside, "active", False):
            return function(*args, **kwargs)
        _inside.active = True
        start = time.time_ns()  # an epoch start; its end is a monotonic duration later (never before it)
        anchor = start - time.monotonic_ns()
        issued = _issue(observer, reader, args, kwargs, start, phase_of)
        try:
            result = function(*args, **kwargs)
        except BaseException as error:
            _inside.active = False
            end = anchor + time.monotonic_ns()
            _report(observer, reader, args, kwargs, None, start, end, error, phase_of, handles, issued, anchor)
            raise
        _inside.active = False
        end = anchor + time.monotonic_ns()
        _report(observer, reader, args, kwargs, result, start, end, None, phase_of, handles, issued, anchor)
        return result

    traced_collective.__hp_otel_original__ = function  # type: ignore[attr-defined]
    return traced_collective


def _issue(
    observer: Observer,
    reader: CallReader,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    start: int,
    phase_of: Callable[[], str | None],
) -> tuple[CollectiveInfo, Any] | None:
    """Report the call before it runs: its sequence number, and a record a hang watchdog can see.
    Returns what it was described as and the observer's ticket (None if describing failed)."""
    try:
        info = reader.describe(reader.bind(args, kwargs), None)
        return info, observer.on_collective_issue(info, start, phase_of())
    except Exception as exc:
        observer.on_fault(f"collective_issue:{reader.name}", exc)
        return None


def _report(
    observer: Observer,
    reader: CallReader,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    result: Any,
    start: int,
    end: int,
    error: BaseException | None,
    phase_of: Callable[[], str | None],
    handles: AsyncHandles,
    issued: tuple[CollectiveInfo, Any] | None = None,
    anchor: int = 0,
) -> None:
    """`anchor`: the start's epoch time less the monotonic clock then; an async handle's wait
    reports the monotonic clock, and its end is `anchor +` that."""
    ticket = issued[1] if issued is not None else None
    try:
        arguments = reader.bind(args, kwargs)
        info = reader.describe(arguments, result)
        phase = phase_of()
    except Exception as exc:
        observer.on_fault(f"collective_describe:{reader.name}", exc)
        if issued is not None and ticket is not None:  # described when issued: report it as it was issued
            observer.on_collective(issued[0], start, end, error, None, ticket)
        return
    if error is None and info.is_async:
        handle = result[-1] if isinstance(result, tuple) and result else result
        try:
            if handle is not None and handles.track(
                handle,
                lambda clock_ns: observer.on_collective(info, start, anchor + clock_ns, None, phase, ticket),
                observer,
            ):
                return
        except Exception as exc:
            observer.on_fault("collective_async_handle", exc)
    observer.on_collective(info, start, end, error, phase, ticket)
