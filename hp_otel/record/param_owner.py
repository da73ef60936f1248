"""Forward collectives a parameter group issues for a module that is not running (FSDP prefetch).

FSDP2's explicit forward prefetch (`set_modules_to_forward_prefetch`) all-gathers layer
i+1's parameters from layer i's pre-forward hook; hyper-parallel's `fully_shard`
prefetches the same way.  Such a collective counts, and nests, under the module whose
parameter group issued it, with the modules enclosing it — not under the module that
happened to be running (that one is kept as `hp.collective.issued_by`).

The group's module has not been called yet in this step (it runs next), so its enclosing
calls are the open calls that enclose it (by their names, or by its latest call's chain)
plus the calls of that chain that are not open.  The span tree says the same: a short
module span of the group's module, nested under the innermost of those open calls, holds
the collective.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hp_otel.spans import schema as s
from hp_otel.spans.infos import ModuleCall, ModuleInfo


@dataclass(frozen=True, slots=True)
class ForwardOwner:
    counted: frozenset[str]  # every module the collective counts for, in the running phase
    fqn: str  # the group's module: the collective's innermost module
    issued_by: str  # the module running when it was issued
    opened: tuple[ModuleInfo, ...]  # module spans to open around it, outermost first, the group's module last
    under: tuple[str, str] | None  # (fqn, phase) of the open module span they nest under; None: the window's root


def encloses(outer: str, inner: str) -> bool:
    """True if module `outer` contains module `inner` by their names (the root contains every module)."""
    return outer == s.ROOT_MODULE_FQN or inner.startswith(outer + ".")


def forward_owner(modules: Sequence[tuple[str, str]], calls: Sequence[ModuleCall] | None) -> ForwardOwner | None:
    """Where a collective issued while `modules` (open (fqn, phase), innermost last) run belongs, when
    `calls` (the group's module's latest call chain, itself last) name a parameter group's module
    that is not open; None when there is no group or its module is open (its own pre-forward)."""
    if not calls or not modules:
        return None
    group = calls[-1].module
    fqn = group.fqn
    if any(f == fqn for f, _ in modules):
        return None
    phase = modules[-1][1]
    known = {call.module.fqn for call in calls}
    depth = -1
    for i in range(len(modules) - 1, -1, -1):
        f, p = modules[i]
        if p == phase and (f in known or encloses(f, fqn)):
            depth = i
            break
    enclosing = {f for f, p in modules[: depth + 1] if p == phase}
    opened = tuple(call.module for call in calls if call.module.fqn not in enclosing)
    return ForwardOwner(
        counted=frozenset(enclosing | {m.fqn for m in opened}),
        fqn=fqn,
        issued_by=modules[-1][0],
        opened=opened,
        under=modules[depth] if depth >= 0 else None,
    )
