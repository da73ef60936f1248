"""DeepSpeed's engine in the phases its users name: `engine.step()` is `optimizer`, the backward
epilogue (`DeepSpeedEngine._backward_epilogue`, the gradient all_reduce / reduce_scatter after
autograd) is `backward`.

Both run outside every module and outside autograd, so without this their collectives (ZeRO's
gradient reduction, the all_gather of the updated partitions after the step) count as `outside`;
torch's optimizer step hooks see only the plain optimizer inside ZeRO's, which issues none.

While a window is attached the two methods are wrapped on `DeepSpeedEngine` itself — only when
DeepSpeed is imported already (hp_otel never imports it) — and restored object for object when
the last window closes (`SharedPatches`). The step is a span of the pseudo-module `(optimizer)`
named by DeepSpeed's optimizer class (the torch optimizer inside it opens none of its own); the
epilogue is a backward span of the root module `(root)`: the gradients it reduces are the model's.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from types import MappingProxyType
from typing import Any

from hp_otel.record.observer import Observer
from hp_otel.sources.patching import AttributePatch, SharedPatches, patch_owned
from hp_otel.sources.pytorch import optimizer as torch_optimizer
from hp_otel.spans import schema
from hp_otel.spans.infos import ModuleInfo

ENGINE_MODULE = "deepspeed.runtime.engine"
STEP = "step"
BACKWARD_EPILOGUE = "_backward_epilogue"
_PHASES = MappingProxyType({STEP: schema.PHASE_OPTIMIZER, BACKWARD_EPILOGUE: schema.PHASE_BACKWARD})
_attached: list[DeepSpeedPhaseSource] = []  # the sources of the windows open now, outermost first
_infos: dict[tuple[str, type], ModuleInfo] = {}


def loaded_engine_class() -> type | None:
    """`DeepSpeedEngine` if DeepSpeed's engine module is imported, else None (never imported here)."""
    module = sys.modules.get(ENGINE_MODULE)
    engine = getattr(module, "DeepSpeedEngine", None) if module is not None else None
    return engine if isinstance(engine, type) else None


def _info(fqn: str, obj: Any) -> ModuleInfo:
    """The span's module: made once per class (ModuleInfo is compared by identity)."""
    cls = type(obj)
    info = _infos.get((fqn, cls))
    if info is None:
        info = _infos[(fqn, cls)] = ModuleInfo(fqn, cls.__name__, cls.__qualname__, ())
    return info


def _span_module(name: str, engine: Any, root: Any) -> ModuleInfo:
    if name == STEP:
        return _info(schema.OPTIMIZER_FQN, getattr(engine, "optimizer", engine))
    return _info(schema.ROOT_MODULE_FQN, root if root is not None else getattr(engine, "module", engine))


def _wrap_for(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    phase = _PHASES[name]

    def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def wrapper(engine: Any, *args: Any, **kwargs: Any) -> Any:
            sources = tuple(_attached)
            if not sources:  # kept between windows (`hp_otel.install()`): nothing records
                return original(engine, *args, **kwargs)
            entered = [source for source in sources if source.enter(name, phase, engine)]
            outer = torch_optimizer.outer_step_starts() if phase == schema.PHASE_OPTIMIZER else None
            try:
                return original(engine, *args, **kwargs)
            finally:
                if outer is not None:
                    torch_optimizer.outer_step_ends(outer)
                for source in reversed(entered):
                    source.exit(phase)

        wrapper.__hp_otel_original__ = original  # type: ignore[attr-defined]
        return wrapper

    return wrap


def _plan() -> list[AttributePatch] | None:
    engine = loaded_engine_class()
    if engine is None:  # DeepSpeed not imported: nothing to wrap (a later window looks again)
        return None
    return patch_owned(engine, (STEP, BACKWARD_EPILOGUE), _wrap_for)


deepspeed_patches = SharedPatches(_plan)


class DeepSpeedPhaseSource:
    """Reports `DeepSpeedEngine.step` (optimizer) and its backward epilogue (backward) while attached.

    `root`: the window's module (the epilogue's span is named by its class), None without one."""

    def __init__(self, root: Any = None) -> None:
        self._root = root
        self._observer: Observer | None = None
        self._held = False
        self._open: list[str] = []  # the phases entered, not exited yet

    def attach(self, observer: Observer) -> None:
        self._observer = observer
        self._open = []
        self._held = deepspeed_patches.acquire()
        _attached.append(self)

    def detach(self) -> None:
        if self in _attached:
            _attached.remove(self)
        self._observer = None
        if self._held:
            self._held = False
            deepspeed_patches.release()

    def enter(self, name: str, phase: str, engine: Any) -> bool:
        """The method `name` starts: its span opens (True), or the window takes nothing now (False)."""
        observer = self._observer
        if observer is None or not observer.accepting:
            return False
        try:
            observer.on_module_enter(_span_module(name, engine, self._root), phase)
        except Exception as exc:
            observer.on_fault(f"deepspeed_{name}_enter", exc)
            return False
        self._open.append(phase)
        return True

    def exit(self, phase: str) -> None:
        observer = self._observer
        if observer is None or phase not in self._open:  # detached meanwhile, or a window opened inside
            return
        self._open.remove(phase)
        try:
            fqn = schema.OPTIMIZER_FQN if phase == schema.PHASE_OPTIMIZER else schema.ROOT_MODULE_FQN
            observer.on_module_exit(fqn, phase, None)
        except Exception as exc:
            observer.on_fault(f"deepspeed_{phase}_exit", exc)
