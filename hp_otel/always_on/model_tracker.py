"""Which model is being trained, found without the user saying so (for zero-code runs).

Under `opentelemetry-instrument` nobody passes `module=`, yet module attribution needs
the model. Until it is found, a global forward pre-hook remembers every `nn.Module`
that runs; at an `optimizer.step()` the model is the module that holds the most of
that optimizer's parameters (ties: the one holding the most parameters, i.e. the
outermost). Then the hook is removed: steps after that pay nothing for the search.
"""

from __future__ import annotations

import logging
import threading
import weakref
from typing import Any

logger = logging.getLogger("hp_otel")


class ModelTracker:
    """Remembers the modules that ran forward, until `find()` names the model."""

    def __init__(self) -> None:
        self._seen: weakref.WeakSet[Any] = weakref.WeakSet()
        self._handle: Any = None
        self._lock = threading.Lock()

    @property
    def tracking(self) -> bool:
        return self._handle is not None

    def start(self) -> bool:
        """Install the hook (False without torch)."""
        try:
            from torch.nn.modules.module import register_module_forward_pre_hook
        except ImportError:
            return False
        with self._lock:
            if self._handle is None:
                self._handle = register_module_forward_pre_hook(self._saw)
        return True

    def stop(self) -> None:
        with self._lock:
            handle, self._handle = self._handle, None
            self._seen = weakref.WeakSet()
        if handle is not None:
            handle.remove()

    def _saw(self, module: Any, args: Any) -> None:
        try:
            self._seen.add(module)
        except Exception:  # never break a forward
            logger.debug("hp_otel: could not remember a module", exc_info=True)

    def find(self, optimizer: Any = None) -> Any:
        """The model `optimizer` trains (or, without one, the largest module seen); None if none ran yet."""
        seen = list(self._seen)
        if not seen:
            return None
        trained: set[int] = set()
        if optimizer is not None:
            trained = {id(p) for group in getattr(optimizer, "param_groups", ()) for p in group["params"]}

        def score(module: Any) -> tuple[int, int]:
            own = [id(p) for p in module.parameters()]
            return sum(1 for p in own if p in trained), len(own)

        best = max(seen, key=score)
        held, total = score(best)
        if optimizer is not None and trained and not held:
            return None  # the optimizer trains none of the modules that ran
        return best if total else None
