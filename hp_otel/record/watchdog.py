"""A hang leaves evidence: each rank writes its spans so far when a collective does not complete.

`CommDebugMode(watchdog=HangWatchdog(timeout_s=60))` starts one daemon thread for the
window.  Every `poll_s` it looks at the collectives this rank issued that have not
completed (the recorder's in-flight records: issue time, sequence number, module); when
one has waited `timeout_s`, it writes the window's spans so far — the in-flight
collective included, marked `hp_otel.collective.in_flight` with its issue time as start — to
`path` (`{rank}` filled in), logs where, and puts an `hp_otel.watchdog.dump` event on the
collective's span.  Run `hp-otel ranks` on every rank's file to see who is missing.

With `on_signals=(signal.SIGTERM, signal.SIGINT)` the same file is also written when the
job is stopped, then the signal's previous handler runs (the default one still ends the
process).  Python runs signal handlers in the main thread between bytecodes, so a rank
blocked inside a collective writes on the watchdog's timeout rather than on the signal:
use both.

The watchdog never kills, raises into or slows training much: it only reads what the recorder
already keeps and writes a file; a failure of its own is logged once and it goes on. After
a file that took W seconds to write it waits `QUIET_FACTOR` × W before writing again, so the
training thread loses at most a tenth of its time to the writing, however large the file.

The file is replaced atomically: while it is written it has no name (Linux `O_TMPFILE`), so a
process killed meanwhile, by SIGTERM, SIGKILL or any other signal, leaves the previous
complete file, never a partial or temporary one (see `hp_otel.common.files`).

It knows the window through two things the mode hands it when the window opens
(`start`): the window's in-flight collectives (`InFlightCollectives`, the recorder) and a
writer of its spans so far (`CommDebugMode.write_spans`) — not the mode itself.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from hp_otel.common.rank_set import RankSet
from hp_otel.record.events import CollectiveIssue

logger = logging.getLogger("hp_otel")

DEFAULT_PATH = "hp_otel_hang_rank{rank}.json"

# Writes the window's spans so far, the in-flight collectives included, to a path (any thread).
SpansWriter = Callable[[str], None]


class InFlightCollectives(Protocol):
    """The collectives a window issued that have not completed (`WindowRecorder` keeps them)."""

    def forget_completed(self) -> None:
        """Drop the returned ones whose work is done (asked from the watchdog's thread)."""

    def in_flight(self) -> list[CollectiveIssue]:
        """The rest, oldest first; the watchdog marks the ones it wrote (`dumped_to`, `waited_s`)."""


# After writing a file that took W seconds, the thread writes again no sooner than QUIET_FACTOR * W later:
# encoding the spans holds the interpreter, so the training thread loses at most 1 / (1 + QUIET_FACTOR)
# of its time to the watchdog's writing, however large the file (collectives stuck meanwhile are
# written with the next file).
QUIET_FACTOR = 9.0

# The longest wait the watchdog's thread can take (threading's limit, about 292 years); inf, or an int
# too large for a float, failed later: in float() here, or in the thread's Event.wait / int(timeout_s * 1e9).
MAX_SECONDS = int(threading.TIMEOUT_MAX)


def _is_seconds(value: Any) -> bool:
    """A real number (not a bool) in (0, MAX_SECONDS]."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value <= MAX_SECONDS


EVIDENCE = ("spans", "collectives")  # what the watchdog's file holds (CommDebugMode writes either)


def _check_folder(path: Any) -> None:
    """`path` (with `{rank}` filled in) as a file in an existing, writable folder, or an error naming it."""
    from hp_otel.common.files import check_path
    from hp_otel.common.launcher_env import current_rank

    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
        raise TypeError(f"path must be a non-empty path (str or os.PathLike), got {path!r}")
    if not isinstance(os.fspath(path), str):
        raise TypeError(f"path must be a text path, got bytes {os.fspath(path)!r}")
    target = check_path(os.fspath(path).replace("{rank}", str(current_rank())), "path")
    folder = os.path.dirname(os.path.abspath(target))
    if not os.access(folder, os.W_OK | os.X_OK):
        raise PermissionError(f"path: folder {folder!r} is not writable: the hang evidence could not be written")


class HangWatchdog:
    """Writes every rank's spans so far when one of its collectives has not completed in `timeout_s`.

    Args:
        timeout_s: how long a collective may take before the file is written (> 0).
        path: the file; `{rank}` becomes this process's rank. Its folder must exist and be writable
            (checked here: a missing one is refused now, not found out when a collective hangs).
        on_signals: signals that also write the file (e.g. `(signal.SIGTERM, signal.SIGINT)`);
            installed only when the window is entered on the main thread.
        poll_s: how often the thread looks (default: a quarter of the timeout, at most 1 s).
        evidence: what the file holds: `"spans"` (OTLP/JSON, every span so far) or `"collectives"`
            (the collectives file `hp-otel ranks` reads, a few percent of the spans file and
            cheaper to write while thousands of ranks hang).
    """

    def __init__(
        self,
        timeout_s: float,
        path: str | os.PathLike[str] = DEFAULT_PATH,
        *,
        on_signals: Iterable[int] = (),
        poll_s: float | None = None,
        evidence: str = "spans",
    ) -> None:
        if not _is_seconds(timeout_s):
            raise ValueError(
                f"timeout_s must be a positive number of seconds, at most {MAX_SECONDS}, got {timeout_s!r}"
            )
        _check_folder(path)  # now, not when a collective hangs and the evidence cannot be written
        if poll_s is not None and not _is_seconds(poll_s):
            raise ValueError(
                f"poll_s must be a positive number of seconds, at most {MAX_SECONDS}, or None, got {poll_s!r}"
            )
        if evidence not in EVIDENCE:
            raise ValueError(f"evidence must be one of {', '.join(map(repr, EVIDENCE))}, got {evidence!r}")
        self.evidence = evidence
        signals = tuple(on_signals)
        valid = set(signal.valid_signals())
        for sig in signals:
            if sig not in valid or sig in (signal.SIGKILL, getattr(signal, "SIGSTOP", -1)):
                raise ValueError(f"on_signals: {sig!r} is not a signal that can be caught")
        self.timeout_s = float(timeout_s)
        self.path_template = os.fspath(path)
        self.on_signals = signals
        self.poll_s = float(poll_s) if poll_s is not None else min(self.timeout_s / 4, 1.0)
        self.written: list[str] = []  # every file this watchdog wrote, in order
        self._collectives: InFlightCollectives | None = None
        self._write_spans: SpansWriter | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._previous: dict[int, Any] = {}
        self._failed = False
        self._quiet_until = 0.0  # time.monotonic() before which the thread does not write again
        self.last_write_s = 0.0  # how long the last file took to write
        self._piece_started: tuple[float | None, float] = (None, 0.0)  # see pause()

    @property
    def path(self) -> str:
        from hp_otel.common.launcher_env import current_rank

        return os.path.abspath(self.path_template.replace("{rank}", str(current_rank())))

    # --- lifecycle (CommDebugMode's enter and exit) --------------------------------
    def start(self, collectives: InFlightCollectives, write_spans: SpansWriter) -> None:
        """Watch a window: `collectives` are its in-flight ones, `write_spans(path)` writes its spans so far.

        The window makes its sources say when a returned collective's work is done
        (`Observer.wants_completion`) while this watches it.
        """
        if self._thread is not None:
            raise RuntimeError("this HangWatchdog already watches a window; give each CommDebugMode its own")
        self._collectives = collectives
        self._write_spans = write_spans
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="hp_otel-watchdog", daemon=True)
        self._thread.start()
        if self.on_signals and threading.current_thread() is threading.main_thread():
            for sig in self.on_signals:
                self._previous[sig] = signal.signal(sig, self._on_signal)

    def stop(self) -> None:
        thread, self._thread = self._thread, None
        self._stop.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=max(self.poll_s * 2, 1.0))
        for sig, previous in self._previous.items():
            if signal.getsignal(sig) == self._on_signal:  # someone else's handler since: leave theirs
                signal.signal(sig, previous)
        self._previous.clear()
        self._collectives = self._write_spans = None

    # --- the thread -------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.check(time.time_ns())
            except Exception as exc:  # never let the watchdog die noisily or touch training
                if not self._failed:
                    self._failed = True
                    logger.warning("hp_otel watchdog: check failed; it keeps watching", exc_info=exc)

    def check(self, now_ns: int) -> list[CollectiveIssue]:
        """Write the file if a collective has waited `timeout_s`; returns the ones that newly did."""
        collectives, write_spans = self._collectives, self._write_spans
        if collectives is None or write_spans is None:
            return []
        if time.monotonic() < self._quiet_until:  # bounded share of the interpreter: see QUIET_FACTOR
            return []
        collectives.forget_completed()
        limit_ns = int(self.timeout_s * 1e9)
        stuck = [i for i in collectives.in_flight() if not i.dumped_to and now_ns - i.start_ns >= limit_ns]
        if not stuck:
            return []
        path = self.path
        for issue in stuck:
            issue.waited_s = round((now_ns - issue.start_ns) / 1e9, 3)
            issue.dumped_to = path
        started = time.monotonic()
        self._piece_started = (time.perf_counter(), time.thread_time())
        try:
            write_spans(path)
        finally:
            self.last_write_s = time.monotonic() - started
            self._quiet_until = time.monotonic() + QUIET_FACTOR * self.last_write_s
        self.written.append(path)
        for issue in stuck:
            info = issue.info
            where = f" in Module({issue.place.fqn})" if issue.place.fqn else ""
            logger.warning(
                "hp_otel watchdog: %s #%d on group %s (ranks %s)%s issued %.1f s ago has not completed; "
                "wrote this rank's spans so far to %s (compare the ranks with: hp-otel ranks FILE...)",
                info.op,
                issue.seq,
                info.group or "?",
                str(RankSet.of(info.group_ranks)) or "?",
                where,
                issue.waited_s,
                path,
            )
        return stuck

    def pause(self) -> None:
        """Between pieces of a file the watchdog's thread writes: yield to the training thread.

        Sleeps `QUIET_FACTOR` times the CPU time the piece took when the piece took longer
        than its CPU time (another thread — training — wanted the interpreter meanwhile); a
        rank whose training thread is blocked in a collective is not slowed. Elsewhere
        (a signal's write on the main thread) it does nothing."""
        if threading.current_thread() is not self._thread:
            return
        wall, cpu = time.perf_counter(), time.thread_time()
        last_wall, last_cpu = self._piece_started
        self._piece_started = (wall, cpu)
        if last_wall is None:
            return
        spent_wall, spent_cpu = wall - last_wall, cpu - last_cpu
        if spent_wall > 1.25 * spent_cpu:
            self._stop.wait(min(QUIET_FACTOR * spent_cpu, 1.0))
            self._piece_started = (time.perf_counter(), time.thread_time())

    def _on_signal(self, signum: int, frame: Any) -> None:
        previous = self._previous.get(signum, signal.SIG_DFL)
        try:
            write_spans = self._write_spans
            if write_spans is not None:
                path = self.path
                write_spans(path)
                self.written.append(path)
                logger.warning(
                    "hp_otel watchdog: got %s; wrote this rank's spans so far to %s",
                    signal.Signals(signum).name,
                    path,
                )
        except Exception as exc:
            logger.warning("hp_otel watchdog: writing the spans on a signal failed", exc_info=exc)
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_DFL:  # what would have happened without us: do it now
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
