"""The recorder's fault sink, handed to the parts it is made of without a reference cycle."""

from __future__ import annotations

import types
import weakref
from collections.abc import Callable

FaultSink = Callable[[str, BaseException], None]


def weak_method(fn: FaultSink) -> Callable[[], FaultSink | None]:
    """A bound method held weakly (anything else strongly): call the result to get it back, or None.

    Not `weakref.WeakMethod`: that one runs a Python callback when the object dies, which
    happens as each window is dropped, and a Ctrl-C that Python handles inside such a
    callback is printed as "Exception ignored" and lost. A plain `weakref.ref` runs nothing.
    """
    if not isinstance(fn, types.MethodType):
        return lambda: fn
    owner, function = weakref.ref(fn.__self__), fn.__func__

    def bound() -> FaultSink | None:
        obj = owner()
        return None if obj is None else types.MethodType(function, obj)

    return bound


def weak_sink(on_fault: FaultSink) -> FaultSink:
    """`on_fault`, a bound method held weakly (so a recorder's parts keep no cycle back to it: a
    dropped window is freed without the garbage collector); anything else as it is."""
    if not isinstance(on_fault, types.MethodType):
        return on_fault
    ref = weak_method(on_fault)

    def sink(where: str, exc: BaseException) -> None:
        fn = ref()
        if fn is not None:
            fn(where, exc)

    return sink
