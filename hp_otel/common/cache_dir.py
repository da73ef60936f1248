"""Where hp_otel keeps what it builds once per machine (the callgrind client library, the native gate)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_folder() -> Path:
    """$XDG_CACHE_HOME/hp_otel, else ~/.cache/hp_otel (read at each call: tests move it)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "hp_otel"
