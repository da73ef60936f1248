"""CommDebugMode: the user-facing context manager.

It wires sources (framework hooks) to a WindowRecorder for the duration of a `with`
block, then answers queries — counts from exact in-process counters, everything else
rendered from the finished spans in its local store.
"""

from __future__ import annotations

import contextvars
import logging
import os
import threading
import time
import warnings
from asyncio import events as asyncio_events
from collections.abc import Callable, Iterable
from typing import Any

from opentelemetry.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import TracerProvider

from hp_otel.common import said_once
from hp_otel.common.files import check_path, write_text_atomically
from hp_otel.export.providers import (
    default_meter_provider,
    default_tracer_provider,
    get_tracer,
    is_internal_tracer_provider,
)
from hp_otel.record import signal_guard
from hp_otel.record.call_stack import check_depth, depth_from_env, shared_call_stack
from hp_otel.record.instruments import get_instruments
from hp_otel.record.memory import return_freed_memory
from hp_otel.record.metric_labels import ModuleLabel, resolve_depth
from hp_otel.record.observer import Observer, Source
from hp_otel.record.recorder import WindowRecorder
from hp_otel.record.settings import RecorderSettings
from hp_otel.record.signal_guard import GUARD
from hp_otel.record.user_hooks import CollectiveHook, ModuleHook, OpHook, UserHooks
from hp_otel.record.watchdog import HangWatchdog
from hp_otel.render import json_dump, module_info, table
from hp_otel.render.levels import noise_level as parse_noise_level
from hp_otel.sources import check_engine, default_sources, is_mindspore_cell, is_torch_module
from hp_otel.spans.call_tree import CallRecord, build_call_tree
from hp_otel.spans.exposure import ExposureReport

logger = logging.getLogger("hp_otel")

DEFAULT_MAX_SPANS = 100_000
_LARGE_WINDOW_SPANS = 10_000  # clear() of a window this large hands the freed memory back to the system
# The innermost active mode of this context: a mode entered inside another suspends it.
_current_mode: contextvars.ContextVar[CommDebugMode | None] = contextvars.ContextVar(
    "hp_otel_current_mode", default=None
)
# Packages whose frames a call stack leaves out (`stack=`): hp_otel's, the frameworks' own, and
# typing_extensions (its @deprecated wrapper sits between torch's deprecated collectives and the caller).
STACK_SKIPPED_PACKAGES = ("hp_otel", "torch", "mindspore", "hyper_parallel", "typing_extensions")
# One lock for installing and removing hooks, so modes entered on several threads do not interleave.
_install_lock = threading.RLock()


# Windows open on each thread (with the asyncio task that opened them), and the root modules
# traced now (id -> (module, thread ident, open windows)): see CommDebugMode._claim_thread_and_module.
_thread_state = threading.local()
_traced_modules: dict[int, tuple[Any, int, int]] = {}


def _windows_of_this_thread() -> list[tuple[Any, Any]]:
    stack = getattr(_thread_state, "windows", None)
    if stack is None:
        stack = _thread_state.windows = []
    return stack


def _current_task() -> Any:
    """The running asyncio task, None outside one (cheap when no event loop runs)."""
    if asyncio_events._get_running_loop() is None:
        return None
    import asyncio

    return asyncio.current_task()


def _task_name(task: Any) -> str:
    return "no asyncio task" if task is None else f"asyncio task {task.get_name()!r}"


def _thread_name(ident: int) -> str:
    for thread in threading.enumerate():
        if thread.ident == ident:
            return f"thread {thread.name!r}"
    return f"thread {ident}"


def _module_tree(module: Any) -> list[Any]:
    """The module and every submodule (torch `modules()`, MindSpore `cells_and_names()`), each once."""
    if is_torch_module(module):
        return list(module.modules())
    cells = getattr(module, "cells_and_names", None)
    if callable(cells):
        seen: dict[int, Any] = {id(module): module}
        for _name, cell in cells():
            seen.setdefault(id(cell), cell)
        return list(seen.values())
    return [module]


