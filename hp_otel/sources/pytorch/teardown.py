"""Let destroyed process groups go before the interpreter exits, so a job that trained fine exits 0.

`torch.distributed.nn.functional` binds `group=group.WORLD` as a default argument of ten
functions when it is imported.  Imported after `init_process_group()` — `torch._dynamo`
imports it, and registering hp_otel's collective kernels imports dynamo — those defaults keep
the default group alive after `destroy_process_group()`.  Its gloo worker threads then live
into interpreter finalisation, where one that is still dropping a finished work's tensors takes
the GIL and the process aborts ("terminate called without an active exception", SIGABRT;
pytorch#190489, pytorch#179291).  Seen as a rank killed at exit in a 2-rank gloo job.

At exit (an `atexit` handler, which runs while other threads can still take the GIL), every
such default that holds a group torch no longer has is set to None — what the function does
with `group=None` is the same, the default group at call time — so the group is destroyed
then, its threads joined, before finalisation.  Defaults holding a live group (the user did
not destroy it) are left alone.
"""

from __future__ import annotations

import atexit
import logging
import sys
from typing import Any

from hp_otel.sources.pytorch import _compat

logger = logging.getLogger(__name__)
PINNING_MODULE = "torch.distributed.nn.functional"
_registered = False


def _is_process_group(value: Any) -> bool:
    group_type = getattr(sys.modules.get("torch.distributed"), "ProcessGroup", None)
    return group_type is not None and isinstance(value, group_type)


def release_destroyed_groups() -> int:
    """Drop default arguments that still hold a destroyed process group; how many were dropped."""
    module = sys.modules.get(PINNING_MODULE)
    if module is None:
        return 0
    live = _compat.live_process_groups()
    released = 0
    for value in list(vars(module).values()):
        defaults = getattr(value, "__defaults__", None)
        if not defaults or getattr(value, "__module__", None) != PINNING_MODULE:
            continue
        kept = tuple(None if _is_process_group(d) and id(d) not in live else d for d in defaults)
        if kept != defaults:
            value.__defaults__ = kept
            released += 1
    return released


def _at_exit() -> None:
    try:
        released = release_destroyed_groups()
    except Exception:  # exit must go on whatever torch looks like
        logger.debug("hp_otel: could not release destroyed process groups at exit", exc_info=True)
        return
    if released:
        logger.debug("hp_otel: released a destroyed process group held by %d default arguments", released)


def register_once() -> None:
    """Register the exit handler (once per process; called when the torch source is first used)."""
    global _registered
    if not _registered:
        _registered = True
        atexit.register(_at_exit)
