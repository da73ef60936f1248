"""What a window does with each observer event, common to its two paths (`counts_path`, `traced_path`).

A window records either counts and metrics only (an unsampled step) or spans too; which one is
fixed when its recorder is made, so the recorder picks one path then and binds the observer calls
to it: no event asks again. Both keep the same books: the open module calls of each thread, where
each collective belongs (`attribution`), its exact counts, its metrics (`collective_metrics`), the
staleness gauges (`liveness`) and the collectives in flight (`in_flight`).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from time import time_ns
from typing import Any

from hp_otel.record import events as ev
from hp_otel.record.attribution import Attribution, Attributor, ParamResolver, Resolver
from hp_otel.record.collective_metrics import CollectiveMetrics
from hp_otel.record.faults import FaultSink, weak_sink
from hp_otel.record.in_flight import InFlight
from hp_otel.record.liveness import Liveness
from hp_otel.record.settings import RecorderSettings
from hp_otel.spans import schema
from hp_otel.spans.infos import CollectiveInfo, ModuleCall

_get_ident = threading.get_ident
_FORWARD = schema.PHASE_FORWARD


# What a launched collective's completion and waits are reported on: its span's event, or a counts-only
# window's slimmer record (counts_path.py)
_LAUNCHED = (ev.Collective, ev.Launch)


class WindowPath:
    """The books both paths keep, and the observer calls that do the same on both."""

    def __init__(
        self,
        settings: RecorderSettings,
        metrics: CollectiveMetrics,
        liveness: Liveness,
        in_flight: InFlight,
        counts: tuple[dict[str, int], dict[str, str], dict[str, dict[str, dict[str, int]]]],
        on_fault: FaultSink,
    ) -> None:
        self.accepting = False  # the recorder's flag, mirrored: the one each call reads first
        self.wants_completion = False  # a hang watchdog watches: issued collectives are tracked in flight
        self.thread = 0  # the window's thread
        self._on_fault = weak_sink(on_fault)
        self._call_stack = settings.call_stack  # opt-in: the user's frames issuing each collective
        self._metrics = metrics
        self._liveness = liveness
        self._in_flight = in_flight
        self._comm_counts, self._comm_ops, self._module_counts = counts  # the recorder's dicts
        # The open module calls of each thread, (fqn, phase) innermost last (a thread with none: no entry).
        self._stacks: dict[int, list[tuple[str, str]]] = {}
        # Where each collective belongs, decided once (attribution.py); it reads `_stacks`, the same dict.
        # Backward by autograd node (torch): the module calls whose backward is open, outermost first, are
        # its `backward_calls` (a recompute counts for them too).
        self._attribution = Attributor(self._stacks, on_fault)
        # Per window: the next sequence number of each group (name, ranks).
        self._seqs: dict[tuple[str, tuple[int, ...]], int] = {}

    # --- the window -------------------------------------------------------------
    def start(self) -> None:
        self._seqs.clear()
        self._stacks.clear()
        self._attribution.backward_calls = ()
        self.thread = self._attribution.thread = _get_ident()

    def stop(self, error: BaseException | None) -> None:
        """The window ends (with `error` if it raised): no module call stays open."""
        self._stacks.clear()
        self._attribution.backward_calls = ()

    def follow_backward(self, chain: tuple[ModuleCall, ...], time_ns: int) -> None:
        """The module calls whose backward runs now are `chain` (outermost first)."""
        raise NotImplementedError

    # --- observer calls the same on both paths --------------------------------------
    def on_backward_modules(self, chain: Sequence[ModuleCall]) -> None:
        if not self.accepting:
            return
        try:
            chain = tuple(chain)
            open_calls = self._attribution.backward_calls
            if len(chain) < len(open_calls) and all(a is b for a, b in zip(chain, open_calls, strict=False)):
                # An enclosing call's gradient arrives while calls inside it are open (grad hooks on a
                # shared multi-tensor output run in any order): its backward is open already.
                return
            self.follow_backward(chain, time_ns())
        except Exception as exc:
            self._on_fault("backward_modules", exc)

    def set_node_attribution(self, resolve: Resolver | None) -> None:
        self._attribution.node = resolve

    def set_param_attribution(self, resolve: ParamResolver | None) -> None:
        """A module source says which module calls own the parameters a collective moves (FSDP's
        parameter group issuing it): it counts, and nests, under those (attribution.py)."""
        self._attribution.param = resolve

    def on_collective_complete(self, token: Any, end_ns: int, completion: str) -> None:
        """The collective of `token` finished at `end_ns` (its wait_tensor, its Work); any thread."""
        if type(token) not in _LAUNCHED or token.completion != schema.COMPLETION_LAUNCH:
            return
        try:
            token.end_ns = max(end_ns, token.end_ns)
            token.completion = completion
            self._liveness.completed(token, end_ns)
            self._completed(token)
        except Exception as exc:
            self._on_fault("collective_complete", exc)

    def _completed(self, token: ev.Collective | ev.Launch) -> None:
        """A launched collective's completion is known (`token` holds it)."""

    def on_collective_wait(self, token: Any, start_ns: int, end_ns: int) -> None:
        """A thread waited for the collective of `token` from `start_ns` to `end_ns` (before or after
        its completion was reported); any thread."""
        kind = type(token)
        if kind not in _LAUNCHED:
            return
        try:
            if kind is ev.Collective:  # a `Launch` keeps no wait time (only spans and exposure read it)
                token.waited_ns += max(end_ns - max(start_ns, token.start_ns), 0)
            if token.completion != schema.COMPLETION_LAUNCH and token.end_ns > end_ns:
                # done by the time its wait returned: the backend thread's timestamp came late (the GIL)
                token.end_ns = max(end_ns, token.returned_ns)
        except Exception as exc:
            self._on_fault("collective_wait", exc)

    # --- the books --------------------------------------------------------------------
    def _open_call(self, fqn: str, phase: str) -> None:
        """A module call opens on this thread (a recompute's first: the backward calls follow its node)."""
        thread = _get_ident()
        modules = self._stacks.get(thread)
        if modules is None:
            modules = self._stacks[thread] = []
        elif phase is _FORWARD:  # the common case: nothing to follow
            modules.append((fqn, phase))
            return
        if phase == schema.PHASE_RECOMPUTE and (not modules or modules[-1][1] != phase):
            # a recompute starts: the backward calls follow the node that asked for it first, so it
            # nests (and counts) inside their calls (attribution.py)
            chain = self._attribution.running_chain()
            if chain is not None:
                self.follow_backward(chain, time_ns())
        modules.append((fqn, phase))

    def _close_call(self, fqn: str, phase: str) -> None:
        """Forget the innermost open call of `fqn` in `phase`: this thread's, else another's."""
        thread = _get_ident()
        stacks = self._stacks
        mine = stacks.get(thread)
        if mine:  # the common case: this thread's innermost call closes
            top = mine[-1]
            if top[0] == fqn and top[1] == phase:
                del mine[-1]
                if not mine:
                    del stacks[thread]
                return
        key = (fqn, phase)
        for ident, modules in [(thread, mine)] if mine is not None and key in mine else list(stacks.items()):
            for i in range(len(modules) - 1, -1, -1):
                if modules[i] == key:
                    del modules[i]
                    if not modules:  # a thread with no open call has no entry: the dict stays small
                        del stacks[ident]
                    return

    def _end_backward(self) -> None:
        """The autograd pass finished: no backward call stays open."""
        stacks = self._stacks
        for ident, modules in list(stacks.items()):  # the attributor's lists too
            modules[:] = [m for m in modules if m[1] != schema.PHASE_BACKWARD]
            if not modules:
                del stacks[ident]
        self._attribution.backward_calls = ()

    def _redistribute_follows(self, now: int) -> None:
        """A redistribute in backward (also inside an optimizer's step): its node's calls first."""
        modules = self._stacks.get(_get_ident())
        if (not modules or modules[-1][1] == schema.PHASE_OPTIMIZER) and self._attribution.node is not None:
            chain = self._attribution.running_chain()
            if chain is not None:
                self.follow_backward(chain, now)

    def _issue(self, info: CollectiveInfo, start_ns: int, phase: str | None) -> ev.CollectiveIssue:
        """The issue record of a collective about to run: its place, sequence number and call stack,
        in flight until it returns."""
        place = self._attribution.attribute(phase)
        if place.chain is not None:  # backward: its node's modules, before the span finds its parent
            self.follow_backward(place.chain, start_ns)
        if place.opened:  # FSDP: the modules of the group whose parameters move, not running
            self._open_owner(place, start_ns)
        issue = ev.CollectiveIssue(start_ns, info, self._next_seq(info), place)
        call_stack = self._call_stack
        if call_stack is not None:
            issue.stack = call_stack.capture()
        self._in_flight.add(issue)
        self._liveness.issued(issue, start_ns, info.op, info.group)
        return issue

    def _open_owner(self, place: Attribution, time_ns: int) -> None:
        """The modules of the group whose parameters move open around its collective (spans only)."""

    def _count(self, info: CollectiveInfo, place: Attribution) -> None:
        """Exact counts, overall and for each module it belongs to (the same place its span reads)."""
        name = info.name
        counts = self._comm_counts
        counts[name] = counts.get(name, 0) + 1
        self._comm_ops[name] = info.op
        owners = place.owners
        if owners:
            module_counts = self._module_counts
            phase = place.phase
            for fqn in owners:
                per_phase = module_counts.setdefault(fqn, {}).setdefault(phase, {})
                per_phase[name] = per_phase.get(name, 0) + 1

    def _next_seq(self, info: CollectiveInfo) -> int:
        """This collective's index among the window's collectives on its group (one dict update)."""
        key = (info.group, info.group_ranks)
        seqs = self._seqs
        seq = seqs.get(key, 0)
        seqs[key] = seq + 1
        return seq
