"""Hold back Ctrl-C (and SIGTERM) while hp_otel installs or removes its hooks.

Python runs a signal's handler between two bytecodes of the main thread, so a
`KeyboardInterrupt` can land half-way through installing function modes, module hooks
and patches, leaving some in place for good. While a window is open on the main thread
the SIGINT/SIGTERM handlers set from Python are replaced by one guard: while
`CommDebugMode.__enter__` / `__exit__` install or uninstall (and at the very first
instruction of those calls, which no code inside them could protect) it only notes the
signal, and sends it again when they are done, so your handler runs (and a
KeyboardInterrupt is raised) right after; anywhere else it calls your handler at once,
so the body of a window is interrupted exactly as before.

When the last window closes your handlers are put back (unless you set others
meanwhile: then those stay). Only handlers set from Python are guarded (a signal at the
OS default kills the process anyway), and only from the main thread (the only one
Python runs handlers on). A window entered on the main thread may be closed on another,
where Python sets no handler: the guard then stays in place, passing each signal straight
to your handler, and puts your handlers back itself at the first signal it handles (or the
next window on the main thread does).
"""

from __future__ import annotations

import dis
import signal
import threading
from collections.abc import Callable
from types import CodeType, FrameType
from typing import Any

try:  # the C functions: `signal.signal` wraps them in Python (enum conversions), more places to interrupt
    import _signal as _c_signal
except ImportError:  # pragma: no cover - other interpreters
    _c_signal = signal  # type: ignore[assignment]

GUARDED_SIGNALS = tuple(int(getattr(signal, name)) for name in ("SIGINT", "SIGTERM") if hasattr(signal, name))


class _Guard:
    """The one handler installed while windows are open on the main thread."""

    def __init__(self) -> None:
        self.originals: dict[int, Any] = {}  # the handlers it stands in for
        self.held: list[int] = []
        self.windows = 0  # open windows that installed it
        self.critical = 0  # installs and uninstalls under way (any thread)
        self.protected: dict[CodeType, int] = {}  # code -> offset of its first instruction

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if self._must_hold(frame):
            self.held.append(signum)
            return
        if self.windows == 0:  # the last window closed on another thread: yours go back now (main thread)
            _put_back()
        handler = self.originals.get(signum)
        if callable(handler):
            handler(signum, frame)
        elif signum == signal.SIGINT:
            signal.default_int_handler(signum, frame)
        else:  # nothing to stand in for: act as the OS default would
            _c_signal.signal(signum, signal.SIG_DFL)
            signal.raise_signal(signum)

    def _must_hold(self, frame: FrameType | None) -> bool:
        """The main thread is installing or uninstalling, or at the first instruction of a protected call."""
        protected = self.protected
        while frame is not None:
            start = protected.get(frame.f_code)
            if start is not None:
                return self.critical > 0 or frame.f_lasti <= start
            frame = frame.f_back
        return False


_guard = _Guard()
GUARD = _guard  # `GUARD.critical += 1` is the first statement of a protected call: no signal can land before it


def protect(function: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator for a call that runs `GUARD.critical += 1` first and `GUARD.critical -= 1; send_held()` last.

    A signal that Python handles at its very first instruction (before that statement)
    is held too.
    """
    code = function.__code__
    _guard.protected[code] = next(i.offset for i in dis.get_instructions(code) if i.opname == "RESUME")
    return function


def acquire() -> bool:
    """Guard the handlers for one more open window; False (nothing to release) off the main thread."""
    if threading.current_thread() is not threading.main_thread():
        return False
    if _guard.windows == 0:
        for signum in GUARDED_SIGNALS:
            handler = _c_signal.getsignal(signum)
            if handler is _guard:  # put back by code that saved it: it still stands in for the same handler
                continue
            if callable(handler):
                _guard.originals[signum] = handler
                _c_signal.signal(signum, _guard)
            else:
                _guard.originals.pop(signum, None)
    _guard.windows += 1
    return True


def release() -> None:
    """One window that `acquire()`d closed; the last one puts the handlers back (from another
    thread, where Python sets none, the guard does at the next signal: see `_Guard.__call__`)."""
    _guard.windows -= 1
    if _guard.windows > 0 or threading.current_thread() is not threading.main_thread():
        return
    _put_back()


def _put_back() -> None:
    for signum, handler in _guard.originals.items():
        if _c_signal.getsignal(signum) is _guard:  # a handler you set meanwhile stays
            _c_signal.signal(signum, handler)


def send_held() -> None:
    """After `GUARD.critical -= 1`: once nothing is being installed, send the signals held meanwhile again.

    On the main thread their handler runs right here (SIGINT's default raises
    KeyboardInterrupt); from another thread the main thread gets them at its next step.
    """
    if _guard.critical > 0:
        return
    while _guard.held:
        signal.raise_signal(_guard.held.pop(0))


def is_installed(signum: int = int(signal.SIGINT)) -> bool:
    """True while the guard stands in for this signal's handler."""
    return _c_signal.getsignal(signum) is _guard
