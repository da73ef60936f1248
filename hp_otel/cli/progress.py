"""Progress lines for commands that take more than a few seconds: on stderr, so stdout stays the result."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

Progress = Callable[[str], None]


def quiet(message: str) -> None:
    """A Progress that says nothing (the library default)."""


def to_stderr(command: str) -> Progress:
    """A Progress printing `hp-otel COMMAND [12.3 s]: message` lines to stderr."""
    started = time.monotonic()

    def say(message: str) -> None:
        print(f"hp-otel {command} [{time.monotonic() - started:5.1f} s]: {message}", file=sys.stderr, flush=True)

    return say
