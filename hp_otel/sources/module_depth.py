"""Which modules a window hooks for `module_depth=`: one rule for every framework's module tree
(torch's `nn.Module`s, MindSpore's `Cell`s)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

M = TypeVar("M")


def module_depth_of(fqn: str) -> int:
    """How deep `fqn` is: the root ("") is 0, `layers` 1, `layers.3` 2 (the dotted parts metric labels keep)."""
    return fqn.count(".") + 1 if fqn else 0


def hooked_within(
    modules: list[tuple[str, M]], depth: int | None, is_container: Callable[[M], bool]
) -> list[tuple[str, M]]:
    """The modules (named, parents first) to hook for `depth` (None: all).

    Those at most `depth` deep, and below a container at the depth its children (recursively):
    the container is never called, so without them what runs inside it would count for the
    container's caller, whose label at the depth differs (`layers.3.attn` is `layers` at 1,
    its caller the root).
    """
    if depth is None:
        return modules
    kept: set[str] = set()
    containers: set[str] = set()
    hooked = []
    for fqn, module in modules:
        parent = fqn.rpartition(".")[0]
        if module_depth_of(fqn) <= depth or (parent in kept and parent in containers):
            kept.add(fqn)
            if is_container(module):
                containers.add(fqn)
            hooked.append((fqn, module))
    return hooked