def check_providers(tracer_provider: Any, meter_provider: Any) -> None:
    """OpenTelemetry providers or None (the default); else a TypeError naming the argument."""
    if tracer_provider is not None and not callable(getattr(tracer_provider, "get_tracer", None)):
        raise TypeError(
            f"tracer_provider must be an OpenTelemetry TracerProvider or None, got {type(tracer_provider).__name__}"
        )
    if meter_provider is not None and not callable(getattr(meter_provider, "get_meter", None)):
        raise TypeError(
            f"meter_provider must be an OpenTelemetry MeterProvider or None, got {type(meter_provider).__name__}"
        )


def check_module(module: Any, engine: str = "auto") -> None:
    """A torch `nn.Module` or a MindSpore `Cell`, matching an explicit engine."""
    if module is None:
        return
    if is_torch_module(module):
        if engine == "mindspore":
            raise TypeError("module must be a mindspore.nn.Cell for engine='mindspore', got a torch.nn.Module")
    elif is_mindspore_cell(module):
        if engine == "torch":
            raise TypeError("module must be a torch.nn.Module for engine='torch', got a mindspore.nn.Cell")
    else:
        raise TypeError(f"module must be a torch.nn.Module, a mindspore.nn.Cell or None, got {type(module).__name__}")


def _refuse_modules_of_other_threads(module: Any, others: list[tuple[Any, int]]) -> None:
    """Refuse a window on `module` if it, or one of its submodules, is in a tree that a window on
    another thread traces now (`others`: (root, thread ident)); module hooks belong to the module."""
    owners: dict[int, int] = {}
    for root, owner in others:
        for traced in _module_tree(root):
            owners.setdefault(id(traced), owner)
    for i, submodule in enumerate(_module_tree(module)):  # the module itself first, then its submodules
        owner = owners.get(id(submodule))
        if owner is None:
            continue
        name = type(module).__name__
        what = f"module {name} is" if i == 0 else f"module {name} has a submodule ({type(submodule).__name__}) that is"
        raise RuntimeError(
            f"CommDebugMode: {what} already traced by a window on another thread "
            f"({_thread_name(owner)}). Module hooks belong to the module, not the thread, so two "
            "threads tracing one model (or a model and one of its submodules) would mix their module "
            "spans: trace it on one thread at a time, or give each thread its own model "
            "(or module=None)"
        )


def _check_module_depth(value: object) -> int | None:
    """`module_depth=`: None or "full" -> None (every module), an int k >= 0 -> k; else a one-line error."""
    if value is None or (isinstance(value, str) and value == "full"):
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise ValueError(f"module_depth must be 'full' or an int >= 0 (module levels hooked, the root is 0), got {value!r}")


