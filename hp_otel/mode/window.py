"""Opening and closing a `CommDebugMode` window: claim the thread and model, attach the sources,
start the watchdog; and undo all of it, whatever interrupts (a Ctrl-C waits: `signal_guard`).

`enter` and `exit` are the facade's `__enter__` and `__exit__` (signal-guarded from their first
instruction, so they are these functions themselves, not calls from the facade into them).
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from typing import Any

from hp_otel.common import said_once
from hp_otel.mode import registry
from hp_otel.mode.former_sources import SAID_ONCE_KEY
from hp_otel.record import signal_guard
from hp_otel.record.observer import Source
from hp_otel.record.signal_guard import GUARD

CommDebugMode = Any  # the facade's class (not imported: it imports this module)


@signal_guard.protect
def enter(mode: CommDebugMode) -> CommDebugMode:
    GUARD.critical += 1  # first: a Ctrl-C from here on waits until the hooks are in (signal_guard)
    # All or nothing: a held signal is sent again by send_held(); a KeyboardInterrupt
    # from it (or anything else that interrupts) rolls back what was installed.
    entering = False
    try:
        try:
            if mode._token is not None:
                raise RuntimeError("this CommDebugMode is already active; create a new one to nest")
            entering = True
            mode._guarded = signal_guard.acquire()
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
        later = mode._claim.later_windows(mode)
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
    registry.claim(mode, mode.module, mode._claim)
    recorder = mode._recorder
    recorder.reset()
    mode._store.clear()
    stale = registry.current_mode.get()
    if stale is not None and not stale.active:  # closed on another thread, it stayed in this context
        registry.current_mode.set(None)
    mode._token = registry.current_mode.set(mode)
    outer = mode._token.old_value if mode._token.old_value is not contextvars.Token.MISSING else None
    if outer is not None:
        outer._recorder.suspended += 1
        mode._outer = outer
    recorder.start()
    with registry.install_lock:
        for name, source in mode._attachable:
            mode._attached.append((name, source))  # listed first: a half-attached source is detached too
            try:
                source.attach(recorder)
            except Exception as exc:  # a source that cannot attach must not stop training
                recorder.on_fault(f"attach:{name}", exc)
                mode._attached.pop()
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
        mode._watchdog_started = True
    except Exception as exc:  # a watchdog that cannot start must not stop training
        recorder.wants_completion = False
        recorder.on_fault("watchdog_start", exc)


def deactivate(mode: CommDebugMode, exc: BaseException | None) -> None:
    """Undo `activate` (or the part of it that ran); safe to call again."""
    interrupted: list[BaseException] = []
    recorder = mode._recorder
    if mode._watchdog_started:
        mode._watchdog_started = False
        try:
            mode.options.watchdog.stop()  # type: ignore[union-attr]
        except Exception as error:
            recorder.on_fault("watchdog_stop", error)
        finally:
            recorder.wants_completion = False
    with registry.install_lock:
        while mode._attached:
            name, source = mode._attached.pop()
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
    outer, mode._outer = mode._outer, None
    if outer is not None:
        outer._recorder.suspended -= 1
    token, mode._token = mode._token, None
    if token is not None:
        try:
            registry.current_mode.reset(token)
        except ValueError:  # exited in another context than entered: leave that context alone
            pass
    mode._claim.release(mode)
    guarded, mode._guarded = mode._guarded, False
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
