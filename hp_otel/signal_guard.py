"""Hold back Ctrl-C (and SIGTERM) while hp_otel installs or removes its hooks.

Python runs a signal's handler between any two bytecodes of the main thread, so a
`KeyboardInterrupt` can land half-way through installing function modes, module hooks
and patches, leaving some in place for good. `signals_deferred()` swaps the Python-level
handlers for one that only notes the signal, and once the block is done puts the
handlers back and calls them with what arrived, so the interrupt is raised (or whatever
your handler does) right after the block: installing and removing stay all-or-nothing.

Only handlers set from Python are swapped (a signal left at the OS default kills the
process anyway), only on the main thread (the only one Python runs handlers on), and
never twice (a deferral inside a deferral keeps the outer one's handler).
"""

from __future__ import annotations

import signal
import threading
from types import FrameType, TracebackType
from typing import Any

try:  # the C functions themselves: `signal.signal` wraps them in Python (enum conversions), more places to interrupt
    import _signal as _c_signal
except ImportError:  # pragma: no cover - other interpreters
    _c_signal = signal  # type: ignore[assignment]

DEFERRED_SIGNALS = tuple(int(getattr(signal, name)) for name in ("SIGINT", "SIGTERM") if hasattr(signal, name))


class _Hold:
    """The stand-in handler: remembers each signal that arrives while the block runs."""

    def __init__(self) -> None:
        self.caught: list[tuple[int, FrameType | None]] = []

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.caught.append((signum, frame))


class signals_deferred:  # used like a function: `with signals_deferred():`
    """Context manager: the block's signals are delivered to their handlers after it ends."""

    __slots__ = ("_hold", "_saved")

    def __enter__(self) -> signals_deferred:
        self._hold = _Hold()
        self._saved: list[tuple[int, Any]] = []
        if threading.current_thread() is not threading.main_thread():
            return self
        try:
            for signum in DEFERRED_SIGNALS:
                handler = _c_signal.getsignal(signum)
                if callable(handler) and not isinstance(handler, _Hold):
                    _c_signal.signal(signum, self._hold)
                    self._saved.append((signum, handler))
        except BaseException:  # not the main interpreter, or interrupted while swapping
            self._restore()
            raise
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._restore()
        caught, self._hold.caught = self._hold.caught, []
        handlers = dict(self._saved)
        for signum, frame in caught:
            handlers[signum](signum, frame)  # the default SIGINT handler raises KeyboardInterrupt here

    def _restore(self) -> None:
        """Put every saved handler back, even if a restored one raises on a signal meanwhile."""
        saved, self._saved = self._saved, []
        self._restore_from(saved, 0)
        self._saved = saved  # kept for delivering what was caught

    def _restore_from(self, saved: list[tuple[int, Any]], index: int) -> None:
        if index < len(saved):
            try:
                _c_signal.signal(*saved[index])
            finally:
                self._restore_from(saved, index + 1)
