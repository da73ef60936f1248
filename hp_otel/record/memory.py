"""Giving freed memory back to the operating system after a large window is cleared.

Freeing 10⁵ spans returns their memory to the Python and C allocators, not to the
system: the process's RSS stays high until the heap's free pages are handed back.
`return_freed_memory()` collects reference cycles, then asks glibc to trim its heap
(`malloc_trim(0)`); on other C libraries it only collects.
"""

from __future__ import annotations

import ctypes
import functools
import gc
from collections.abc import Callable


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL(None).malloc_trim  # type: ignore[no-any-return]
    except (AttributeError, OSError):  # not glibc (musl, macOS, Windows)
        return None


_malloc_trim()  # looked up now: at clear() its ctypes objects would land among the blocks just freed


def return_freed_memory() -> None:
    """Collect cycles, then hand the C heap's free pages back to the system where the C library can."""
    gc.collect()
    trim = _malloc_trim()
    if trim is not None:
        try:
            trim(0)
        except Exception:  # pragma: no cover - a C library refusing must not break clear()
            pass
