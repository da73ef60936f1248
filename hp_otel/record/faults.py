"""The recorder's fault sink, handed to the parts it is made of without a reference cycle."""

from __future__ import annotations

import types
import weakref
from collections.abc import Callable

FaultSink = Callable[[str, BaseException], None]


def weak_sink(on_fault: FaultSink) -> FaultSink:
    """`on_fault`, a bound method held weakly (so a recorder's parts keep no cycle back to it: a
    dropped window is freed without the garbage collector); anything else as it is."""
    if not isinstance(on_fault, types.MethodType):
        return on_fault
    ref = weakref.WeakMethod(on_fault)

    def sink(where: str, exc: BaseException) -> None:
        fn = ref()
        if fn is not None:
            fn(where, exc)

    return sink
