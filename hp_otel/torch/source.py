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
from typing import TYPE_CHECKING, Any

import torch
from torch._guards import detect_fake_mode
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode

from hp_otel.observer import Observer
from hp_otel.sources.patching import run_every
from hp_otel.torch.module_tracker import GLOBAL
from hp_otel.torch.op_keys import count_key

if TYPE_CHECKING:
    from hp_otel.torch.comm_mode import CommDebugMode

_PARENTS_UNKNOWN = frozenset({GLOBAL})


def new_phase_counts() -> dict[str, defaultdict[Any, int]]:
    return {"forward": defaultdict(int), "backward": defaultdict(int)}


class _TorchRecordMode(TorchDispatchMode):
    """What torch's CommDebugMode does at dispatch: note ops per module, count collectives."""

    supports_higher_order_operators = True

    def __init__(self, owner: CommDebugMode, observer: Observer) -> None:
        super().__init__()
        self._owner = owner
        self._observer = observer

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if kwargs is None:
            kwargs = {}
        if isinstance(func, torch._ops.HigherOrderOperator):
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
                if not detect_fake_mode(args):
                    ops.append(record)
            except Exception as exc:
                self._observer.on_fault("compat_collective_count", exc)
        return out

    def _op_record(self, func: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        tracker = self._owner.advanced_module_tracker
        per_module = self._owner.comm_module_operation_counts.setdefault(tracker.name, {"operations_list": []})
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
        owner = self._owner
        key = count_key(func._overloadpacket, owner.comm_registry)
        if key is None:
            return
        owner.comm_counts[key] += 1
        phase = "backward" if is_bw else "forward"
        tracker = owner.advanced_module_tracker
        name = tracker.name
        module_counts = owner.comm_module_counts
        if name not in module_counts:
            module_counts[name] = new_phase_counts()
        module_counts[name][phase][key] += 1
        # a module first seen in backward has no recorded parents: torch raises KeyError there
        for parent in tracker.module_parents_dict.get(name, _PARENTS_UNKNOWN):
            if parent != name:
                if parent not in module_counts:
                    module_counts[parent] = new_phase_counts()
                module_counts[parent][phase][key] += 1


class TorchCompatSource:
    """Installs the module tracker and the record mode for one drop-in window."""

    def __init__(self, owner: CommDebugMode) -> None:
        self._owner = owner
        self._mode: _TorchRecordMode | None = None
        self._tracker_entered = False

    def install(self, observer: Observer) -> None:
        tracker = self._owner.advanced_module_tracker
        tracker.observer = observer
        tracker.__enter__()
        self._tracker_entered = True
        mode = _TorchRecordMode(self._owner, observer)
        mode.__enter__()
        self._mode = mode

    def uninstall(self) -> None:
        run_every((self._exit_mode, self._exit_tracker))

    def _exit_mode(self) -> None:
        mode, self._mode = self._mode, None
        if mode is not None:
            mode.__exit__(None, None, None)

    def _exit_tracker(self) -> None:
        tracker = self._owner.advanced_module_tracker
        if self._tracker_entered:
            self._tracker_entered = False
            try:
                tracker.__exit__()
            finally:
                tracker.observer = None
