"""The observer interface between sources (framework hooks) and the recorder.

A source translates one framework's hooks into these calls and knows nothing about
OpenTelemetry; the recorder implements them and knows nothing about frameworks.
Every method must be safe to call at any time: the recorder never raises from them.

Sources may also read two flags of the observer at install (absent means True):
`spans_enabled` (False: a counts-only window, install only what counting needs) and
`ops_enabled` (False: no op tracing).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from hp_otel.spans.infos import CollectiveInfo, ModuleCall, ModuleInfo, TensorInfo

# Returns the module calls (outermost first) owning the backward work running now:
# () when backward runs work of no tracked module, None when it cannot tell (not in backward).
NodeAttribution = Callable[[], "tuple[ModuleCall, ...] | None"]


class Observer(Protocol):
    @property
    def accepting(self) -> bool:
        """False while the observer is suspended (a nested mode is active) or closed."""

    def on_module_enter(self, module: ModuleInfo, phase: str) -> None:
        """A module's forward (or its backward) starts; `module` is made once per module by the source."""

    def on_module_exit(self, fqn: str, phase: str, error: BaseException | None = None) -> None: ...

    def on_backward_end(self) -> None:
        """The autograd pass finished: close backward module spans still open."""

    def on_backward_modules(self, chain: Sequence[ModuleCall]) -> None:
        """Backward work of these module calls (outermost first) starts now: backward spans of
        other calls close, theirs open — siblings follow each other, never nest."""

    def set_node_attribution(self, resolve: NodeAttribution | None) -> None:
        """A module source says which module calls own the running backward work; a backward
        collective then counts for exactly those (see README "Semantics")."""

    def on_op_enter(self, op_name: str, inputs: Sequence[TensorInfo]) -> None: ...

    def on_op_exit(self, op_name: str, outputs: Sequence[TensorInfo], error: BaseException | None = None) -> None: ...

    def on_collective_issue(self, info: CollectiveInfo, start_ns: int, phase: str | None = None) -> Any:
        """A collective is about to run: returns a ticket for `on_collective` (None when not recording).

        Optional for sources: a collective that never returns is visible only through this
        (the hang watchdog writes it as in flight), and its sequence number is taken here.
        """

    def on_collective(
        self,
        info: CollectiveInfo,
        start_ns: int,
        end_ns: int,
        error: BaseException | None = None,
        phase: str | None = None,
        ticket: Any = None,
        awaits_completion: bool = False,
    ) -> object | None:
        """A collective call returned at `end_ns` (`ticket`: what `on_collective_issue` returned).
        With `awaits_completion` it was only launched: the returned token goes to
        `on_collective_complete` when it finishes."""

    def on_collective_complete(self, token: object, end_ns: int, completion: str) -> None:
        """The collective of `token` finished (schema.COMPLETION_WAIT / COMPLETION_WORK); any thread."""

    def on_redistribute_enter(self, src_placements: str, dst_placements: str, shape: tuple[int, ...]) -> None: ...

    def on_redistribute_exit(self, error: BaseException | None = None) -> None: ...

    def on_fault(self, where: str, exc: BaseException) -> None:
        """A source's own hook failed; the traced code went on."""


class Source(Protocol):
    """Installs framework hooks that feed an observer; uninstall restores everything exactly."""

    def install(self, observer: Observer) -> None: ...

    def uninstall(self) -> None: ...
