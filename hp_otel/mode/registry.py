"""Which windows are open on which thread and model: the process-wide registries of `CommDebugMode`.

- `current_mode`: the innermost active window of this context (a window entered inside
  another suspends it);
- `install_lock`: one lock for installing and removing hooks, so windows entered on several
  threads do not interleave;
- the windows open on each thread (with the asyncio task that opened them) and the root
  modules traced now (`traced_modules`: id -> (module, thread ident, open windows)): a
  window claims both before anything is installed (`claim`) and releases them when it
  closes (`Claim.release`).
"""

from __future__ import annotations

import contextvars
import threading
from asyncio import events as asyncio_events
from typing import Any

from hp_otel.sources import is_torch_module

CommDebugMode = Any  # the facade's class (not imported: it imports this module)

current_mode: contextvars.ContextVar[CommDebugMode | None] = contextvars.ContextVar(
    "hp_otel_current_mode", default=None
)
install_lock = threading.RLock()
thread_state = threading.local()
traced_modules: dict[int, tuple[Any, int, int]] = {}


def windows_of_this_thread() -> list[tuple[Any, Any]]:
    stack = getattr(thread_state, "windows", None)
    if stack is None:
        stack = thread_state.windows = []
    return stack


def current_task() -> Any:
    """The running asyncio task, None outside one (cheap when no event loop runs)."""
    if asyncio_events._get_running_loop() is None:
        return None
    import asyncio

    return asyncio.current_task()


def task_name(task: Any) -> str:
    return "no asyncio task" if task is None else f"asyncio task {task.get_name()!r}"


def thread_name(ident: int) -> str:
    for thread in threading.enumerate():
        if thread.ident == ident:
            return f"thread {thread.name!r}"
    return f"thread {ident}"


def module_tree(module: Any) -> list[Any]:
    """The module and every submodule (torch `modules()`, MindSpore `cells_and_names()`), each once."""
    if is_torch_module(module):
        return list(module.modules())
    cells = getattr(module, "cells_and_names", None)
    if callable(cells):
        seen: dict[int, Any] = {id(module): module}
        for _name, cell in cells():
            seen.setdefault(id(cell), cell)
        return list(seen.values())
    return [module]


def refuse_modules_of_other_threads(module: Any, others: list[tuple[Any, int]]) -> None:
    """Refuse a window on `module` if it, or one of its submodules, is in a tree that a window on
    another thread traces now (`others`: (root, thread ident)); module hooks belong to the module."""
    owners: dict[int, int] = {}
    for root, owner in others:
        for traced in module_tree(root):
            owners.setdefault(id(traced), owner)
    for i, submodule in enumerate(module_tree(module)):  # the module itself first, then its submodules
        owner = owners.get(id(submodule))
        if owner is None:
            continue
        name = type(module).__name__
        what = f"module {name} is" if i == 0 else f"module {name} has a submodule ({type(submodule).__name__}) that is"
        raise RuntimeError(
            f"CommDebugMode: {what} already traced by a window on another thread "
            f"({thread_name(owner)}). Module hooks belong to the module, not the thread, so two "
            "threads tracing one model (or a model and one of its submodules) would mix their module "
            "spans: trace it on one thread at a time, or give each thread its own model "
            "(or module=None)"
        )


class Claim:
    """What one open window holds: its place on its thread's stack and its count on its module."""

    __slots__ = ("claimed_ids", "window_stack")

    def __init__(self) -> None:
        self.claimed_ids: list[int] = []  # the ids of its module tree this window counts in traced_modules
        self.window_stack: list[tuple[Any, Any]] = []  # the windows of the thread that entered it

    def later_windows(self, window: Any) -> list[Any]:
        """The windows entered after `window` on its thread that are still open, outermost first."""
        with install_lock:
            stack = self.window_stack
            mine = next((i for i, (mode, _task) in enumerate(stack) if mode is window), None)
            return [] if mine is None else [mode for mode, _task in stack[mine + 1 :]]

    def release(self, window: Any) -> None:
        with install_lock:
            stack, self.window_stack = self.window_stack, []
            for i in range(len(stack) - 1, -1, -1):
                if stack[i][0] is window:
                    del stack[i]
                    break
            claimed, self.claimed_ids = self.claimed_ids, []
            for key in claimed:
                module, owner, windows = traced_modules.get(key, (None, 0, 1))
                if windows <= 1:
                    traced_modules.pop(key, None)
                else:
                    traced_modules[key] = (module, owner, windows - 1)


def claim(window: Any, module: Any, held: Claim) -> None:
    """Refuse the two layouts hp_otel cannot record correctly, before anything is installed; else
    record `window` (on `module`) as open on this thread, in `held`.

    torch's function and dispatch modes belong to a thread: windows of asyncio tasks
    interleaved on one thread would each record the other's collectives. Module hooks
    belong to the module: two threads tracing one model would mix their module spans.
    """
    task = current_task()
    with install_lock:
        stack = windows_of_this_thread()
        if stack and stack[-1][1] is not task:
            raise RuntimeError(
                f"CommDebugMode: another window is open on this thread in {task_name(stack[-1][1])}, and this one "
                f"would open in {task_name(task)}. torch's modes belong to the thread, so windows of "
                "interleaved asyncio tasks would record each other's collectives: open them one task at a "
                "time (e.g. under an asyncio.Lock) or run each task's traced work in its own thread"
            )
        if module is not None:
            me = threading.get_ident()
            others = [(root, owner) for root, owner, _windows in traced_modules.values() if owner != me]
            if others:  # only then are trees walked: a window per step on one thread walks none
                refuse_modules_of_other_threads(module, others)
            key = id(module)
            _module, _owner, windows = traced_modules.get(key, (None, me, 0))
            traced_modules[key] = (module, me, windows + 1)
            held.claimed_ids = [key]
        stack.append((window, task))
        held.window_stack = stack  # exiting on another thread still removes it from this one
