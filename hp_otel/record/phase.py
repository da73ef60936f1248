"""Which phase a call runs in, from what its source can see: one owner for the rules.

Sources see one fact about the running code: whether autograd is running it (torch's graph
task id is not -1); the span builder sees the module calls it holds open.  The rules that turn
those facts into a phase live here, so a collective's hint, a module call's phase and the phase
an op or redistribute span carries cannot drift apart:

- a collective issued while autograd runs is a backward one, otherwise a forward one; this is
  the *hint* a collective source hands on, which `attribution.Attributor.attribute` refines
  into the collective's phase (a recompute, the optimizer, outside every module);
- a module's forward call while autograd runs is activation checkpointing's recomputation
  (phase `recompute`), otherwise a forward call;
- an op or redistribute takes the phase of the innermost module call open around it, and is
  a forward one when none is.

A source that cannot tell (its framework is not loaded) gives no hint (None): the attribution
then decides from the module calls alone.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from hp_otel.spans import schema

FORWARD = schema.PHASE_FORWARD
BACKWARD = schema.PHASE_BACKWARD
RECOMPUTE = schema.PHASE_RECOMPUTE


# The two rules as tables indexed by whether autograd runs (False, True): a hook that runs for every
# module call reads its phase with one subscript, no Python call.
COLLECTIVE: Final = (FORWARD, BACKWARD)
FORWARD_CALL: Final = (FORWARD, RECOMPUTE)


def of_collective(autograd_running: bool) -> str:
    """The phase hint of a collective issued now: backward inside autograd, else forward."""
    return COLLECTIVE[autograd_running]


def of_forward_call(autograd_running: bool) -> str:
    """The phase of a module's forward call starting now: a forward inside backward is a recompute."""
    return FORWARD_CALL[autograd_running]


# The phase of an op or redistribute outside every module call.
OUTSIDE_MODULES: Final = FORWARD


def enclosing(module_phases: Iterable[str]) -> str:
    """The phase of work inside the open module calls given innermost first: the innermost's, else
    `OUTSIDE_MODULES`.  The span builder, which asks for every op and redistribute, applies it with a
    plain loop over its open calls (no generator); a test holds the two to the same answers."""
    for phase in module_phases:
        return phase
    return OUTSIDE_MODULES
