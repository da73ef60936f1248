"""Make the hyper-parallel stand-in (tests/support/stand_ins/hyper_parallel) importable, as one release.

Only the tests that ask for it see it: the path is added and the modules purged again
afterwards, so `engine="auto"` elsewhere still finds no hyper_parallel.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

STAND_INS = str(Path(__file__).resolve().parent / "stand_ins")
RELEASES = ("snapshot", "newer", "newest")


def purge() -> None:
    for name in [n for n in sys.modules if n == "hyper_parallel" or n.startswith("hyper_parallel.")]:
        del sys.modules[name]


@contextlib.contextmanager
def hyper_parallel_release(release: str, platform: str = "torch") -> Iterator[ModuleType]:
    """Import the stand-in as `release` on `platform`; remove it from sys.path and sys.modules after."""
    saved_env = {k: os.environ.get(k) for k in ("HP_STANDIN_RELEASE", "HYPER_PARALLEL_PLATFORM")}
    os.environ["HP_STANDIN_RELEASE"] = release
    os.environ["HYPER_PARALLEL_PLATFORM"] = platform
    sys.path.insert(0, STAND_INS)
    purge()
    try:
        module = importlib.import_module("hyper_parallel")
        assert module.RELEASE == release
        yield module
    finally:
        purge()
        sys.path.remove(STAND_INS)
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
