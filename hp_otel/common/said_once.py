"""What hp_otel says once per process: one record for every "said once" line.

A line that would repeat at every window, step or call (a setting that falls back, a module that
takes no hooks, a gate that is not built) is worth one log line, not thousands. Each place that
says such a line names its room (its module, `__name__`) and what it says; this module remembers
which were said, so there is one rule for "once" and one way for tests to hear a line again
(`forget`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Hashable
from typing import Any

logger = logging.getLogger("hp_otel")

_lock = threading.Lock()
_said: set[tuple[str, Hashable]] = set()


def first_time(room: str, what: Hashable) -> bool:
    """True the first time `room` asks about `what` in this process (and records it), False after."""
    key = (room, what)
    with _lock:
        if key in _said:
            return False
        _said.add(key)
        return True


def already_said(room: str, what: Hashable) -> bool:
    """Whether `room` has said `what` (without recording it)."""
    with _lock:
        return (room, what) in _said


def log_once(room: str, what: Hashable, message: str, *args: Any, level: int = logging.WARNING) -> bool:
    """Log `message % args` on the "hp_otel" logger the first time only; True when it was logged."""
    if not first_time(room, what):
        return False
    logger.log(level, message, *args)
    return True


def forget(room: str | None = None) -> None:
    """Let `room`'s lines (every room's with None) be said again: tests, and a component reset."""
    with _lock:
        if room is None:
            _said.clear()
        else:
            _said.difference_update({key for key in _said if key[0] == room})
