"""The optional native gate in front of the Python collective kernels (`passthrough.cpp`).

Every call into a Python kernel is a round trip into Python, even one that only passes the call on:
a functional collective's inner c10d op, and every collective while hooks are kept and no window
records (the figures: docs/how-it-works/costs.md). The gate, a C++ kernel on the same key, passes
those on without entering Python and hands the rest to the same Python kernels, so what is
recorded does not change. The same module makes the op hook's filter (`op_filter`, used by
`op_hook.wrap_hook`): DTensor's `__torch_function__` while a window records ops, which passes on in
C what the Python hook would pass on first and calls it for the rest.

It is compiled, so it is never required:
- `hp-otel build-native` (or `build()`) compiles it once with `torch.utils.cpp_extension` (a C++
  compiler and ninja; ≈30 s) into the cache folder, one build per source, torch and Python; it is
  compiled in a private temporary folder and renamed into place, so a partial library is never
  at the name a window loads;
- it is loaded only when it and every folder from the cache folder down are this user's (or
  root's) and writable by nobody else (`hp_otel.common.cache_dir.open_private`), checked on the
  open file itself before `dlopen`: a library another user could have planted never runs here;
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
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType, ModuleType

from hp_otel.common import said_once
from hp_otel.common.cache_dir import UntrustedCache, cache_folder, make_private_folders, open_private
from hp_otel.common.env_read import getenv

logger = logging.getLogger("hp_otel")

NATIVE_ENV = "HP_OTEL_TORCH_NATIVE"
AUTO, OFF = "auto", "off"
_CHOICES = MappingProxyType({"": AUTO, "auto": AUTO, "1": AUTO, "on": AUTO, "off": OFF, "0": OFF})
SOURCE = Path(__file__).with_name("passthrough.cpp")

_lock = threading.Lock()


@dataclass(eq=False)
class _Lookup:
    """Whether this process looked for the gate's build yet, and what it found."""

    module: ModuleType | None = None
    tried: bool = False


_lookup = _Lookup()
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


def _built_file(name: str, folder: Path | None = None) -> Path | None:
    folder = folder or build_folder(name)
    for suffix in [*importlib.machinery.EXTENSION_SUFFIXES, ".so"]:
        path = folder / f"{name}{suffix}"
        if path.is_file():
            return path
    return None


def _import(name: str, path: Path) -> ModuleType:
    """Import the build at `path` once it is checked private (`open_private`), from the very file
    checked (`/proc/self/fd`: nothing can be swapped in between the check and `dlopen`)."""
    fd = open_private(path)
    try:
        origin = f"/proc/self/fd/{fd}" if os.path.isdir("/proc/self/fd") else str(path)
        loader = importlib.machinery.ExtensionFileLoader(name, origin)
        spec = importlib.util.spec_from_file_location(name, origin, loader=loader)
        if spec is None:
            raise ImportError(f"cannot load {path}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)  # type: ignore[union-attr]
    finally:
        os.close(fd)
    module.__file__ = str(path)
    return module


def _check_build(path: Path) -> None:
    """Raise NativeBuildError unless the build at `path` is private to this user (`open_private`)."""
    try:
        os.close(open_private(path))
    except UntrustedCache as exc:
        raise NativeBuildError(str(exc)) from None


def build(verbose: bool = False) -> Path:
    """Compile the gate into the cache folder (once: a build that is there is kept) and return its file.

    Raises NativeBuildError: nothing to build with, a failed compile, or a cache another user could write."""
    import shutil
    import tempfile

    try:
        name = build_name()
    except ImportError as exc:
        raise NativeBuildError(f"torch is not importable here ({exc}): the gate is built against it") from None
    try:
        built = _built_file(name)
    except ValueError as exc:  # a relative XDG_CACHE_HOME
        raise NativeBuildError(str(exc)) from None
    if built is not None:
        _check_build(built)  # a file planted by another user is not reported as the build
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
    try:
        make_private_folders(folder)
    except UntrustedCache as exc:
        raise NativeBuildError(str(exc)) from None
    scratch = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=folder.parent))  # 0700, this build's alone
    try:
        try:
            cpp_extension.load(
                name=name, sources=[str(SOURCE)], build_directory=str(scratch), extra_cflags=["-O2"],
                verbose=verbose, is_python_module=True,
            )  # fmt: skip
        except Exception as exc:  # the compiler's output is long: its first line, and where to see the rest
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise NativeBuildError(f"compiling {SOURCE.name} failed: {first} (--verbose shows the rest)") from exc
        made = _built_file(name, scratch)
        if made is None:
            raise NativeBuildError(f"the build left no module in {scratch}")
        os.replace(made, folder / made.name)  # whole, under its final name, in one step
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    built = _built_file(name)
    if built is None:
        raise NativeBuildError(f"the build left no module in {folder}")
    return built


def gate() -> ModuleType | None:
    """The loaded gate, or None: off (read at each call: once per registration), not built, or not
    loadable here (then said once in the log)."""
    if requested() == OFF:
        return None
    if not _lookup.tried:
        with _lock:
            if not _lookup.tried:
                _lookup.module = _load()
                _lookup.tried = True
    return _lookup.module


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
    except (UntrustedCache, ValueError) as exc:  # another user's file, a relative XDG_CACHE_HOME: a warning
        _tell(f"hp_otel: the native gate was not loaded: {exc}; the Python kernels serve alone", logging.WARNING)
        return None
    except Exception as exc:  # a build for another machine, a missing symbol: the Python kernels serve
        _tell(f"hp_otel: the native gate did not load ({type(exc).__name__}: {exc}); the Python kernels serve alone")
        return None


def _tell(message: str, level: int = logging.INFO) -> None:
    """The gate's state is told once per process (until `forget`): one line, whichever it is."""
    said_once.log_once(__name__, "gate", "%s", message, level=level)


def forget() -> None:
    """Look for the build again at the next need (tests: after building, or after `disable`)."""
    with _lock:
        _lookup.module, _lookup.tried = None, False
    said_once.forget(__name__)


def disable(reason: BaseException) -> None:
    """The gate failed where it was loaded (registering through it): the Python kernels serve alone
    from now on in this process, said once."""
    with _lock:
        _lookup.module, _lookup.tried = None, True
    _tell(f"hp_otel: the native gate failed ({type(reason).__name__}: {reason}); the Python kernels serve alone")
