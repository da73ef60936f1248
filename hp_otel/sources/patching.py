"""Restorable patches of framework functions, shared by every active mode.

Frameworks without a hook point (hyper-parallel's platform collectives, MindSpore's
communication functions) are traced by replacing a function on its class or module.
Three rules keep that safe:

- the object stored in the owner's `__dict__` (a `staticmethod` descriptor on a class)
  is saved and put back as is, so `owner.__dict__[name] is saved` after restore;
- the wrappers are installed once while any mode needs them (reference counted) and
  find the observer to report to at call time (`ObserverSlot`), so nested modes and
  modes on several threads never stack wrappers on wrappers;
- only the owner's own attributes are replaced: a subclass that inherits a function
  reaches the patched one through its base.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, TypeVar

from hp_otel.record import installation

T = TypeVar("T")


def run_every(steps: Iterable[Callable[[], Any]]) -> None:
    """Run every undo step even if an earlier one fails, then raise the first failure.

    Restoring is all-or-nothing for the user: one hook that cannot be removed must not
    leave the others installed.
    """
    errors: list[BaseException] = []
    for step in steps:
        try:
            step()
        except Exception as exc:
            errors.append(exc)
    if errors:
        raise errors[0]


class ObserverSlot(Generic[T]):
    """What wrapped framework functions report to: an `Observer` for most sources, the
    window's collective timer for torch's kernels (`ObserverSlot[CollectiveTimer]`).

    The context's own one when it has one (a mode entered on this thread); otherwise the
    most recently pushed one, so calls from threads the framework starts itself
    (backward, communication threads) are still attributed.
    """

    def __init__(self, name: str) -> None:
        self._var: contextvars.ContextVar[T | None] = contextvars.ContextVar(name, default=None)
        self._installed: list[T] = []
        self._lock = threading.Lock()

    def push(self, reporter: T) -> contextvars.Token[T | None]:
        with self._lock:
            self._installed.append(reporter)
        return self._var.set(reporter)

    def pop(self, reporter: T, token: contextvars.Token[T | None]) -> None:
        with self._lock:
            for i in range(len(self._installed) - 1, -1, -1):
                if self._installed[i] is reporter:
                    del self._installed[i]
                    break
        try:
            self._var.reset(token)
        except ValueError:  # exited in another context than entered: leave that context alone
            pass

    def installed(self) -> bool:
        """True while some window has pushed one here (on any thread)."""
        return bool(self._installed)

    @property
    def var(self) -> contextvars.ContextVar[T | None]:
        """The context variable itself (the op hook's native filter reads it in C)."""
        return self._var

    def in_context(self) -> T | None:
        """This context's own one only (no fallback to another thread's)."""
        return self._var.get()

    def current(self) -> T | None:
        reporter = self._var.get()
        if reporter is None and self._installed:
            reporter = self._installed[-1]
        return reporter


class AttributePatch:
    """One function replaced on a class or module; `restore()` puts the saved object back."""

    def __init__(self, owner: Any, name: str, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
        self.owner = owner
        self.name = name
        self.saved = owner.__dict__[name]  # the descriptor itself, not what attribute access returns
        self._is_class = isinstance(owner, type)
        if isinstance(self.saved, (staticmethod, classmethod)):
            self.function = self.saved.__func__
            installed: Any = type(self.saved)(wrap(self.function))
        else:
            self.function = self.saved
            installed = wrap(self.saved)
        self._set(installed)

    def _set(self, value: Any) -> None:
        if self._is_class:
            type.__setattr__(self.owner, self.name, value)
        else:
            setattr(self.owner, self.name, value)

    def restore(self) -> None:
        self._set(self.saved)


class SharedPatches:
    """Patches installed while at least one user holds them; `plan()` makes them on first use.

    The one reference count of every shared hook: the first `acquire()` installs, the last
    `release()` restores, nested and concurrent windows in between share one installation.
    When the last user releases them while hooks are kept (`hp_otel.install()`), they
    stay in place (the wrappers pass calls through with no window) until
    `hp_otel.uninstall()`; a later window takes them over without patching again.
    `lingers=False`: never kept between windows (a patch that costs every call outside
    windows). A `plan()` that returns None declines: `acquire()` is then False and holds nothing.
    """

    def __init__(self, plan: Callable[[], list[AttributePatch] | None], *, lingers: bool = True) -> None:
        self._plan = plan
        self._lingers = lingers
        self._lock = threading.Lock()
        self._users = 0
        self._patches: list[AttributePatch] = []

    def acquire(self) -> bool:
        """Hold the patches (True), or False where `plan()` declined."""
        with self._lock:
            if self._users == 0:
                if self._lingers:
                    installation.claim(self)
                if not self._patches:  # else still installed: kept since the last window
                    patches = self._plan()
                    if patches is None:
                        return False
                    self._patches = patches
            self._users += 1
            return True

    def release(self) -> None:
        with self._lock:
            if self._users == 0:
                return
            self._users -= 1
            if self._users > 0:
                return
            if self._lingers and installation.keeping():
                installation.linger(self, self._remove_kept)
                return
            patches, self._patches = self._patches, []
        run_every(patch.restore for patch in reversed(patches))

    def _remove_kept(self) -> None:
        with self._lock:
            if self._users > 0:  # a window took them over meanwhile: it removes them when it closes
                return
            patches, self._patches = self._patches, []
        run_every(patch.restore for patch in reversed(patches))

    @property
    def patches(self) -> list[AttributePatch]:
        return list(self._patches)

    @property
    def users(self) -> int:
        return self._users


@contextlib.contextmanager
def all_or_nothing() -> Iterator[list[AttributePatch]]:
    """Collect patches into the yielded list; if the block fails, restore them and re-raise."""
    patches: list[AttributePatch] = []
    try:
        yield patches
    except BaseException:
        run_every(patch.restore for patch in reversed(patches))
        raise


def patch_owned(
    owner: Any, names: Any, wrap_for: Callable[[str], Callable[[Callable[..., Any]], Callable[..., Any]]]
) -> list[AttributePatch]:
    """Patch each of `names` that `owner` defines itself (missing ones are skipped); all or none."""
    with all_or_nothing() as patches:
        for name in names:
            if name in vars(owner):
                patches.append(AttributePatch(owner, name, wrap_for(name)))
    return patches


def patch_owned_all(owners: Iterable[Any], name: str, wrapper: Callable[..., Any]) -> list[AttributePatch]:
    """Install one `wrapper` as `name` on each owner (a function imported by name into several modules)."""
    with all_or_nothing() as patches:
        for owner in owners:
            patches.append(AttributePatch(owner, name, lambda _original: wrapper))
    return patches
