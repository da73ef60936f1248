"""Hooks kept between windows: `hp_otel.install()` and `hp_otel.uninstall()`.

By default a window installs its hooks on entry and removes them on exit, restoring
every patched attribute exactly.  Installing and removing costs about as much as
recording a small step (module hooks on every submodule, the redistribute wrapper), so
a loop that opens a window per step can keep them: after `install()`, the hooks a window
installed stay in place when it closes and pass every call straight through (one flag
read) until the next window switches recording on.  `uninstall()` removes all of them,
exactly as a closing window would.

Several holders can keep hooks (the user's `install()`, the always-on instrumentor);
hooks linger while any holder remains.  What lingers registers a remover here.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

logger = logging.getLogger("hp_otel")

USER = "hp_otel.install()"

_lock = threading.RLock()
_holders: set[str] = set()
# id(owner) -> (owner, remover): what lingers, in the order it was left installed.
_lingering: dict[int, tuple[object, Callable[[], None]]] = {}
_uninstalls = [0]  # how many times uninstall() ran: what a window did before it is forgotten


def keeping() -> bool:
    """True while some holder keeps hooks installed between windows."""
    return bool(_holders)


def linger(owner: object, remove: Callable[[], None]) -> None:
    """`owner`'s hooks stay installed; `remove()` takes them out when nobody keeps them any more."""
    with _lock:
        _lingering[id(owner)] = (owner, remove)


def claim(owner: object) -> bool:
    """A window uses `owner`'s hooks again: they no longer linger (True if they did)."""
    with _lock:
        return _lingering.pop(id(owner), None) is not None


def hold(holder: str) -> None:
    """`holder` keeps hooks installed between windows (idempotent)."""
    with _lock:
        _holders.add(holder)


def release(holder: str) -> None:
    """`holder` no longer keeps hooks; when no holder is left, lingering hooks are removed."""
    with _lock:
        _holders.discard(holder)
        if not _holders:
            _remove_lingering()


def install() -> None:
    """Keep hp_otel's hooks installed between windows, so a window per step pays no install.

    Between windows the hooks pass calls straight through; `uninstall()` removes them. Says what it
    did in one INFO line: hooks a closed window already removed are not brought back, the next
    window installs them (and they then stay).
    """
    with _lock:
        if USER in _holders:
            logger.info("hp_otel.install(): already keeping hooks between windows; nothing changed")
            return
        hold(USER)
        kept = len(_lingering)
    if kept:
        now = f"the {kept} hook set(s) installed now stay"
    else:
        now = "none is installed now (a window removes its own when it closes), the next window installs them"
    logger.info(
        "hp_otel.install(): the hooks windows install now stay installed between windows, passing calls "
        "through, until hp_otel.uninstall(); %s",
        now,
    )


def uninstall() -> None:
    """Remove every hook hp_otel keeps installed, restoring what it patched exactly.

    Hooks of windows still open are removed when those windows close (torch's collective
    kernels too: the last window out unregisters them).  Releases every holder (the
    instrumentor's too: its later windows install and remove their own).
    """
    with _lock:
        _holders.clear()
        _uninstalls[0] += 1
        _remove_lingering()


def uninstalls() -> int:
    """How many times `uninstall()` ran (hooks that adapt to how windows follow each other start
    afresh after it)."""
    return _uninstalls[0]


def lingering_count() -> int:
    """How many hook sets are installed with no window using them (0 after `uninstall()`)."""
    with _lock:
        return len(_lingering)


def _remove_lingering() -> None:
    """Run every remover, newest first; one that fails does not stop the others."""
    pending = list(_lingering.values())
    _lingering.clear()
    for _owner, remove in reversed(pending):
        try:
            remove()
        except Exception:  # a hook that cannot be removed must not keep the others in
            logger.warning("hp_otel: removing kept hooks failed", exc_info=True)
