"""Where a collective belongs: its phase, its module, the modules it counts for, who issued it.

One decision, made once per collective (when it is issued, or when it returns where no issue
record is made) and handed as one `Attribution` to both the counts and the span, so the two
cannot disagree.  The inputs are what the recorder tracks (the open module calls) and what a
module source says through two resolvers: the module calls owning the running autograd node
(`set_node_attribution`) and those whose parameter group issues the collective now (FSDP:
`set_param_attribution`).

The rules (docs/attribution.md):

- inside a module call: the innermost call's phase, counted for every open call of that phase
  (a recompute: for the calls recomputed and the backward calls whose spans hold it, in phase
  `recompute`); FSDP prefetching another module's parameters: that module's, see `forward_owner`;
- outside every module (or inside only the optimizer's step: `step(closure)` runs the
  backward), in backward with a node resolver: the calls whose forward created the
  running node (for an FSDP collective: those whose parameter group issued it, `issued_by`
  naming who ran it);
- outside every module and not in backward, modules tracked: phase `outside`, counted for
  `OUTSIDE_FQN` (the loss, grad clipping, glue);
- otherwise the source's hint, for no module.

Forward prefetch: FSDP2's explicit forward prefetch (`set_modules_to_forward_prefetch`)
all-gathers layer i+1's parameters from layer i's pre-forward hook; hyper-parallel's
`fully_shard` prefetches the same way.  Such a collective counts, and nests, under the module
whose parameter group issued it, with the modules enclosing it — not under the module that
happened to be running (that one is kept as `hp.collective.issued_by`).  The group's module has
not been called yet in this step (it runs next), so its enclosing calls are the open calls that
enclose it (by their names, or by its latest call's chain) plus the calls of that chain that are
not open; a short module span of the group's module, nested under the innermost of those open
calls, holds the collective.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import NamedTuple

from hp_otel.record.faults import FaultSink, weak_sink
from hp_otel.spans import schema
from hp_otel.spans.infos import ModuleCall, ModuleInfo

Resolver = Callable[[], "tuple[ModuleCall, ...] | None"]


class Attribution(NamedTuple):
    """One collective's place: what its counts, metrics and span all read."""

    phase: str
    fqn: str  # its innermost module ("" for none)
    owners: Collection[str]  # every module it counts for, in `phase`
    issued_by: str | None  # FSDP: the module running when it was issued, if it counts for another
    chain: tuple[ModuleCall, ...] | None  # backward by node: the calls whose backward spans hold it
    opened: tuple[ModuleInfo, ...]  # forward prefetch: module spans to open around it, the group's module last
    under: tuple[str, str] | None  # (fqn, phase) of the open module span those nest under; None: the window's root


_new = tuple.__new__  # an Attribution without a Python frame (NamedTuple's __new__ is one)


def of(phase: str, fqn: str = "", owners: Collection[str] = ()) -> Attribution:
    """A plain attribution (no backward chain, no prefetch): for sources and tests that know it."""
    return Attribution(phase, fqn, owners, None, None, (), None)


_OUTSIDE = of(schema.PHASE_OUTSIDE, "", (schema.OUTSIDE_FQN,))
_NO_MODULE = {phase: of(phase) for phase in (schema.PHASE_FORWARD, schema.PHASE_BACKWARD)}


def encloses(outer: str, inner: str) -> bool:
    """True if module `outer` contains module `inner` by their names (the root contains every module)."""
    return outer == schema.ROOT_MODULE_FQN or inner.startswith(outer + ".")


def forward_owner(modules: Sequence[tuple[str, str]], calls: Sequence[ModuleCall] | None) -> Attribution | None:
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
    owners = frozenset(enclosing | {m.fqn for m in opened})
    return Attribution(phase, fqn, owners, modules[-1][0], None, opened, modules[depth] if depth >= 0 else None)


class Attributor:
    """Decides every collective's `Attribution` for one recorder (see the module's docstring)."""

    __slots__ = ("_on_fault", "backward_calls", "modules", "node", "param")

    def __init__(self, modules: list[tuple[str, str]], on_fault: FaultSink) -> None:
        self.modules = modules  # the recorder's open (fqn, phase), innermost last: the same list
        self.node: Resolver | None = None  # the module calls owning the running backward work
        self.param: Resolver | None = None  # the module calls whose parameter group issues the collective now
        self.backward_calls: tuple[ModuleCall, ...] = ()  # those whose backward spans are open (the recorder's)
        self._on_fault = weak_sink(on_fault)

    def attribute(self, hint: str | None) -> Attribution:
        """The collective running now: `hint` is the source's phase (backward inside autograd), or None."""
        modules = self.modules
        # Backward follows the running autograd node wherever it runs: also inside
        # `optimizer.step(closure)`, whose open pseudo-module holds no backward work of its own.
        if not modules or (hint == schema.PHASE_BACKWARD and modules[-1][1] == schema.PHASE_OPTIMIZER):
            chain, issued_by = self._backward_chain() if hint != schema.PHASE_FORWARD else (None, None)
            if chain is None:
                if self.node is None or hint == schema.PHASE_BACKWARD:
                    return _NO_MODULE.get(hint or schema.PHASE_FORWARD) or of(hint or schema.PHASE_FORWARD)
                return _OUTSIDE
            if not chain:
                return _new(Attribution, (schema.PHASE_BACKWARD, "", (), issued_by, chain, (), None))
            owners = {call.module.fqn for call in chain}
            return _new(Attribution, (schema.PHASE_BACKWARD, chain[-1].module.fqn, owners, issued_by, chain, (), None))
        fqn, phase = modules[-1]
        resolve = self.param
        if resolve is not None:
            try:
                owner = forward_owner(modules, resolve())
            except Exception as exc:
                self._on_fault("param_attribution", exc)
                owner = None
            if owner is not None:  # FSDP prefetching another module's parameters: that module's
                return owner
        # The open modules of its own phase, exactly the module spans of that phase it nests under.
        owners = {f for f, p in modules if p == phase}
        if phase == schema.PHASE_RECOMPUTE:
            # And the backward calls whose spans hold the recompute (their node asked for it): in
            # phase recompute, no backward work of theirs, but inside their calls, so every call's
            # counts add up to the collectives inside it (the root's to the window's).
            owners.update(f for f, p in modules if p == schema.PHASE_BACKWARD)
            owners.update(call.module.fqn for call in self.backward_calls)
        return _new(Attribution, (phase, fqn, owners, None, None, (), None))

    def running_chain(self) -> tuple[ModuleCall, ...] | None:
        """The module calls owning the running backward work (None: no resolver, or not in backward)."""
        resolve = self.node
        if resolve is None:
            return None
        try:
            return resolve()
        except Exception as exc:  # counted without a module rather than lost
            self._on_fault("node_attribution", exc)
            return None

    def _backward_chain(self) -> tuple[tuple[ModuleCall, ...] | None, str | None]:
        """The module calls a backward collective belongs to, and who issued it when that differs
        (FSDP prefetching a layer's parameters from another's hook, or from the final callback);
        None when the running module is the one it counts for."""
        chain = self.running_chain()
        resolve = self.param
        if chain is None or resolve is None:
            return chain, None
        try:
            owners = resolve()
        except Exception as exc:
            self._on_fault("param_attribution", exc)
            return chain, None
        if owners is None:
            return chain, None
        issuer = chain[-1].module.fqn if chain else ""
        if owners and owners[-1].module.fqn == issuer:  # its own group's work: nobody else issued it
            return owners, None
        return owners, issuer
