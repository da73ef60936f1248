"""Opening and closing a `CommDebugMode` window: claim the thread and model, attach the sources,
start the watchdog; and undo all of it, whatever interrupts (a Ctrl-C waits: `signal_guard`).

`enter` and `exit` are the facade's `__enter__` and `__exit__` (signal-guarded from their first
instruction, so they are these functions themselves, not calls from the facade into them).
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from typing import Any

from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from hp_otel.common import said_once
from hp_otel.export.providers import (
    default_meter_provider,
    default_tracer_provider,
    get_tracer,
    is_internal_tracer_provider,
)
from hp_otel.mode import registry
from hp_otel.mode.former_sources import SAID_ONCE_KEY
from hp_otel.mode.options import WindowOptions
from hp_otel.record import signal_guard
from hp_otel.record.call_stack import shared_call_stack
from hp_otel.record.instruments import get_instruments
from hp_otel.record.metric_labels import ModuleLabel
from hp_otel.record.observer import Source
from hp_otel.record.recorder import WindowRecorder
from hp_otel.record.settings import RecorderSettings
from hp_otel.record.signal_guard import GUARD

# Packages whose frames a call stack leaves out (`stack=`): hp_otel's, the frameworks' own, and
# typing_extensions (its @deprecated wrapper sits between torch's deprecated collectives and the caller).
STACK_SKIPPED_PACKAGES = ("hp_otel", "torch", "mindspore", "hyper_parallel", "typing_extensions")

CommDebugMode = Any  # the facade's class (not imported: it imports this module)


class OpenState:
    """What an open window holds, besides its recorder: set by `activate`, undone by `deactivate`."""

    __slots__ = ("attached", "claim", "guarded", "outer", "token", "watchdog_started")

    def __init__(self) -> None:
        self.attached: list[tuple[str, Source]] = []  # (the source's class name, what was attached)
        self.token: contextvars.Token[Any] | None = None  # registry.current_mode's, while open
        self.outer: Any = None  # the window this one suspends
        self.guarded = False  # this window holds the signal guard (entered on the main thread)
        self.claim = registry.Claim()  # its place among the open windows of its thread and model
        self.watchdog_started = False


def build_recorder(options: WindowOptions) -> tuple[WindowRecorder, InMemoryMetricReader | None, bool]:
    """The window's recorder, the in-memory metric reader (with hp_otel's default meter provider), and
    whether its deferred spans are built when it closes (they are meant for real processors then)."""
    reader: InMemoryMetricReader | None = None
    tracer_provider, meter_provider = options.tracer_provider, options.meter_provider
    if tracer_provider is None:
        tracer_provider = default_tracer_provider()
    if meter_provider is None:
        meter_provider, reader = default_meter_provider()
    internal = is_internal_tracer_provider(tracer_provider)
    settings = RecorderSettings(
        live=options.live,
        max_spans=options.max_spans,
        spans_enabled=options.record_spans,
        ops_enabled=options.ops,
        hooks=options.hooks,
        store_only=internal,  # past max_spans: counted, not built
        call_stack=shared_call_stack(options.stack_depth, STACK_SKIPPED_PACKAGES),
        module_label=ModuleLabel(options.metric_depth),
        module_depth=options.hooked_depth,
    )
    recorder = WindowRecorder(get_tracer(tracer_provider), get_instruments(meter_provider), settings)
    return recorder, reader, not options.live and not internal


@signal_guard.protect
def enter(mode: CommDebugMode) -> CommDebugMode:
    GUARD.critical += 1  # first: a Ctrl-C from here on waits until the hooks are in (signal_guard)
    # All or nothing: a held signal is sent again by send_held(); a KeyboardInterrupt
    # from it (or anything else that interrupts) rolls back what was installed.
    entering = False
    try:
        try:
            if mode._open.token is not None:
                raise RuntimeError("this CommDebugMode is already active; create a new one to nest")
            entering = True
            mode._open.guarded = signal_guard.acquire()
            activate(mode)
        finally:
            GUARD.critical -= 1  # first in the block: nothing can interrupt before it
            signal_guard.send_held()
        return mode
    except BaseException:
        if entering:
            GUARD.critical += 1
            try:
                deactivate(mode, None)
            finally:
                GUARD.critical -= 1
                signal_guard.send_held()
        raise


@signal_guard.protect
def exit(mode: CommDebugMode, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
    GUARD.critical += 1  # first: see enter
    later: list[CommDebugMode] = []
    try:
        later = mode._open.claim.later_windows(mode)
        for window in reversed(later):  # innermost first
            deactivate(window, None)
        deactivate(mode, exc)
    except BaseException:
        deactivate(mode, exc)  # finish what the interruption left, then let it propagate
        raise
    finally:
        GUARD.critical -= 1
        signal_guard.send_held()  # a Ctrl-C that came meanwhile is raised here, after uninstalling
    if later:
        raise RuntimeError(
            f"CommDebugMode: this window was closed while {len(later)} window(s) opened after it on the same "
            "thread were still open (a window left open across a generator's yield, or __exit__ called out "
            "of order). Windows must close in the reverse order they opened, since torch's modes are a stack: "
            "the later window(s) were closed first (their records so far are kept, and their own exit does "
            "nothing now), then this one, and every hook was removed"
        ) from exc


def activate(mode: CommDebugMode) -> None:
    registry.claim(mode, mode.module, mode._open.claim)
    recorder = mode._recorder
    recorder.reset()
    mode._store.clear()
    stale = registry.current_mode.get()
    if stale is not None and not stale.active:  # closed on another thread, it stayed in this context
        registry.current_mode.set(None)
    mode._open.token = registry.current_mode.set(mode)
    outer = mode._open.token.old_value if mode._open.token.old_value is not contextvars.Token.MISSING else None
    if outer is not None:
        outer._recorder.suspended += 1
        mode._open.outer = outer
    recorder.start()
    with registry.install_lock:
        for name, source in mode._attachable:
            mode._open.attached.append((name, source))  # listed first: a half-attached source is detached too
            try:
                source.attach(recorder)
            except Exception as exc:  # a source that cannot attach must not stop training
                recorder.on_fault(f"attach:{name}", exc)
                mode._open.attached.pop()
                _detach_one(mode, name, source)
    if mode.options.watchdog is not None:
        _start_watchdog(mode)


def _start_watchdog(mode: CommDebugMode) -> None:
    recorder, watchdog = mode._recorder, mode.options.watchdog
    assert watchdog is not None
    recorder.wants_completion = True  # sources attach a done-probe to returned collectives
    try:
        if watchdog.evidence == "collectives":
            writer: Callable[[str], None] = mode.write_collectives
        else:
            writer = lambda path: mode.write_spans(path, pause=watchdog.pause)  # noqa: E731
        watchdog.start(recorder, writer)
        mode._open.watchdog_started = True
    except Exception as exc:  # a watchdog that cannot start must not stop training
        recorder.wants_completion = False
        recorder.on_fault("watchdog_start", exc)


def deactivate(mode: CommDebugMode, exc: BaseException | None) -> None:
    """Undo `activate` (or the part of it that ran); safe to call again."""
    interrupted: list[BaseException] = []
    recorder = mode._recorder
    if mode._open.watchdog_started:
        mode._open.watchdog_started = False
        try:
            mode.options.watchdog.stop()  # type: ignore[union-attr]
        except Exception as error:
            recorder.on_fault("watchdog_stop", error)
        finally:
            recorder.wants_completion = False
    with registry.install_lock:
        while mode._open.attached:
            name, source = mode._open.attached.pop()
            try:
                _detach_one(mode, name, source)
            except BaseException as error:  # not an Exception: finish the others, then raise it
                interrupted.append(error)
    if recorder.active:
        recorder.stop(exc)
        if mode._build_on_exit:
            recorder.materialise()
        if exc is None and not recorder.comm_counts and not said_once.already_said(SAID_ONCE_KEY, "empty window"):
            _say_why_empty(mode)
    outer, mode._open.outer = mode._open.outer, None
    if outer is not None:
        outer._recorder.suspended -= 1
    token, mode._open.token = mode._open.token, None
    if token is not None:
        try:
            registry.current_mode.reset(token)
        except ValueError:  # exited in another context than entered: leave that context alone
            pass
    mode._open.claim.release(mode)
    guarded, mode._open.guarded = mode._open.guarded, False
    if guarded:
        signal_guard.release()
    if interrupted:
        raise interrupted[0]


def _detach_one(mode: CommDebugMode, name: str, source: Source) -> None:
    try:
        source.detach()
    except Exception as exc:
        mode._recorder.on_fault(f"detach:{name}", exc)


def _say_why_empty(mode: CommDebugMode) -> None:
    """A window that counted nothing says why, once per process: empty counts alone do not tell
    "nothing to see" from "nothing was watched"."""
    try:
        hints = (getattr(src, "why_no_collectives", lambda: None)() for src in mode.sources)
        reason = next(filter(None, hints), None)
        if reason is None:
            reason = _why_empty_from_spans(mode)
    except Exception as exc:  # a hint must never break the window's exit
        mode._recorder.on_fault("why_empty", exc)
        return
    said_once.log_once(
        SAID_ONCE_KEY,
        "empty window",
        "hp_otel: a CommDebugMode window saw no collective: %s (said once per process)",
        reason,
    )


def _why_empty_from_spans(mode: CommDebugMode) -> str:
    from hp_otel.spans import schema

    if not mode._recorder.spans_enabled:
        return "nothing inside it issued a collective (counts-only window: no spans to say more)"
    kinds = {(span.attributes or {}).get(schema.CALL_KIND) for span in mode.get_finished_spans()}
    if mode.module is not None and schema.KIND_MODULE not in kinds:
        return f"the module= given ({type(mode.module).__name__}) was not called inside the window"
    if schema.KIND_OP not in kinds:
        return "no DTensor op ran inside it (plain tensors need no collective)"
    return "its DTensor ops needed no collective (their inputs were already laid out as the ops need)"


def partial_view(mode: CommDebugMode, what: str) -> None:
    """Read inside the open window: what is not finished yet is not in it (said once per process)."""
    if mode.active and mode._warns_partial_view:
        said_once.log_once(
            SAID_ONCE_KEY,
            "partial view",
            "hp_otel: %s read inside an open CommDebugMode window is a partial view: calls still running and "
            "what comes later are not in it; read after the `with` block for the whole window (said once)",
            what,
        )
