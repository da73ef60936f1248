"""The `torch.compile(model)` wrappers of a window's modules, found from the modules' side.

A window given `model` while the step calls `torch.compile(model)` must note the model's call
eagerly, around the compiled region: inside it hooks do nothing.  Where the region starts
depends on the model's class: for a class of the user's, dynamo compiles `forward` and runs
the model's own hooks eagerly; for one of torch's (`nn.Sequential`, `DistributedDataParallel`:
their files are skipped by dynamo) the wrapper compiles an extra frame that calls the whole
module, hooks included (`OptimizedModule._initialize`, `external_utils.wrap_inline`).  Only the
wrapper's own hooks run eagerly in both, so the wrapper is what the module hooks note the call
on, whatever the class.

Nothing on the model points to its wrapper and torch keeps no list of them, but every instance
refers to its class: `gc.get_referrers(OptimizedModule)` lists the live wrappers (one pass over
the heap, tens of ms on a large process: docs/how-it-works/costs.md).  It runs again only when the number of
references to the wrapper class (and its subclasses) changed by more than the known wrappers
that died, i.e. when a wrapper may have been made since: an O(1) check per window.
"""

from __future__ import annotations

import gc
import sys
import threading
import weakref
from collections.abc import Iterable

from torch import nn

from hp_otel.sources.pytorch import _compat

_lock = threading.Lock()


class _Found:
    """The live wrappers at the last scan, and what the wrapper classes' reference counts said then."""

    __slots__ = ("base", "generation", "signature", "wrappers")

    def __init__(self, base: type, generation: int, signature: int, wrappers: list[weakref.ref[nn.Module]]) -> None:
        self.base = base
        self.generation = generation
        self.signature = signature
        self.wrappers = wrappers


_found: list[_Found] = []  # at most one: the last scan


def _classes(base: type) -> list[type]:
    """The wrapper class and its subclasses (a subclass's instances refer to the subclass, not to `base`)."""
    if not base.__subclasses__():  # the usual case
        return [base]
    classes, todo = [], [base]
    while todo:
        kind = todo.pop()
        if kind not in classes:
            classes.append(kind)
            todo.extend(kind.__subclasses__())
    return classes


def _signature(classes: list[type], wrappers: list[weakref.ref[nn.Module]]) -> int:
    """References to the classes less the known wrappers alive: it moves when a wrapper is made (each
    holds one on its class), not when a known one dies (its reference goes with it)."""
    references = 0
    for kind in classes:
        references += sys.getrefcount(kind)
    for ref in wrappers:
        if ref() is not None:
            references -= 1
    return references


def _current() -> _Found | None:
    """The wrappers alive now (scanning the heap again only if one may have been made since); None
    when dynamo is not imported (then none exists)."""
    base = _compat.loaded_compiled_module_class()
    if base is None:
        return None
    with _lock:
        classes = _classes(base)
        last = _found[0] if _found else None
        if last is not None and last.base is base and _signature(classes, last.wrappers) == last.signature:
            return last
        wrappers = _scan(classes)
        alive = [wrapper for ref in wrappers if (wrapper := ref()) is not None]
        same = last is not None and last.base is base and [r() for r in last.wrappers if r() is not None] == alive
        del alive
        generation = (last.generation + (0 if same else 1)) if last is not None else 1
        found = _Found(base, generation, 0, wrappers)
        _found[:] = [found]
        del last
        # taken with exactly the references the check above holds (`_found` holds `base` once)
        found.signature = _signature(classes, wrappers)
        return found


def _scan(classes: list[type]) -> list[weakref.ref[nn.Module]]:
    """Every live instance of `classes`: each refers to its class (one pass over the heap)."""
    kinds = set(classes)
    return [weakref.ref(obj) for obj in gc.get_referrers(*classes) if type(obj) in kinds]


def generation() -> int:
    """A number that changes whenever `wrappers_of` may answer differently (0: dynamo not imported)."""
    found = _current()
    return found.generation if found is not None else 0


def wrappers_of(modules: Iterable[nn.Module]) -> dict[int, list[nn.Module]]:
    """id(module) -> the live `torch.compile(module)` wrappers of each of `modules` that has any."""
    found = _current()
    if found is None:
        return {}
    wanted = {id(module) for module in modules}
    wrapped: dict[int, list[nn.Module]] = {}
    for ref in found.wrappers:
        wrapper = ref()
        original = _compat.compiled_module_original(wrapper) if wrapper is not None else None
        if original is not None and id(original) in wanted:  # the wrapper holds it: the id is its own
            wrapped.setdefault(id(original), []).append(wrapper)  # type: ignore[arg-type]
    return wrapped
