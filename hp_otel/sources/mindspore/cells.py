"""Module tracking for MindSpore `Cell`s (PyNative), forward and backward.

Forward: a pre-hook registered first and a post-hook with `always_call=True` (it runs
when `construct` raises).  Backward: `register_backward_pre_hook` opens the cell's
backward span when its output gradients arrive, `register_backward_hook` closes it.
MindSpore does not nest backward hooks strictly (a parent's post hook can fire before
its child's), which the span builder handles: an exit closes the matching open span
wherever it is.  Names are `cells_and_names()` names, the root is "(root)".  Hooks do
not fire inside `@jit` (graph mode).  `module_depth=` hooks the cells down to that depth, as
for torch modules (`hp_otel.sources.module_depth`).
"""

from __future__ import annotations

import sys
from typing import Any

from hp_otel.record.observer import Observer
from hp_otel.sources.module_depth import hooked_within
from hp_otel.sources.patching import run_every
from hp_otel.spans import schema
from hp_otel.spans.codec import placements_text
from hp_otel.spans.infos import ModuleInfo, ParameterInfo


def parameter_infos(cell: Any) -> tuple[ParameterInfo, ...]:
    """The cell's own parameters (not its children's)."""
    infos = []
    for name, param in cell.parameters_and_names(expand=False):
        placements = getattr(param, "placements", None)  # a hyper-parallel DTensor parameter
        infos.append(
            ParameterInfo(
                name=name.rsplit(".", 1)[-1],
                shape=tuple(int(d) for d in param.shape),
                dtype=str(param.dtype),
                placements=placements_text(placements) if placements is not None else "",
            )
        )
    return tuple(infos)


class _TrackedCell:
    """Hooks for one cell; they report only while the tracker is installed."""

    def __init__(self, tracker: MindSporeCellTracker, fqn: str, cell: Any) -> None:
        self.tracker = tracker
        self.fqn = fqn or schema.ROOT_MODULE_FQN
        self.info = ModuleInfo(self.fqn, fqn or type(cell).__name__, type(cell).__qualname__, parameter_infos(cell))

    def _observer(self) -> Observer | None:
        observer = self.tracker.observer
        return observer if observer is not None and observer.accepting else None

    def forward_pre(self, cell: Any, args: Any) -> None:
        observer = self._observer()
        if observer is not None:
            observer.on_module_enter(self.info, schema.PHASE_FORWARD)

    def forward_post(self, cell: Any, args: Any, output: Any) -> None:
        observer = self._observer()
        if observer is not None:
            error = sys.exc_info()[1]  # set when construct raised (always_call hooks run while it propagates)
            observer.on_module_exit(self.fqn, schema.PHASE_FORWARD, error)

    def backward_pre(self, cell: Any, grad_output: Any) -> None:
        observer = self._observer()
        if observer is not None:
            observer.on_module_enter(self.info, schema.PHASE_BACKWARD)

    def backward_post(self, cell: Any, grad_input: Any, grad_output: Any) -> None:
        observer = self._observer()
        if observer is not None:
            observer.on_module_exit(self.fqn, schema.PHASE_BACKWARD)


def _is_container(cell: Any) -> bool:
    """A `CellList` or `CellDict`: never called (its `construct` raises), only its children are."""
    nn = sys.modules.get("mindspore.nn")
    kinds = tuple(k for k in (getattr(nn, "CellList", None), getattr(nn, "CellDict", None)) if isinstance(k, type))
    return bool(kinds) and isinstance(cell, kinds)


class MindSporeCellTracker:
    """Source of module enter/exit events for one `Cell` tree."""

    def __init__(self, root: Any) -> None:
        self.root = root
        self.observer: Observer | None = None
        self._handles: list[Any] = []

    def attach(self, observer: Observer) -> None:
        self.observer = observer
        depth = observer.module_depth  # a deeper cell's work counts for its ancestor at the depth
        for fqn, cell in hooked_within(list(self.root.cells_and_names()), depth, _is_container):
            tracked = _TrackedCell(self, fqn, cell)
            self._handles.append(cell.register_forward_pre_hook(tracked.forward_pre, prepend=True))
            self._handles.append(cell.register_forward_hook(tracked.forward_post, always_call=True))
            self._handles.append(cell.register_backward_pre_hook(tracked.backward_pre))
            self._handles.append(cell.register_backward_hook(tracked.backward_post))

    def detach(self) -> None:
        self.observer = None
        handles, self._handles = self._handles, []
        run_every(handle.remove for handle in handles)
