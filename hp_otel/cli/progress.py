"""Progress lines for commands that take more than a few seconds: on stderr, so stdout stays the result."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

Progress = Callable[[str], None]


def quiet(message: str) -> None:
    """A Progress that says nothing (the library default)."""


class to_stderr:  # lower case: called like a function, progress = to_stderr("bench")
    """A Progress printing `hp-otel COMMAND [12.3 s]: message` lines to stderr.

    Seconds count from `started` (a `time.time()`, so a child process can report on its
    parent's clock: pass it `progress.started`).
    """

    def __init__(self, command: str, started: float | None = None) -> None:
        self.command = command
        self.started = time.time() if started is None else started

    def __call__(self, message: str) -> None:
        elapsed = time.time() - self.started
        print(f"hp-otel {self.command} [{elapsed:5.1f} s]: {message}", file=sys.stderr, flush=True)
