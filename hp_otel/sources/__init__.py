"""Sources: framework hooks that feed the observer interface (`hp_otel.record.observer`).

Engines are rows of `ENGINES`: a name, the package that must be importable, and a
factory for the engine's sources.  A new engine is one new module here and one row;
module tracking (torch `nn.Module`, MindSpore `Cell`) and the graph-mode watch are
added to every engine by `default_sources`.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from hp_otel.record.observer import Source


@dataclass(frozen=True)
class Engine:
    name: str  # what CommDebugMode(engine=...) takes
    package: str  # importable when the framework is installed
    source_class: str  # "module:Class" of its source, imported only when used; the class takes no arguments

    def make_sources(self) -> list[Source]:
        module_name, _, class_name = self.source_class.partition(":")
        return [getattr(importlib.import_module(module_name), class_name)()]


ENGINES: tuple[Engine, ...] = (
    Engine("torch", "torch", "hp_otel.sources.pytorch.dtensor:TorchDTensorSource"),
    Engine("hyper_parallel", "hyper_parallel", "hp_otel.sources.hyper_parallel:HyperParallelSource"),
    Engine("mindspore", "mindspore", "hp_otel.sources.mindspore.collectives:MindSporeCollectiveSource"),
)
_BY_NAME = MappingProxyType({engine.name: engine for engine in ENGINES})
ENGINE_NAMES = ("auto", *_BY_NAME)


def check_engine(engine: Any) -> str:
    """A valid engine name whose framework is importable, or a clear error."""
    if not isinstance(engine, str) or engine not in ENGINE_NAMES:
        raise ValueError(f"engine must be one of {', '.join(map(repr, ENGINE_NAMES))}, got {engine!r}")
    if engine != "auto" and not importable(_BY_NAME[engine].package):
        raise ImportError(
            f"engine={engine!r} needs the {_BY_NAME[engine].package!r} package, which is not importable here"
        )
    return engine


_spec_cache: dict[tuple[str, tuple[str, ...]], bool] = {}


def importable(name: str) -> bool:
    """Whether `import name` would work; the file-system search is cached per sys.path
    (a search of every path entry, and "auto" asks at every window's start)."""
    if name in sys.modules:
        return True
    key = (name, tuple(sys.path))
    found = _spec_cache.get(key)
    if found is None:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if len(_spec_cache) > 64:
            _spec_cache.clear()
        _spec_cache[key] = found
    return found


def is_torch_module(module: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(module, torch.nn.Module)


def is_mindspore_cell(module: Any) -> bool:
    nn = sys.modules.get("mindspore.nn")
    return nn is not None and isinstance(module, nn.Cell)


def resolve_engine(engine: str, module: Any = None) -> str:
    """ "auto": hyper-parallel if importable; else MindSpore for a Cell or without torch; else torch
    (`default_sources` installs nothing for an engine whose package is not importable)."""
    if engine != "auto":
        return engine
    if importable("hyper_parallel"):
        return "hyper_parallel"
    if is_mindspore_cell(module) or not importable("torch"):
        return "mindspore"
    return "torch"


def module_tracker(module: Any) -> Source:
    """The module tracker for a torch `nn.Module` or a MindSpore `Cell`."""
    if is_mindspore_cell(module):
        from hp_otel.sources.mindspore.cells import MindSporeCellTracker

        return MindSporeCellTracker(module)
    from hp_otel.sources.pytorch.modules import TorchModuleTracker

    return TorchModuleTracker(module)


def check_settings() -> None:
    """The engines' settings from the environment (torch's: `hp_otel.sources.pytorch.settings`):
    a bad value raises a ValueError naming the variable. Imports no framework."""
    from hp_otel.sources.pytorch import settings

    settings.check()


def default_sources(module: Any = None, engine: str = "auto") -> list[Source]:
    """The engine's sources (see `resolve_engine`), module tracking when a module is given, graph-mode watch."""
    from hp_otel.sources.graph_mode import GraphModeWatch

    resolved = resolve_engine(check_engine(engine), module)
    chosen = _BY_NAME[resolved]
    # "auto" with no framework importable (a torch-free install): nothing to patch, rather than a
    # source whose attach fails and counts a fault in every window (an explicit engine is checked above)
    sources = chosen.make_sources() if importable(chosen.package) else []
    if module is not None:
        sources.append(module_tracker(module))
    # the optimizer step as a phase of its own (torch's global step hooks): torch engines only
    if resolved != "mindspore" and "torch" in sys.modules:
        from hp_otel.sources.pytorch.optimizer import OptimizerStepSource

        sources.append(OptimizerStepSource())
        if "deepspeed" in sys.modules:  # DeepSpeed's engine step and backward epilogue: only once it is imported
            from hp_otel.sources.pytorch.deepspeed import DeepSpeedPhaseSource

            sources.append(DeepSpeedPhaseSource(module))
    sources.append(GraphModeWatch())  # says once when the window met graph-mode code it cannot trace
    return sources
