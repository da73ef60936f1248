"""Progress lines for commands that take more than a few seconds: on stderr, so stdout stays the result."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

Progress = Callable[[str], None]


def quiet(message: str) -> None:
    """A Progress that says nothing (the library default)."""


class to_stderr:  # lower case: called like a function, progress = to_stderr("bench")
    """A Progress printing `hp-otel COMMAND [12.3 s]: message` lines to stderr (`program`: other
    than `hp-otel`, as the repository's `python -m benchmarks`).

    Seconds count from `started` (a `time.time()`, so a child process can report on its
    parent's clock: pass it `progress.started`).
    """

    def __init__(self, command: str, started: float | None = None, program: str = "hp-otel") -> None:
        self.command = command
        self.started = time.time() if started is None else started
        self.program = program

    def __call__(self, message: str) -> None:
        elapsed = time.time() - self.started
        who = f"{self.program} {self.command}".rstrip()
        print(f"{who} [{elapsed:5.1f} s]: {message}", file=sys.stderr, flush=True)


class ReadProgress:
    """`hp-otel ranks: read 1,024 of 4,096 files, 35.2 files/s, 87 s left` on one terminal line, redrawn
    at most every half second (an `on_read(done, total)` callback); `done()` ends the line."""

    def __init__(self, command: str) -> None:
        self.command = command
        self.started = time.monotonic()
        self.shown = 0.0
        self.drawn = False

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if now - self.shown < 0.5 and done < total:
            return
        self.shown = now
        rate = done / max(now - self.started, 1e-9)
        left = (total - done) / rate if rate > 0 else 0.0
        line = f"hp-otel {self.command}: read {done:,} of {total:,} files, {rate:.1f} files/s, {left:.0f} s left"
        print(f"\r{line}\033[K", end="", file=sys.stderr, flush=True)
        self.drawn = True

    def done(self) -> None:
        if self.drawn:
            print(file=sys.stderr, flush=True)
