"""The optional native gate in front of the Python collective kernels (`passthrough.cpp`).

Every call into a Python kernel is a round trip into Python, even one that only passes the call on:
a functional collective's inner c10d op, and every collective while hooks are kept and no window
records (the figures: docs/how-it-works/costs.md). The gate, a C++ kernel on the same key, passes
those on without entering Python and hands the rest to the same Python kernels, so what is
recorded does not change.

It is compiled, so it is never required:
- `hp-otel build-native` (or `build()`) compiles it once with `torch.utils.cpp_extension` (a C++
  compiler and ninja; ≈30 s) into the cache folder, one build per source, torch and Python;
- a window then uses the cached build when there is one (`HP_OTEL_TORCH_NATIVE=auto`, the default):
  nothing is compiled behind the user's back in the middle of training; without a build the
  Python kernels serve alone, said once in the log;
- `HP_OTEL_TORCH_NATIVE=off` leaves it out (CI runs the suite both ways).
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import logging
import os
import sys
import threading
from pathlib import Path
from types import ModuleType

from hp_otel.common.cache_dir import cache_folder
from hp_otel.common.env_read import getenv

logger = logging.getLogger("hp_otel")

NATIVE_ENV = "HP_OTEL_TORCH_NATIVE"
AUTO, OFF = "auto", "off"
_CHOICES = {"": AUTO, "auto": AUTO, "1": AUTO, "on": AUTO, "off": OFF, "0": OFF}
SOURCE = Path(__file__).with_name("passthrough.cpp")

_lock = threading.Lock()
_state: dict[str, object] = {"module": None, "tried": False, "told": False}
_loaded: dict[str, ModuleType] = {}  # name -> the module imported from its build (an extension loads once)


class NativeBuildError(RuntimeError):
    """The gate could not be compiled: the message says what is missing."""


def requested() -> str:
    """`HP_OTEL_TORCH_NATIVE` as "auto" or "off"; another value is refused, naming the allowed ones."""
    value = (getenv(NATIVE_ENV) or "").strip().lower()
    choice = _CHOICES.get(value)
    if choice is None:
        raise ValueError(f"{NATIVE_ENV}={value!r}: allowed values are 'auto' (default: the gate if built) and 'off'")
    return choice


def build_name() -> str:
    """The module's name: one per source text, torch version and Python, so a stale build is never loaded."""
    import torch

    key = f"{SOURCE.read_text()}\n{torch.__version__}\n{sys.version}\n{sys.platform}"
    return f"hp_otel_native_{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def build_folder(name: str | None = None) -> Path:
    """Where the build is kept: the cache folder's native/NAME."""
    return cache_folder() / "native" / (name or build_name())


def _built_file(name: str) -> Path | None:
    folder = build_folder(name)
    for suffix in [*importlib.machinery.EXTENSION_SUFFIXES, ".so"]:
        path = folder / f"{name}{suffix}"
        if path.is_file():
            return path
    return None


def _import(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build(verbose: bool = False) -> Path:
    """Compile the gate into the cache folder (once: a build that is there is kept) and return its file."""
    import shutil

    try:
        name = build_name()
    except ImportError as exc:
        raise NativeBuildError(f"torch is not importable here ({exc}): the gate is built against it") from None
    built = _built_file(name)
    if built is not None:
        return built
    compiler = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if compiler is None:
        raise NativeBuildError("no C++ compiler (c++, g++ or clang++) on PATH (Debian/Ubuntu: apt-get install g++)")
    if shutil.which("ninja") is None:  # torch's builder runs `ninja` from PATH
        try:
            import ninja  # the PyPI wheel's binary, not on PATH in an unactivated venv
        except ImportError:
            raise NativeBuildError("ninja is missing (pip install ninja, or apt-get install ninja-build)") from None
        os.environ["PATH"] = os.pathsep.join((ninja.BIN_DIR, os.environ.get("PATH", "")))
    from torch.utils import cpp_extension

    folder = build_folder(name)
    folder.mkdir(parents=True, exist_ok=True)
    try:
        cpp_extension.load(
            name=name, sources=[str(SOURCE)], build_directory=str(folder), extra_cflags=["-O2"],
            verbose=verbose, is_python_module=True,
        )  # fmt: skip
    except Exception as exc:  # the compiler's output is long: its first line, and where to see the rest
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise NativeBuildError(f"compiling {SOURCE.name} failed: {first} (--verbose shows the rest)") from exc
    built = _built_file(name)
    if built is None:
        raise NativeBuildError(f"the build left no module in {folder}")
    return built


def gate() -> ModuleType | None:
    """The loaded gate, or None: off (read at each call: once per registration), not built, or not
    loadable here (then said once in the log)."""
    if requested() == OFF:
        return None
    if not _state["tried"]:
        with _lock:
            if not _state["tried"]:
                _state["module"] = _load()
                _state["tried"] = True
    return _state["module"]  # type: ignore[return-value]


def _load() -> ModuleType | None:
    try:
        name = build_name()
        path = _built_file(name)
        if path is None:
            _tell(
                "hp_otel: collectives go through the Python kernels alone; `hp-otel build-native` compiles the "
                "native gate once (a C++ compiler and ninja, ≈30 s), which passes the calls nothing records on "
                "without entering Python"
            )
            return None
        module = _loaded.get(name)
        if module is None:
            module = _loaded[name] = _import(name, path)
        return module
    except Exception as exc:  # a build for another machine, a missing symbol: the Python kernels serve
        _tell(f"hp_otel: the native gate did not load ({type(exc).__name__}: {exc}); the Python kernels serve alone")
        return None


def _tell(message: str) -> None:
    if not _state["told"]:
        _state["told"] = True
        logger.info(message)


def forget() -> None:
    """Look for the build again at the next need (tests: after building, or after `disable`)."""
    with _lock:
        _state.update(module=None, tried=False, told=False)


def disable(reason: BaseException) -> None:
    """The gate failed where it was loaded (registering through it): the Python kernels serve alone
    from now on in this process, said once."""
    with _lock:
        _state.update(module=None, tried=True)
    _tell(f"hp_otel: the native gate failed ({type(reason).__name__}: {reason}); the Python kernels serve alone")
