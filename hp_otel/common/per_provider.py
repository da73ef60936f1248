"""One object per OpenTelemetry provider, made on first use (hp_otel's tracer, its metric instruments)."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class _GlobalProvider:
    """The weak-referenceable key standing for "no provider given": OTel's global one."""


class PerProvider(Generic[T]):
    """Made once per provider (making a tracer or instruments is not free); a provider
    that is dropped drops its entry (weak keys), so no provider is kept alive here."""

    def __init__(self) -> None:
        self._made: weakref.WeakKeyDictionary[Any, T] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        # The last provider asked for (weakly) and its object: a window per step asks for the same one.
        self._last: tuple[weakref.ref[Any], T] | None = None

    def get(self, provider: Any, make: Callable[[], T]) -> T:
        """The object of `provider` (None: the global provider), made by `make()` the first time."""
        key = _GlobalProvider if provider is None else provider
        last = self._last
        if last is not None and last[0]() is key:
            return last[1]
        with self._lock:
            made = self._made.get(key)
            if made is None:
                made = self._made[key] = make()
            self._last = (weakref.ref(key), made)
            return made