class CommDebugMode:
    """Trace the collectives, DTensor ops and modules of a block as OpenTelemetry spans.

    ```
    with CommDebugMode(module=model) as mode:
        model(x).sum().backward()
    mode.get_comm_counts()
    print(mode.generate_comm_debug_tracing_table(noise_level=2))
    ```

    Args:
        module: optional torch `nn.Module` or MindSpore `Cell` whose submodules are
            tracked (forward and backward).
        engine: which framework's hooks to install: "torch" (PyTorch DTensor),
            "hyper_parallel" (its OpDispatcher and platform collectives, torch or
            MindSpore), "mindspore" (Cell hooks and `mint.distributed` collectives), or
            "auto" (default): hyper_parallel if importable, else mindspore for a `Cell`
            or without torch, else torch.
        tracer_provider: spans also go to this provider's processors (e.g. OTLP); the
            table still renders from the mode's local store. Default: hp_otel's own SDK provider.
        meter_provider: where the collective counters go. Default: hp_otel's own SDK
            provider, read by an InMemoryMetricReader (`get_metric_reader()`).
        max_spans: spans kept in the local store; later ones are counted as dropped
            (`get_dropped_record_count()`) while the collective counts stay exact.
        live_spans: build each span as its work happens (it reaches your processors at
            once and is the current span meanwhile) instead of after the fact from
            timestamped events. Default: live when you pass a `tracer_provider`.
        record_spans: False counts collectives (counts, metrics) but builds no spans —
            what an unsampled step of the always-on instrumentor does. Such a window
            installs only what counting needs (the collective hook and module forward
            hooks), so it costs a fraction of a traced one.
        ops: False leaves out op spans (`linear`, `matmul`; noise level 1 of the table)
            and the function mode that sees them, for users who want collectives and
            modules only; it saves most of the per-op cost.
        extra_sources: your own sources (objects with `attach(observer)` and
            `detach()`, see `hp_otel.record.observer.Source`), attached after the engine's:
            the way to trace a framework hp_otel does not know. Sources written with the
            former names `install(observer)` / `uninstall()` still work (a
            DeprecationWarning once per class).
        watchdog: a `hp_otel.HangWatchdog`: while the window is open, a collective that does
            not complete within its timeout makes this rank write its spans so far (the
            in-flight collective included) for `hp-otel ranks`. Off by default.
        collective_hook, module_hook, op_hook: your `fn(span, info)`, called for each
            collective / module / op span before it ends and is exported — `span` is the SDK
            span, still writable (`span.set_attribute(...)`), `info` the `CollectiveInfo` /
            `ModuleInfo` / `OpInfo` the source reported (OTel contrib's `request_hook` idea).
            Deferred spans are built from the event log, so their hooks run then (window end,
            or when the spans are first read), not while the step runs. Not called for spans
            not recorded (`record_spans=False`, a sampler's drop) nor for the watchdog's
            in-flight spans. A hook that raises is counted in `get_callback_error_counts()`
            (`user_collective_hook`, ...), logged once, and the span is still exported.
        stack: record where each collective and redistribute was called: the user's frames,
            innermost first, as `"file:line:function"` in the span attribute `hp_otel.call.stack`
            (the innermost also as `code.file.path` / `code.line.number` / `code.function.name`),
            in the table at noise level 3 and in the JSON dump. Frames of hp_otel, torch,
            MindSpore, hyper-parallel, typing_extensions and the standard library are left out. True: the 8
            innermost frames; an int 1..64: that many; False or 0: off. None (default): the
            `HP_OTEL_STACK_DEPTH` setting, off when unset. Off, no frame is walked.
        metric_module_depth: how much of the module path the collective metrics carry
            (`hp_otel.module.fqn`, their cardinality): an int k keeps the first k dotted parts
            (`layers.3.attn` at 3 is `layers.*.attn`: a container index is `*`, so the series
            do not grow with the blocks), `"none"` (or 0) drops the attribute,
            `"full"` keeps it. Default: $HP_OTEL_METRIC_MODULE_DEPTH, else `"full"` (the
            instrumentor's default is 1). A counts-only window hooks modules only that deep
            (see `module_depth`); spans keep the whole fqn of the modules they hook.
        module_depth: how deep in `module`'s tree modules are hooked, so how deep the module
            spans and per-module counts go: an int k hooks the root (0) and the modules of
            up to k dotted parts (`layers.3` is 2; the children of a `ModuleList` at the
            depth too, since the list itself is never called), `"full"` every module. What
            runs in a deeper module, forward or backward, counts for its ancestor at the
            depth: 2 gives block-level spans on a 100-layer model for a fraction of the
            cost. Default: `"full"` in a traced window; in a counts-only one the metric
            depth (`metric_module_depth`), as deep as its labels go.
    """

    _warns_partial_view = True  # the torch drop-in reads its window inside it, as torch allows: False there

    def __init__(
        self,
        module: Any = None,
        *,
        engine: str = "auto",
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
        max_spans: int = DEFAULT_MAX_SPANS,
        live_spans: bool | None = None,
        record_spans: bool = True,
        ops: bool = True,
        extra_sources: Iterable[Source] = (),
        watchdog: HangWatchdog | None = None,
        collective_hook: CollectiveHook | None = None,
        module_hook: ModuleHook | None = None,
        op_hook: OpHook | None = None,
        stack: bool | int | None = None,
        metric_module_depth: int | str | None = None,
        module_depth: int | str | None = None,
    ) -> None:
        self.engine = check_engine(engine)
        check_module(module, self.engine)
        if isinstance(max_spans, bool) or not isinstance(max_spans, int) or max_spans < 0:
            raise ValueError(f"max_spans must be a non-negative int, got {max_spans!r}")
        check_providers(tracer_provider, meter_provider)
        if live_spans is not None and not isinstance(live_spans, bool):
            raise TypeError(f"live_spans must be True, False or None, got {live_spans!r}")
        live = live_spans if live_spans is not None else tracer_provider is not None
        self.module = module
        self._metric_reader: InMemoryMetricReader | None = None
        if tracer_provider is None:
            tracer_provider = default_tracer_provider()
        if meter_provider is None:
            meter_provider, self._metric_reader = default_meter_provider()
        if not isinstance(record_spans, bool):
            raise TypeError(f"record_spans must be True or False, got {record_spans!r}")
        if not isinstance(ops, bool):
            raise TypeError(f"ops must be True or False, got {ops!r}")
        extra = _check_sources(extra_sources)
        hooks = UserHooks.checked(collective_hook, module_hook, op_hook)
        if watchdog is not None and not isinstance(watchdog, HangWatchdog):
            raise TypeError(f"watchdog must be a hp_otel.HangWatchdog or None, got {type(watchdog).__name__}")
        self._watchdog = watchdog
        # Deferred spans meant for real processors (an exporter) are built when the window ends.
        self._build_on_exit = not live and not is_internal_tracer_provider(tracer_provider)
        depth = check_depth(stack) if stack is not None else depth_from_env()
        label = ModuleLabel(resolve_depth(metric_module_depth, default=None))
        hooked = _check_module_depth(module_depth)
        settings = RecorderSettings(
            live=live,
            max_spans=max_spans,
            spans_enabled=record_spans,
            ops_enabled=ops,
            hooks=hooks,
            store_only=is_internal_tracer_provider(tracer_provider),  # past max_spans: counted, not built
            call_stack=shared_call_stack(depth, STACK_SKIPPED_PACKAGES),
            module_label=label,
            # what module sources hook (None: every module): only as deep as the window labels, unless asked
            module_depth=hooked if module_depth is not None or record_spans else label.depth,
        )
        self._recorder = WindowRecorder(get_tracer(tracer_provider), get_instruments(meter_provider), settings)
        self._store = self._recorder.store
        self._sources: tuple[Source, ...] = (*default_sources(module, self.engine), *extra)
        # (the source's class name, what attach/detach is called on): the source itself, or its adapter
        self._attachable = tuple((type(source).__name__, _attachable(source)) for source in self._sources)
        self._attached: list[tuple[str, Source]] = []
        self._token: contextvars.Token[CommDebugMode | None] | None = None
        self._outer: CommDebugMode | None = None
        self._guarded = False  # this window holds the signal guard (entered on the main thread)
        self._claimed_ids: list[int] = []  # the ids of its module tree this window counts in _traced_modules
        self._window_stack: list[tuple[Any, Any]] = []  # the windows of the thread that entered it
        self._watchdog_started = False

    # --- context manager -------------------------------------------------------
    @signal_guard.protect
    def __enter__(self) -> CommDebugMode:
        GUARD.critical += 1  # first: a Ctrl-C from here on waits until the hooks are in (signal_guard)
        # All or nothing: a held signal is sent again by send_held(); a KeyboardInterrupt
        # from it (or anything else that interrupts) rolls back what was installed.
        entering = False
        try:
            try:
                if self._token is not None:
                    raise RuntimeError("this CommDebugMode is already active; create a new one to nest")
                entering = True
                self._guarded = signal_guard.acquire()
                self._activate()
            finally:
                GUARD.critical -= 1  # first in the block: nothing can interrupt before it
                signal_guard.send_held()
            return self
        except BaseException:
            if entering:
                GUARD.critical += 1
                try:
                    self._deactivate(None)
                finally:
                    GUARD.critical -= 1
                    signal_guard.send_held()
            raise

    @signal_guard.protect
    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        GUARD.critical += 1  # first: see __enter__
        later: list[CommDebugMode] = []
        try:
            later = self._close_later_windows()
            self._deactivate(exc)
        except BaseException:
            self._deactivate(exc)  # finish what the interruption left, then let it propagate
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

    def _close_later_windows(self) -> list[CommDebugMode]:
        """Close the windows entered after this one on its thread that are still open, innermost first."""
        with _install_lock:
            stack = self._window_stack
            mine = next((i for i, (mode, _task) in enumerate(stack) if mode is self), None)
            later = [] if mine is None else [mode for mode, _task in stack[mine + 1 :]]
        for mode in reversed(later):
            mode._deactivate(None)
        return later

    def _activate(self) -> None:
        self._claim_thread_and_module()
        self._recorder.reset()
        self._store.clear()
        stale = _current_mode.get()
        if stale is not None and not stale.active:  # closed on another thread, it stayed in this context
            _current_mode.set(None)
        self._token = _current_mode.set(self)
        outer = self._token.old_value if self._token.old_value is not contextvars.Token.MISSING else None
        if outer is not None:
            outer._recorder.suspended += 1
            self._outer = outer
        self._recorder.start()
        with _install_lock:
            for name, source in self._attachable:
                self._attached.append((name, source))  # listed first: a half-attached source is detached too
                try:
                    source.attach(self._recorder)
                except Exception as exc:  # a source that cannot attach must not stop training
                    self._recorder.on_fault(f"attach:{name}", exc)
                    self._attached.pop()
                    self._detach_one(name, source)
        if self._watchdog is not None:
            self._recorder.wants_completion = True  # sources attach a done-probe to returned collectives
            try:
                watchdog = self._watchdog
                if watchdog.evidence == "collectives":
                    writer: Callable[[str], None] = self.write_collectives
                else:
                    writer = lambda path: self.write_spans(path, pause=watchdog.pause)  # noqa: E731
                self._watchdog.start(self._recorder, writer)
                self._watchdog_started = True
            except Exception as exc:  # a watchdog that cannot start must not stop training
                self._recorder.wants_completion = False
                self._recorder.on_fault("watchdog_start", exc)

    def _claim_thread_and_module(self) -> None:
        """Refuse the two layouts hp_otel cannot record correctly, before anything is installed.

        torch's function and dispatch modes belong to a thread: windows of asyncio tasks
        interleaved on one thread would each record the other's collectives. Module hooks
        belong to the module: two threads tracing one model would mix their module spans.
        """
        task = _current_task()
        with _install_lock:
            stack = _windows_of_this_thread()
            if stack and stack[-1][1] is not task:
                raise RuntimeError(
                    f"CommDebugMode: another window is open on this thread in {_task_name(stack[-1][1])}, and this one "
                    f"would open in {_task_name(task)}. torch's modes belong to the thread, so windows of "
                    "interleaved asyncio tasks would record each other's collectives: open them one task at a "
                    "time (e.g. under an asyncio.Lock) or run each task's traced work in its own thread"
                )
            if self.module is not None:
                me = threading.get_ident()
                others = [(module, owner) for module, owner, _windows in _traced_modules.values() if owner != me]
                if others:  # only then are trees walked: a window per step on one thread walks none
                    _refuse_modules_of_other_threads(self.module, others)
                key = id(self.module)
                _module, _owner, windows = _traced_modules.get(key, (None, me, 0))
                _traced_modules[key] = (self.module, me, windows + 1)
                self._claimed_ids = [key]
            stack.append((self, task))
            self._window_stack = stack  # exiting on another thread still removes it from this one

    def _release_thread_and_module(self) -> None:
        with _install_lock:
            stack, self._window_stack = self._window_stack, []
            for i in range(len(stack) - 1, -1, -1):
                if stack[i][0] is self:
                    del stack[i]
                    break
            claimed, self._claimed_ids = self._claimed_ids, []
            for key in claimed:
                module, owner, windows = _traced_modules.get(key, (None, 0, 1))
                if windows <= 1:
                    _traced_modules.pop(key, None)
                else:
                    _traced_modules[key] = (module, owner, windows - 1)

    def _deactivate(self, exc: BaseException | None) -> None:
        """Undo `_activate` (or the part of it that ran); safe to call again."""
        interrupted: list[BaseException] = []
        if self._watchdog_started:
            self._watchdog_started = False
            try:
                self._watchdog.stop()  # type: ignore[union-attr]
            except Exception as error:
                self._recorder.on_fault("watchdog_stop", error)
            finally:
                self._recorder.wants_completion = False
        with _install_lock:
            while self._attached:
                name, source = self._attached.pop()
                try:
                    self._detach_one(name, source)
                except BaseException as error:  # not an Exception: finish the others, then raise it
                    interrupted.append(error)
        if self._recorder.active:
            self._recorder.stop(exc)
            if self._build_on_exit:
                self._recorder.materialise()
            if exc is None and not self._recorder.comm_counts and not said_once.already_said(__name__, "empty window"):
                self._say_why_empty()
        outer, self._outer = self._outer, None
        if outer is not None:
            outer._recorder.suspended -= 1
        token, self._token = self._token, None
        if token is not None:
            try:
                _current_mode.reset(token)
            except ValueError:  # exited in another context than entered: leave that context alone
                pass
        self._release_thread_and_module()
        guarded, self._guarded = self._guarded, False
        if guarded:
            signal_guard.release()
        if interrupted:
            raise interrupted[0]

    def _say_why_empty(self) -> None:
        """A window that counted nothing says why, once per process: empty counts alone do not tell
        "nothing to see" from "nothing was watched"."""
        try:
            hints = (getattr(src, "why_no_collectives", lambda: None)() for src in self._sources)
            reason = next(filter(None, hints), None)
            if reason is None:
                reason = self._why_empty_from_spans()
        except Exception as exc:  # a hint must never break the window's exit
            self._recorder.on_fault("why_empty", exc)
            return
        said_once.log_once(
            __name__,
            "empty window",
            "hp_otel: a CommDebugMode window saw no collective: %s (said once per process)",
            reason,
        )

    def _why_empty_from_spans(self) -> str:
        from hp_otel.spans import schema

        if not self._recorder.spans_enabled:
            return "nothing inside it issued a collective (counts-only window: no spans to say more)"
        kinds = {(span.attributes or {}).get(schema.CALL_KIND) for span in self.get_finished_spans()}
        if self.module is not None and schema.KIND_MODULE not in kinds:
            return f"the module= given ({type(self.module).__name__}) was not called inside the window"
        if schema.KIND_OP not in kinds:
            return "no DTensor op ran inside it (plain tensors need no collective)"
        return "its DTensor ops needed no collective (their inputs were already laid out as the ops need)"

    def _partial_view(self, what: str) -> None:
        """Read inside the open window: what is not finished yet is not in it (said once per process)."""
        if self.active and self._warns_partial_view:
            said_once.log_once(
                __name__,
                "partial view",
                "hp_otel: %s read inside an open CommDebugMode window is a partial view: calls still running and "
                "what comes later are not in it; read after the `with` block for the whole window (said once)",
                what,
            )

    def _detach_one(self, name: str, source: Source) -> None:
        try:
            source.detach()
        except Exception as exc:
            self._recorder.on_fault(f"detach:{name}", exc)

    @property
    def active(self) -> bool:
        """True between `__enter__` and `__exit__`."""
        return self._token is not None

    @property
    def sources(self) -> tuple[Source, ...]:
        """The sources this mode attaches while active: the engine's, module tracking, then `extra_sources`."""
        return self._sources

    @property
    def observer(self) -> Observer:
        """The observer interface that sources feed (also the way to drive the mode from tests or a new engine)."""
        return self._recorder

    # --- counts ------------------------------------------------------------------
    def get_comm_counts(self, normalized: bool = False) -> dict[str, int]:
        """Collective calls by the framework's own name (`_c10d_functional.all_reduce`).

        With `normalized=True`, by normalised op instead (`all_reduce`, `all_gather`, ...).
        """
        if not isinstance(normalized, bool):
            raise TypeError(f"normalized must be True or False, got {normalized!r}")
        self._partial_view("get_comm_counts()")
        counts = self._recorder.comm_counts
        if not normalized:
            return dict(counts)
        out: dict[str, int] = {}
        for name, n in counts.items():
            op = self._recorder.comm_ops.get(name, name)
            out[op] = out.get(op, 0) + n
        return out

    def get_total_counts(self) -> int:
        return sum(self._recorder.comm_counts.values())

    def get_comm_module_counts(self, normalized: bool = False) -> dict[str, dict[str, dict[str, int]]]:
        """`{fqn: {"forward": {name: n}, "backward": {name: n}}}`; a collective counts for every enclosing module.

        With `normalized=True`, by normalised op (`all_reduce`), as `get_comm_counts(normalized=True)`.
        """
        if not isinstance(normalized, bool):
            raise TypeError(f"normalized must be True or False, got {normalized!r}")
        self._partial_view("get_comm_module_counts()")
        ops = self._recorder.comm_ops if normalized else {}
        out: dict[str, dict[str, dict[str, int]]] = {}
        for fqn, phases in self._recorder.module_counts.items():
            shown = out[fqn] = {}
            for phase, counts in phases.items():
                by = shown[phase] = {}
                for name, n in counts.items():
                    op = ops.get(name, name)
                    by[op] = by.get(op, 0) + n
        return out

    @property
    def comm_module_counts(self) -> dict[str, dict[str, dict[str, int]]]:
        """torch's CommDebugMode attribute name for `get_comm_module_counts()`."""
        return self.get_comm_module_counts()

    def get_parameter_info(self) -> dict[str, dict[str, dict[str, Any]]]:
        """`{module fqn: {param: {shape, dtype, placements}}}` of the modules that ran (needs `module=`)."""
        return module_info.parameter_info(self._tree())

    def get_sharding_info(self) -> dict[str, str]:
        """`{"fc2.weight": "Shard(dim=1)"}` for DTensor parameters of the modules that ran (needs `module=`)."""
        return module_info.sharding_info(module_info.parameter_info(self._tree()))

    def get_callback_error_counts(self) -> dict[str, int]:
        """Faults inside hp_otel's own callbacks, by where they happened; the traced code never saw them."""
        self._recorder.materialise()  # deferred spans are built now: faults building them count too
        return dict(self._recorder.fault_counts)

    def get_comm_exposure(self) -> ExposureReport:
        """The last closed window's exposed communication: collective time in flight, the part this
        thread waited for, the overlap fraction; in total, per phase, per (phase, module) (docs/overlap.md)."""
        return self._recorder.exposure

    def get_dropped_record_count(self) -> int:
        """Spans turned away by the `max_spans` cap (the collective counts still include them)."""
        self._recorder.materialise()
        return self._store.dropped_spans

    def get_finished_spans(self) -> tuple[ReadableSpan, ...]:
        """Every finished span the local store kept, in the order they ended."""
        self._recorder.materialise()
        return self._store.get_finished_spans()

    def _span_count(self) -> int:
        self._recorder.materialise()
        return len(self._store)  # no span rebuilt to count them

    def get_metric_reader(self) -> InMemoryMetricReader | None:
        """The in-memory reader of hp_otel's default meter provider (None with your own provider)."""
        return self._metric_reader

    def _tree(self) -> list[CallRecord]:
        return build_call_tree(self.get_finished_spans())

    # --- output ------------------------------------------------------------------
    def generate_comm_debug_tracing_table(self, noise_level: int | None = None) -> str:
        """The call tree as text: 0 collectives, 1 (default) + ops, 2 + modules (every phase), 3 + detail."""
        level = parse_noise_level(noise_level)
        self._partial_view("the tracing table")
        if level.modules and self.module is None:
            warnings.warn(
                f"noise_level={level.level} shows module boundaries, which needs CommDebugMode(module=...); "
                "showing module-less output",
                UserWarning,
                stacklevel=2,
            )
        return table.render_table(self.get_finished_spans(), level, dropped=self.get_dropped_record_count())

    generate_tracing_table = generate_comm_debug_tracing_table

    def log_comm_debug_tracing_table_to_file(
        self, file_name: str | os.PathLike[str] = "comm_mode_log.txt", noise_level: int | None = None
    ) -> None:
        """Write the table to a file, atomically."""
        check_path(file_name, "file_name")
        text = self.generate_comm_debug_tracing_table(noise_level)
        write_text_atomically(file_name, lambda handle: handle.write(text + "\n"), argument="file_name")

    def generate_json_dump(
        self, file_name: str | os.PathLike[str] = "comm_mode_log.json", noise_level: int | None = None
    ) -> None:
        """Write the design's JSON structure (counts, sharding info, nested records) to a file, atomically."""
        check_path(file_name, "file_name")
        level = parse_noise_level(noise_level)
        self._partial_view("the JSON dump")
        json_dump.write_json_dump(
            file_name,
            argument="file_name",
            spans=self.get_finished_spans(),
            level=level,
            comm_counts=self.get_comm_counts(),
            comm_module_counts=self.get_comm_module_counts(),
            dropped_records=self.get_dropped_record_count(),
        )

    def write_spans(
        self, path: str | os.PathLike[str], *, in_flight: bool = True, pause: Callable[[], None] | None = None
    ) -> None:
        """Write the window's spans as OTLP/JSON (what `hp-otel render` and `hp-otel ranks` read), atomically.

        Safe from another thread while the window records (the hang watchdog writes from
        its own). `in_flight`: also the collectives issued and not completed yet, as
        spans marked `hp_otel.collective.in_flight` (start = issue time, end = now). The
        file's resource names this rank (`hp_otel.rank`) even when no launcher variable does.
        `pause`: called between pieces of the encoding (the watchdog's thread yields there).
        """
        from hp_otel.common.launcher_env import current_rank
        from hp_otel.spans import schema
        from hp_otel.spans.otlp_json import write_spans

        check_path(path, "path")
        spans = self._spans_to_write(in_flight)
        write_spans(path, spans, argument="path", resource_defaults={schema.RESOURCE_RANK: current_rank()}, pause=pause)

    def write_collectives(self, path: str | os.PathLike[str], *, in_flight: bool = True) -> None:
        """Write the window's collectives file (what `hp-otel ranks` compares, a few percent of the spans file).

        The collectives as `write_spans` writes them (`in_flight` the same), without the module
        and op spans: group, seq, op, shapes, dtype, bytes, times, module, phase, waits,
        bandwidths, call site (with `stack=`). Safe from another thread, atomic.
        """
        from hp_otel.common.launcher_env import current_rank
        from hp_otel.spans import schema
        from hp_otel.spans.collectives_file import write_collectives

        check_path(path, "path")
        spans = self._spans_to_write(in_flight)
        resource = dict(spans[0].resource.attributes) if spans and spans[0].resource is not None else {}
        resource.setdefault(schema.RESOURCE_RANK, current_rank())
        write_collectives(path, spans, resource)

    def _spans_to_write(self, in_flight: bool) -> list[ReadableSpan]:
        from hp_otel.spans import schema

        spans = list(self.get_finished_spans())
        if in_flight:
            pending = self._recorder.in_flight_spans(time.time_ns())
            if pending:  # an op that returned while its work is not done: written once, as in flight
                match = schema.COLLECTIVE_MATCH_ID
                waiting = {span.attributes.get(match) for span in pending}
                spans = [span for span in spans if (span.attributes or {}).get(match) not in waiting]
                spans.extend(pending)
        return spans

    def clear(self) -> None:
        """Forget every record and count (the OTel counters, being cumulative, keep theirs).

        After a large window the memory they held goes back to the system where it can
        (`hp_otel.record.memory`; a small one is not worth a garbage collection)."""
        large = len(self._store) + self._recorder.unbuilt_events() >= _LARGE_WINDOW_SPANS
        self._recorder.reset()
        self._store.clear()
        if large:
            return_freed_memory()

    def __repr__(self) -> str:
        state = "active" if self._token is not None else "inactive"
        return (
            f"CommDebugMode({state}, module={type(self.module).__name__ if self.module is not None else None}, "
            f"collectives={self.get_total_counts()}, spans={self._span_count()}, "
            f"dropped={self.get_dropped_record_count()})"
        )


