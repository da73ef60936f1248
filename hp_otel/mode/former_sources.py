"""Sources written with the former method names, `install(observer)` / `uninstall()`: their adapter."""

from __future__ import annotations

import warnings
from typing import Any

from hp_otel.common import said_once
from hp_otel.record.observer import Observer, Source

SAID_ONCE_KEY = "hp_otel.mode"  # the said-once owner of the mode's one-time messages (said_once.forget)


class InstallUninstall:
    """Adapts a source written with the former names, `install(observer)` / `uninstall()`."""

    __slots__ = ("source",)

    def __init__(self, source: Any) -> None:
        self.source = source

    def attach(self, observer: Observer) -> None:
        self.source.install(observer)

    def detach(self) -> None:
        self.source.uninstall()


def attachable(source: Any) -> Source:
    """The source, or for one with only the former method names its adapter (warned once per class)."""
    if callable(getattr(source, "attach", None)) and callable(getattr(source, "detach", None)):
        return source  # every window asks, for every source: no generator here
    cls = type(source)
    if said_once.first_time(SAID_ONCE_KEY, ("former source names", cls.__module__, cls.__qualname__)):
        warnings.warn(
            f"{cls.__qualname__}: a source's install(observer) / uninstall() are now attach(observer) / detach(); "
            "rename them (the former names still work for now)",
            DeprecationWarning,
            stacklevel=5,  # attachable -> _setup's generator -> _setup -> __init__ -> the caller
        )
    return InstallUninstall(source)
