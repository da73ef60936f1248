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

Threads: module calls are open on the thread that runs them, and a collective reads those of
its own thread.  One issued on a thread with no module call open (a data loader's, a checkpoint
writer's) while the window's thread runs `fc2` is not `fc2`'s: it counts as outside every
module (phase `outside`, or for no module when none is tracked), and its span nests at the
window's root (`ELSEWHERE`), not under a span of another thread.  A thread with a window of its
own records its collectives there instead (each thread's window is its context's).

Forward prefetch: FSDP2's explicit forward prefetch (`set_modules_to_forward_prefetch`)
all-gathers layer i+1's parameters from layer i's pre-forward hook; hyper-parallel's
`fully_shard` prefetches the same way.  Such a collective counts, and nests, under the module
whose parameter group issued it, with the modules enclosing it — not under the module that
happened to be running (that one is kept as `hp_otel.collective.issued_by`).  The group's module has
not been called yet in this step (it runs next), so its enclosing calls are the open calls that
enclose it (by their names, or by its latest call's chain) plus the calls of that chain that are
not open; a short module span of the group's module, nested under the innermost of those open
calls, holds the collective.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from threading import get_ident as _get_ident
from types import MappingProxyType
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
_NO_MODULE = MappingProxyType({phase: of(phase) for phase in (schema.PHASE_FORWARD, schema.PHASE_BACKWARD)})
# The same places for a collective of another thread than the window's, with no module call of its
# own: distinct objects, so its span nests at the window's root (`is_elsewhere`).
_OUTSIDE_ELSEWHERE = of(schema.PHASE_OUTSIDE, "", (schema.OUTSIDE_FQN,))
_NO_MODULE_ELSEWHERE = of(schema.PHASE_FORWARD)
_NO_STACK: tuple[tuple[str, str], ...] = ()


def is_elsewhere(place: Attribution) -> bool:
    """A collective of another thread than the window's, in no module call of its thread."""
    return place is _OUTSIDE_ELSEWHERE or place is _NO_MODULE_ELSEWHERE


def encloses(outer: str, inner: str) -> bool:
    """True if module `outer` contains module `inner` by their names (the root contains every module)."""
    return outer == schema.ROOT_MODULE_FQN or inner.startswith(outer + ".")


class GroupCalls(NamedTuple):
    """What a module source says about the parameter group issuing the collective running now."""

    chains: tuple[tuple[ModuleCall, ...], ...]  # per module of the group: its latest call's chain, itself last
    phase: str  # the group method's own phase (gathering: forward; reducing: backward), for a call outside every module


ParamResolver = Callable[[], "GroupCalls | None"]


def _calls_not_in(chains: Sequence[tuple[ModuleCall, ...]], enclosing: Collection[str]) -> tuple[ModuleInfo, ...]:
    """The modules of `chains` (in order, each once) that are not `enclosing`: the spans to open."""
    seen = set(enclosing)
    opened = []
    for chain in chains:
        for call in chain:
            fqn = call.module.fqn
            if fqn not in seen:
                seen.add(fqn)
                opened.append(call.module)
    return tuple(opened)


def forward_owner(
    modules: Sequence[tuple[str, str]], chains: Sequence[tuple[ModuleCall, ...]] | None
) -> Attribution | None:
    """Where a collective issued while `modules` (open (fqn, phase), innermost last) run belongs, when
    `chains` (per module of a parameter group: its latest call chain, itself last) name a group
    whose modules are not all open; None when there is no group, or its only module is open (its
    own pre-forward).

    A group of several modules (`fully_shard([norm, lm_head])`) moves the parameters of each: its
    collective counts for every one of them and the calls enclosing each; those not open get short
    spans around it, nested under the innermost open call (one span tree: the group's modules
    nest in one another there)."""
    if not chains or not modules:
        return None
    open_fqns = {f for f, _ in modules}
    phase = modules[-1][1]
    running = [chain for chain in chains if chain[-1].module.fqn in open_fqns]
    if running:  # its own pre-forward (one of the group's modules runs): the others' spans inside it
        enclosing = {f for f, p in modules if p == phase}
        opened = _calls_not_in(chains, enclosing)
        if not opened:
            return None
        return Attribution(
            phase, opened[-1].fqn, frozenset(enclosing | {m.fqn for m in opened}), None, None, opened, modules[-1]
        )
    groups = [chain[-1].module.fqn for chain in chains]
    known = {call.module.fqn for chain in chains for call in chain}
    depth = -1
    for i in range(len(modules) - 1, -1, -1):
        f, p = modules[i]
        if p == phase and (f in known or any(encloses(f, g) for g in groups)):
            depth = i
            break
    enclosing = {f for f, p in modules[: depth + 1] if p == phase}
    opened = _calls_not_in(chains, enclosing)
    owners = frozenset(enclosing | {m.fqn for m in opened})
    return Attribution(
        phase, opened[-1].fqn, owners, modules[-1][0], None, opened, modules[depth] if depth >= 0 else None
    )


def outside_owner(group: GroupCalls) -> Attribution:
    """A parameter group's collective issued outside every module and outside autograd (a pipeline
    schedule's `unshard()` before the first micro-batch, its `post_backward()` after the last): in
    the group method's phase, for the group's modules and the calls enclosing each, in spans of
    their own under the window's root."""
    opened = _calls_not_in(group.chains, ())
    return Attribution(group.phase, opened[-1].fqn, frozenset(m.fqn for m in opened), None, None, opened, None)


class Attributor:
    """Decides every collective's `Attribution` for one recorder (see the module's docstring)."""

    __slots__ = ("_on_fault", "backward_calls", "node", "param", "stacks", "thread")

    def __init__(self, stacks: dict[int, list[tuple[str, str]]], on_fault: FaultSink) -> None:
        self.stacks = stacks  # the recorder's open (fqn, phase) per thread, innermost last: the same dict
        self.thread = 0  # the window's thread (the recorder's)
        self.node: Resolver | None = None  # the module calls owning the running backward work
        self.param: ParamResolver | None = (
            None  # the parameter group issuing the collective now, with its modules' calls
        )
        self.backward_calls: tuple[ModuleCall, ...] = ()  # those whose backward spans are open (the recorder's)
        self._on_fault = weak_sink(on_fault)

    def attribute(self, hint: str | None) -> Attribution:
        """The collective running now: `hint` is the source's phase (backward inside autograd), or None."""
        ident = _get_ident()
        modules = self.stacks.get(ident, _NO_STACK)
        # Backward follows the running autograd node wherever it runs: also inside
        # `optimizer.step(closure)`, whose open pseudo-module holds no backward work of its own.
        if not modules or (hint == schema.PHASE_BACKWARD and modules[-1][1] == schema.PHASE_OPTIMIZER):
            if hint != schema.PHASE_FORWARD:
                chain, issued_by, extra = self._backward_chain()
            else:
                chain, issued_by, extra = None, None, ()
            if chain is None:
                if hint == schema.PHASE_BACKWARD:
                    return _NO_MODULE[hint]
                if ident != self.thread:  # another thread's, in no module call of its own: see the docstring
                    return _NO_MODULE_ELSEWHERE if self.node is None else _OUTSIDE_ELSEWHERE
                group = self._group()  # outside autograd and every module: a parameter group's call?
                if group is not None:
                    return outside_owner(group)
                if self.node is None:
                    return _NO_MODULE.get(hint or schema.PHASE_FORWARD) or of(hint or schema.PHASE_FORWARD)
                return _OUTSIDE
            if not chain:
                return _new(Attribution, (schema.PHASE_BACKWARD, "", (), issued_by, chain, (), None))
            owners = {call.module.fqn for call in chain}
            if extra:  # the group's other modules: short spans inside the chain's innermost call
                owners.update(m.fqn for m in extra)
                under = (chain[-1].module.fqn, schema.PHASE_BACKWARD)
                return _new(Attribution, (schema.PHASE_BACKWARD, extra[-1].fqn, owners, issued_by, chain, extra, under))
            return _new(Attribution, (schema.PHASE_BACKWARD, chain[-1].module.fqn, owners, issued_by, chain, (), None))
        fqn, phase = modules[-1]
        if self.param is not None:
            group = self._group()
            try:
                owner = forward_owner(modules, group.chains) if group is not None else None
            except Exception as exc:
                self._on_fault("param_attribution", exc)
                owner = None
            if owner is not None:  # FSDP prefetching another module's parameters, or a group of several
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

    def _group(self) -> GroupCalls | None:
        """The parameter group issuing the collective now (None: none, or no module of it known)."""
        resolve = self.param
        if resolve is None:
            return None
        try:
            group = resolve()
        except Exception as exc:
            self._on_fault("param_attribution", exc)
            return None
        return group if group is not None and group.chains else None

    def _backward_chain(
        self,
    ) -> tuple[tuple[ModuleCall, ...] | None, str | None, tuple[ModuleInfo, ...]]:
        """The module calls a backward collective belongs to, who issued it when that differs (FSDP
        prefetching a layer's parameters from another's hook, or from the final callback; None when
        the running module is the one it counts for), and the other modules of its parameter group
        (spans to open inside those calls).  The calls are None outside backward."""
        chain = self.running_chain()
        if chain is None or self.param is None:
            return chain, None, ()
        group = self._group()
        if group is None:
            return chain, None, ()
        issuer = chain[-1].module.fqn if chain else ""
        chains = group.chains
        own = next((c for c in chains if c[-1].module.fqn == issuer), None)
        if own is not None:  # its own group's work: nobody else issued it
            return own, None, _calls_not_in([c for c in chains if c is not own], {c.module.fqn for c in own})
        first = chains[0]
        return first, issuer, _calls_not_in(chains[1:], {c.module.fqn for c in first})
