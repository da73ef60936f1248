"""Sources: framework hooks that feed the observer interface (`hp_otel.observer`)."""

from __future__ import annotations

from typing import Any

from hp_otel.observer import Source


def default_sources(module: Any = None) -> list[Source]:
    """The sources for what is installed: PyTorch DTensor, plus module tracking when a module is given."""
    from hp_otel.sources.graph_mode import GraphModeWatch
    from hp_otel.sources.torch_dtensor import TorchDTensorSource
    from hp_otel.sources.torch_modules import TorchModuleTracker

    sources: list[Source] = [TorchDTensorSource()]
    if module is not None:
        sources.append(TorchModuleTracker(module))
    sources.append(GraphModeWatch())  # says once when the window met graph-mode code it cannot trace
    return sources
