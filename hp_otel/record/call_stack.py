"""Where the user's code issued a collective: a cheap walk of the caller's Python frames.

Opt-in (`CommDebugMode(stack=...)`, `HP_OTEL_STACK_DEPTH`): off, the recorder holds no
`CallStack` and walks no frame.  On, each collective and redistribute walks
`sys._getframe()` up the calling thread's frames, drops those of the libraries
(`skip_packages`: hp_otel, the framework's, the standard library's) and keeps the first
`depth` others as `"file:line:function"`, innermost first.  No source line is read
(`traceback.extract_stack` reads the files and formats them: about twice the cost); the caches
below make a frame seen before cost one dict lookup.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from types import CodeType

from hp_otel.common.env_read import getenv
from hp_otel.common.package_dirs import package_dirs

DEPTH_VARIABLE = "HP_OTEL_STACK_DEPTH"
DEFAULT_DEPTH = 8
MAX_DEPTH = 64
_CACHE_LIMIT = 8192
_getframe = sys._getframe  # module attribute: the tests count its calls


def check_depth(value: object, name: str = "stack") -> int:
    """A stack setting as a depth: True is the default depth, False / 0 / None off, else 1..MAX_DEPTH."""
    if value is None or value is False:
        return 0
    if value is True:
        return DEFAULT_DEPTH
    if isinstance(value, int) and 0 <= value <= MAX_DEPTH:
        return value
    raise ValueError(
        f"{name} must be True (the {DEFAULT_DEPTH} innermost user frames), False / 0 / None (off), "
        f"or a depth of 1..{MAX_DEPTH}, got {value!r}"
    )


def depth_from_env(environ: dict[str, str] | None = None) -> int:
    """`HP_OTEL_STACK_DEPTH`: unset, blank or 0 is off; a number 1..64 is the depth."""
    raw = getenv(DEPTH_VARIABLE) if environ is None else environ.get(DEPTH_VARIABLE)
    text = raw.strip() if raw is not None and raw.strip() else None
    if text is None:
        return 0
    if not text.isdigit() or int(text) > MAX_DEPTH:
        raise ValueError(f"{DEPTH_VARIABLE} must be a number of frames 0..{MAX_DEPTH} (0: off), got {text!r}")
    return int(text)


def _dirs(*keys: str) -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    found = {os.path.join(os.path.realpath(paths[key]), "") for key in keys if key in paths}
    found |= {os.path.join(os.path.abspath(paths[key]), "") for key in keys if key in paths}
    return tuple(sorted(found))


def standard_library_dirs() -> tuple[str, ...]:
    """The standard library's folders (a venv's site-packages below them is not: see `_is_library`)."""
    return _dirs("stdlib", "platstdlib")


def site_packages_dirs() -> tuple[str, ...]:
    """Where installed libraries live: kept (a library of the user's issues collectives too)."""
    return _dirs("purelib", "platlib")


class CallStack:
    """`capture()`: the user's frames of the calling thread, innermost first, as `file:line:function`."""

    __slots__ = ("_codes", "_keep", "_packages", "_stdlib", "depth")

    def __init__(
        self,
        depth: int,
        skip_packages: tuple[str, ...],
        stdlib: tuple[str, ...] = (),
        keep: tuple[str, ...] = (),
    ) -> None:
        self.depth = depth
        self._packages = skip_packages  # always dropped (hp_otel's, the framework's folders)
        # The standard library is dropped, except what lies in `keep` below it (a venv's site-packages);
        # frozen modules ("<frozen runpy>") count as standard library.
        self._stdlib = (*stdlib, "<frozen ")
        self._keep = keep
        # id(code) -> (code, its lines as text or None for a library's code). Keyed by id: hashing a
        # code object hashes its constants (nested code included) on every lookup, far dearer than a
        # dict hit for torch's large functions (docs/how-it-works/costs.md). The entry holds the code,
        # so its id is not reused meanwhile.
        self._codes: dict[int, tuple[CodeType, dict[int, str] | None]] = {}

    def capture(self) -> tuple[str, ...]:
        frame = _getframe(1)
        out: list[str] = []
        codes = self._codes
        depth = self.depth
        while frame is not None:
            code = frame.f_code
            known = codes.get(id(code))
            if known is None:
                if len(codes) >= _CACHE_LIMIT:
                    codes.clear()
                known = codes[id(code)] = (code, None if self._is_library(code.co_filename) else {})
                if known[1] is not None:
                    _remember_module(code.co_filename, frame.f_globals)
            lines = known[1]
            if lines is not None:  # the user's code
                line = frame.f_lineno
                text = lines.get(line)
                if text is None:
                    function = getattr(code, "co_qualname", code.co_name)  # co_qualname: Python 3.11+
                    text = lines[line] = f"{code.co_filename}:{line}:{function}"
                out.append(text)
                if len(out) >= depth:
                    break
            frame = frame.f_back
        return tuple(out)

    def _is_library(self, filename: str) -> bool:
        if filename.startswith(self._packages):
            return True
        return filename.startswith(self._stdlib) and not (self._keep and filename.startswith(self._keep))


# The user's files -> their module's name, for semconv's fully qualified `code.function.name`
# (`module.Class.method`; 1.33+): the frames stay "file:line:qualname", the form Flight Recorder's
# frames are compared in.  Filled once per code object first seen, bounded like the code cache.
_modules: dict[str, str] = {}


def _remember_module(filename: str, module_globals: dict[str, object]) -> None:
    name = module_globals.get("__name__")
    if isinstance(name, str) and name and _modules.get(filename) != name:
        if len(_modules) >= _CACHE_LIMIT:
            _modules.clear()
        _modules[filename] = name


def module_of(filename: str) -> str | None:
    """The module a captured frame's file was running as (None if not seen: the name stays unqualified)."""
    return _modules.get(filename)


_shared: dict[tuple[int, tuple[str, ...]], CallStack] = {}


def shared_call_stack(depth: int, skip_packages: tuple[str, ...]) -> CallStack | None:
    """One `CallStack` per (depth, packages) for the process, so its caches outlive a step's window; None at depth 0."""
    if depth <= 0:
        return None
    key = (depth, skip_packages)
    call_stack = _shared.get(key)
    if call_stack is None:
        call_stack = _shared[key] = CallStack(
            depth, package_dirs(skip_packages), standard_library_dirs(), site_packages_dirs()
        )
    return call_stack
