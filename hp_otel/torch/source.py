"""The drop-in's source: torch's module tracker and torch's op and count records.

Installed through `hp_otel.CommDebugMode(extra_sources=[...])`, after hp_otel's own
torch sources, so in one window hp_otel records spans and metrics while this source
records what torch's CommDebugMode records, in torch's types:

- `comm_counts`: `{OpOverloadPacket: n}` for the collectives torch counts (native
  functional ops under their legacy `c10d_functional` packet, as torch does);
- `comm_module_counts`: `{fqn: {"forward"|"backward": {packet: n}}}`, each collective
  counted for the current module and the parents it had in its first forward;
- `comm_module_operation_counts`: `{fqn: {"operations_list": [op dicts]}}` — every
  aten op (DTensor-level and local), for the table and the JSON dump.

It needs aten-level ops, which hp_otel's spans do not keep (they record ops at the
level the user wrote them), so it is a dispatch mode of its own.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from torch.distributed.tensor import DTensor

from hp_otel.record.observer import Observer
from hp_otel.sources.patching import run_every
from hp_otel.sources.pytorch import _compat
from hp_otel.torch.module_tracker import GLOBAL, CompatModuleTracker
from hp_otel.torch.op_keys import comm_registry, count_key

_PARENTS_UNKNOWN = frozenset({GLOBAL})
TorchDispatchMode = _compat.TorchDispatchMode
_HigherOrderOperator = _compat.HigherOrderOperator
_detect_fake_mode = _compat.detect_fake_mode
_overload_packet = _compat.overload_packet


def new_phase_counts() -> dict[str, defaultdict[Any, int]]:
    return {"forward": defaultdict(int), "backward": defaultdict(int)}


class TorchRecordMode(TorchDispatchMode):  # type: ignore[misc,valid-type]
    """What torch's CommDebugMode does at dispatch, with its attributes: note ops per
    module, count collectives.  The drop-in is one of these (so it is a TorchDispatchMode,
    as torch's is); `TorchCompatSource` pushes it while the hp_otel window is active."""

    supports_higher_order_operators = True

    def __init__(self) -> None:
        super().__init__()
        self.comm_counts: defaultdict[Any, int] = defaultdict(int)
        self.comm_module_counts: dict[str, dict[str, defaultdict[Any, int]]] = {}
        self.comm_module_operation_counts: dict[str, dict[str, list[dict[str, Any]]]] = {}
        self.comm_registry: set[Any] = comm_registry()
        self.advanced_module_tracker = CompatModuleTracker()
        self._observer: Observer = _NO_OBSERVER

    def report_to(self, observer: Observer | None) -> None:
        """The hp_otel window's observer while it is open (None when it closes): faults of this
        mode's bookkeeping count there, and its module tracker reports module spans to it."""
        self._observer = observer if observer is not None else _NO_OBSERVER
        self.advanced_module_tracker.observer = observer

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if kwargs is None:
            kwargs = {}
        if isinstance(func, _HigherOrderOperator):
            return func(*args, **kwargs)
        try:
            record, ops = self._op_record(func)
        except Exception as exc:  # our bookkeeping failed: run the op unrecorded
            self._observer.on_fault("compat_op_record", exc)
            record = ops = None
        if DTensor in types:  # let DTensor run; its local ops come back through this mode
            if record is not None:
                try:
                    self._note_dtensor_args(record, args)
                    ops.append(record)
                except Exception as exc:
                    self._observer.on_fault("compat_op_record", exc)
            return NotImplemented
        out = func(*args, **kwargs)
        if record is not None:
            try:
                self._count(func, record["is_bw"])
            except Exception as exc:
                self._observer.on_fault("compat_collective_count", exc)
            try:
                if not _detect_fake_mode(args):
                    ops.append(record)
            except Exception as exc:
                self._observer.on_fault("compat_op_record", exc)
        return out

    def _op_record(self, func: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        tracker = self.advanced_module_tracker
        per_module = self.comm_module_operation_counts.setdefault(tracker.name, {"operations_list": []})
        record = {
            "name": func,
            "input_shape": [],
            "input_sharding": [],
            "device_mesh": "",
            "is_bw": tracker.is_bw,
            "is_activation_checkpointing": tracker.activation_checkpointing,
        }
        return record, per_module["operations_list"]

    @staticmethod
    def _note_dtensor_args(record: dict[str, Any], args: Any) -> None:
        for arg in args:
            if isinstance(arg, DTensor):
                record["input_shape"].append(arg.shape)
                record["input_sharding"].append(arg.placements)
                record["device_mesh"] = str(arg.device_mesh)

    def _count(self, func: Any, is_bw: bool) -> None:
        key = count_key(_overload_packet(func), self.comm_registry)
        if key is None:
            return
        self.comm_counts[key] += 1
        phase = "backward" if is_bw else "forward"
        tracker = self.advanced_module_tracker
        name = tracker.name
        module_counts = self.comm_module_counts
        if name not in module_counts:
            module_counts[name] = new_phase_counts()
        module_counts[name][phase][key] += 1
        # a module first seen in backward has no recorded parents: torch raises KeyError there
        for parent in tracker.module_parents_dict.get(name, _PARENTS_UNKNOWN):
            if parent != name:
                if parent not in module_counts:
                    module_counts[parent] = new_phase_counts()
                module_counts[parent][phase][key] += 1


class _NoObserver:
    """Where faults go while no window is active (the mode is only pushed inside one)."""

    accepting = False

    def on_fault(self, where: str, exc: BaseException) -> None:
        pass


_NO_OBSERVER: Any = _NoObserver()


class TorchCompatSource:
    """Installs the module tracker and pushes the record mode for one window."""

    def __init__(self, mode: TorchRecordMode) -> None:
        self._mode = mode
        self._pushed = False
        self._tracker_entered = False

    def attach(self, observer: Observer) -> None:
        mode = self._mode
        mode.report_to(observer)
        mode.advanced_module_tracker.__enter__()
        self._tracker_entered = True
        TorchDispatchMode.__enter__(mode)  # the mode's own __enter__ is the drop-in's window
        self._pushed = True

    def detach(self) -> None:
        run_every((self._pop_mode, self._exit_tracker))

    def _pop_mode(self) -> None:
        if self._pushed:
            self._pushed = False
            TorchDispatchMode.__exit__(self._mode, None, None, None)

    def _exit_tracker(self) -> None:
        tracker = self._mode.advanced_module_tracker
        if self._tracker_entered:
            self._tracker_entered = False
            try:
                tracker.__exit__()
            finally:
                self._mode.report_to(None)
