"""The optimizer step as a phase of its own: `Optimizer.step` runs between torch's global
optimizer step hooks (`torch.optim.optimizer.register_optimizer_step_pre_hook` / `_post_hook`).

While a window is active the step is reported as a module span of the pseudo-module
`schema.OPTIMIZER_FQN` in phase `schema.PHASE_OPTIMIZER`, so the collectives issued inside it
(a sharded optimizer's all_gathers, a distributed grad norm) nest and count there.
"""

from __future__ import annotations

import contextvars
from typing import Any

import torch

from hp_otel.record.observer import Observer
from hp_otel.spans import schema
from hp_otel.spans.infos import ModuleInfo

_is_compiling = torch.compiler.is_compiling
_infos: dict[type, ModuleInfo] = {}


def _info(optimizer: Any) -> ModuleInfo:
    cls = type(optimizer)
    info = _infos.get(cls)
    if info is None:
        info = _infos[cls] = ModuleInfo(schema.OPTIMIZER_FQN, cls.__name__, cls.__qualname__, ())
    return info


_attached: list[OptimizerStepSource] = []  # the sources of the windows open now, outermost first
# True inside a framework's own step that is reported as the optimizer phase already (DeepSpeed's
# `engine.step()`, hp_otel.sources.pytorch.deepspeed): the torch optimizer it runs opens no second span.
_outer_step: contextvars.ContextVar[bool] = contextvars.ContextVar("hp_otel_outer_optimizer_step", default=False)


def outer_step_starts() -> contextvars.Token[bool]:
    """A framework's step, reported as the optimizer phase by its own source, starts on this thread."""
    return _outer_step.set(True)


def outer_step_ends(token: contextvars.Token[bool]) -> None:
    try:
        _outer_step.reset(token)
    except ValueError:  # ended in another context than started: leave that context alone
        _outer_step.set(False)


_registered: list[bool] = []


def _register_once() -> None:
    """torch's global step hooks, registered once per process and never removed: a window that
    opens or closes inside a step's hooks (the always-on instrumentor ends a step window in its
    own post-hook) would otherwise change torch's hook dict while torch iterates over it.
    Without a window they cost a loop over an empty list."""
    if _registered:
        return
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    register_optimizer_step_pre_hook(_pre)
    register_optimizer_step_post_hook(_post)
    _registered.append(True)


def _pre(optimizer: Any, args: Any, kwargs: Any) -> None:
    if _is_compiling() or _outer_step.get():
        return
    for source in tuple(_attached):
        source.step_starts(optimizer)


def _post(optimizer: Any, args: Any, kwargs: Any) -> None:
    if _is_compiling() or _outer_step.get():
        return
    for source in tuple(_attached):
        source.step_ends()


class OptimizerStepSource:
    """Reports every `Optimizer.step` of the process while attached (the hooks are global)."""

    def __init__(self) -> None:
        self._observer: Observer | None = None
        self._open = 0  # steps entered, not exited (a step that raised never runs its post-hook)

    def attach(self, observer: Observer) -> None:
        self._observer = observer
        self._open = 0
        _register_once()
        _attached.append(self)

    def detach(self) -> None:
        if self in _attached:
            _attached.remove(self)
        self._observer = None

    def step_starts(self, optimizer: Any) -> None:
        observer = self._observer
        if observer is None or not observer.accepting:
            return
        try:
            while self._open:  # an earlier step raised: its span ends before this one starts
                self._open -= 1
                observer.on_module_exit(schema.OPTIMIZER_FQN, schema.PHASE_OPTIMIZER, None)
            self._open += 1
            observer.on_module_enter(_info(optimizer), schema.PHASE_OPTIMIZER)
        except Exception as exc:
            observer.on_fault("optimizer_step_pre", exc)

    def step_ends(self) -> None:
        observer = self._observer
        if observer is None or not observer.accepting or not self._open:
            return
        try:
            self._open -= 1
            observer.on_module_exit(schema.OPTIMIZER_FQN, schema.PHASE_OPTIMIZER, None)
        except Exception as exc:
            observer.on_fault("optimizer_step_post", exc)
