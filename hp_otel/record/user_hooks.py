"""The user's span hooks: `fn(span, info)` before a collective, module or op span ends.

As in OpenTelemetry's contrib instrumentations (`request_hook` / `response_hook`): the
span is still writable (add attributes, events): the SDK span for live spans, a deferred
window's `readable_spans.DraftSpan` (the same `Span` methods) otherwise, and `info` is what the
source reported (`CollectiveInfo`, `ModuleInfo`, `OpInfo`).  A hook runs where the span
is built: as the work happens for live spans, at window end or when the spans are first
read for deferred ones (then from the event log, after the training step moved on).
A hook that raises is isolated like hp_otel's own callbacks: counted under
`user_collective_hook` / `user_module_hook` / `user_op_hook` in
`get_callback_error_counts()`, logged once, never raised into training; the span still ends
and is exported. A Ctrl-C (or `SystemExit`) inside a hook is raised, as the user asked, once the
span it ran on has ended: that span is kept too (deferred spans not built yet are built at the
next read).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from opentelemetry.trace import Span

from hp_otel.spans.infos import CollectiveInfo, ModuleInfo, OpInfo

CollectiveHook = Callable[[Span, CollectiveInfo], Any]
ModuleHook = Callable[[Span, ModuleInfo], Any]
OpHook = Callable[[Span, OpInfo], Any]

# The kinds their faults are counted under (get_callback_error_counts()).
COLLECTIVE_HOOK_FAULT = "user_collective_hook"
MODULE_HOOK_FAULT = "user_module_hook"
OP_HOOK_FAULT = "user_op_hook"


@dataclass(frozen=True)
class UserHooks:
    collective: CollectiveHook | None = None
    module: ModuleHook | None = None
    op: OpHook | None = None

    @classmethod
    def checked(cls, collective_hook: Any = None, module_hook: Any = None, op_hook: Any = None) -> UserHooks:
        """The hooks, or a TypeError naming the argument that is not a callable."""
        for argument, hook in (
            ("collective_hook", collective_hook),
            ("module_hook", module_hook),
            ("op_hook", op_hook),
        ):
            if hook is not None and not callable(hook):
                raise TypeError(
                    f"{argument} must be a callable taking (span, info), or None; got {type(hook).__name__}"
                )
        return cls(collective_hook, module_hook, op_hook)


NO_HOOKS = UserHooks()