def _check_sources(sources: Any) -> tuple[Source, ...]:
    if isinstance(sources, (str, bytes)) or not isinstance(sources, Iterable):
        raise TypeError(f"extra_sources must be a sequence of sources, got {type(sources).__name__}")
    out = tuple(sources)
    for source in out:
        if not (_has_methods(source, "attach", "detach") or _has_methods(source, "install", "uninstall")):
            raise TypeError(
                f"extra_sources: {type(source).__name__} is not a source (needs attach(observer) and detach())"
            )
    return out


def _has_methods(source: Any, *names: str) -> bool:
    return all(callable(getattr(source, name, None)) for name in names)


class _InstallUninstall:
    """Adapts a source written with the former names, `install(observer)` / `uninstall()`."""

    __slots__ = ("source",)

    def __init__(self, source: Any) -> None:
        self.source = source

    def attach(self, observer: Observer) -> None:
        self.source.install(observer)

    def detach(self) -> None:
        self.source.uninstall()


def _attachable(source: Any) -> Source:
    """The source, or for one with only the former method names its adapter (warned once per class)."""
    if callable(getattr(source, "attach", None)) and callable(getattr(source, "detach", None)):
        return source  # every window asks, for every source: no generator here
    cls = type(source)
    if said_once.first_time(__name__, ("former source names", cls.__module__, cls.__qualname__)):
        warnings.warn(
            f"{cls.__qualname__}: a source's install(observer) / uninstall() are now attach(observer) / detach(); "
            "rename them (the former names still work for now)",
            DeprecationWarning,
            stacklevel=4,  # warn -> _attachable -> CommDebugMode.__init__'s generator -> __init__ -> the caller
        )
    return _InstallUninstall(source)
