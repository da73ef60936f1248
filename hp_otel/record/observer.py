"""The observer interface between sources (framework hooks) and the recorder.

A source translates one framework's hooks into these calls and knows nothing about
OpenTelemetry; the recorder implements them and knows nothing about frameworks.
Every method must be safe to call at any time: the recorder never raises from them.

Besides the calls, sources read four flags: `accepting` on every hook call, the others
when they attach (what the window records, so a source installs only what is needed)
or when a collective returns (`wants_completion`).
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
        """False while the observer is suspended (a nested mode is active) or closed: a hook
        then passes the call straight through (read on every hook call, so it is a plain attribute)."""

    @property
    def spans_enabled(self) -> bool:
        """False in a counts-only window (`record_spans=False`, an unsampled step): sources
        install only what counting needs (the collective hook, module forward hooks) and
        describe a collective without shapes."""

    @property
    def ops_enabled(self) -> bool:
        """False when the window leaves out op spans (`ops=False`): sources install no op hook."""

    @property
    def module_depth(self) -> int | None:
        """How deep module sources hook (`CommDebugMode(module_depth=)`; None: every module): the root
        is 0, a module of k dotted parts is k. A deeper module's work, forward and backward, runs
        inside its ancestor's hooks at the depth, so it counts there."""

    @property
    def wants_completion(self) -> bool:
        """True while a hang watchdog watches the window: a source that can tell when a returned
        collective's work is done passes that probe as `on_collective(..., done=)`, so the
        collective stays in flight (what the watchdog writes) until it is."""

    def on_module_enter(self, module: ModuleInfo, phase: str) -> None:
        """A module's forward (or its backward) starts; `module` is made once per module by the source."""

    def on_module_exit(self, fqn: str, phase: str, error: BaseException | None = None) -> None:
        """That module's forward (or backward) ended, with `error` if it raised."""

    def on_backward_end(self) -> None:
        """The autograd pass finished: close backward module spans still open."""

    def on_backward_modules(self, chain: Sequence[ModuleCall]) -> None:
        """Backward work of these module calls (outermost first) starts now: backward spans of
        other calls close, theirs open — siblings follow each other, never nest."""

    def set_node_attribution(self, resolve: NodeAttribution | None) -> None:
        """A module source says which module calls own the running backward work; a backward
        collective then counts for exactly those (see docs/reference/semantics.md)."""

    def on_op_enter(self, op_name: str, inputs: Sequence[TensorInfo]) -> None:
        """An op at the level the user wrote it (`linear`, `matmul`) starts; only while `ops_enabled`."""

    def on_op_exit(self, op_name: str, outputs: Sequence[TensorInfo], error: BaseException | None = None) -> None:
        """That op returned `outputs` (or raised `error`)."""

    def on_collective_issue(self, info: CollectiveInfo, start_ns: int, phase: str | None = None) -> Any:
        """A collective is about to run: returns a ticket for `on_collective` (None when not recording;
        in a counts-only window a light one that only the staleness gauges read).  `phase` is the
        source's hint (backward while autograd runs); the observer decides the collective's place.

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
        done: Callable[[], bool] | None = None,
        device: Callable[[], int | None] | None = None,
    ) -> object | None:
        """A collective call returned at `end_ns` (`ticket`: what `on_collective_issue` returned).
        With `awaits_completion` it was only launched: the returned token goes to
        `on_collective_complete` when it finishes.  `done` (only asked for while
        `wants_completion`): says, from any thread, whether its work is done; until then the
        issued collective stays in flight.  `device` (CUDA tensors only): returns the collective's
        device time in ns once the events recorded around it are complete, else None; asked
        when its span is built, never waiting (the span then keeps the host time)."""

    def on_collective_complete(self, token: object, end_ns: int, completion: str) -> None:
        """The collective of `token` finished (schema.COMPLETION_WAIT / COMPLETION_WORK); any thread."""

    def on_collective_wait(self, token: object, start_ns: int, end_ns: int) -> None:
        """A thread waited for the collective of `token` (`wait_tensor`, `Work.wait()`) from `start_ns`
        to `end_ns`: the part of the collective the step did not overlap (docs/overlap.md); any thread."""

    def on_redistribute_enter(self, src_placements: str, dst_placements: str, shape: tuple[int, ...]) -> None:
        """A DTensor redistribute of a tensor of `shape` starts (placements as text: `Shard(dim=0)`,
        `Replicate()`); the collectives it issues nest under it."""

    def on_redistribute_exit(self, error: BaseException | None = None) -> None:
        """The innermost open redistribute ended."""

    def on_fault(self, where: str, exc: BaseException) -> None:
        """A source's own hook failed; the traced code went on."""


class Source(Protocol):
    """Framework hooks that feed an observer for one window (what `CommDebugMode(extra_sources=)` takes).

    Not to be confused with `hp_otel.install()`, which keeps hooks between windows.
    """

    def attach(self, observer: Observer) -> None:
        """The window opens: put the hooks in, reporting to `observer`."""

    def detach(self) -> None:
        """The window closes: take out what `attach` put in, exactly (also after a partial attach)."""
