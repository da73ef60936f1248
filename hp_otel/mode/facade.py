"""CommDebugMode: the user-facing context manager.

It wires sources (framework hooks) to a WindowRecorder for the duration of a `with`
block, then answers queries — counts from exact in-process counters, everything else
rendered from the finished spans in its local store. Its pieces: `options` (the window's
options, parsed once), `registry` (which windows are open on which thread and model),
`window` (opening and closing), `files` (what it writes), `former_sources` (an adapter).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

from opentelemetry.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import TracerProvider

from hp_otel.mode import files, window
from hp_otel.mode.former_sources import attachable
from hp_otel.mode.options import DEFAULT_MAX_SPANS, WindowOptions
from hp_otel.record.memory import return_freed_memory
from hp_otel.record.observer import Observer, Source
from hp_otel.record.user_hooks import CollectiveHook, ModuleHook, OpHook
from hp_otel.record.watchdog import HangWatchdog
from hp_otel.render import module_info
from hp_otel.sources import default_sources
from hp_otel.spans.call_tree import build_call_tree
from hp_otel.spans.exposure import ExposureReport

_LARGE_WINDOW_SPANS = 10_000  # clear() of a window this large hands the freed memory back to the system
STACK_SKIPPED_PACKAGES = window.STACK_SKIPPED_PACKAGES  # frames a call stack leaves out (`stack=`)


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
            or without torch, else torch; with none of them importable, no hooks.
        tracer_provider: spans also go to this provider's processors (e.g. OTLP); the
            table still renders from the mode's local store. Default: hp_otel's own SDK provider.
        meter_provider: where the collective counters go. Default: hp_otel's own SDK
            provider, read by an InMemoryMetricReader (`get_metric_reader()`).
        max_spans: spans kept in the local store; later ones are counted as dropped
            (`get_dropped_record_count()`) while the collective counts stay exact.
        live_spans: True builds each span through your tracer as its work happens (current
            meanwhile, `on_start` called, your sampler asked per span). Default: deferred —
            finished `ReadableSpan`s made from the event log and handed to your processors'
            `on_end` at window end; no `on_start`, the sampler asked once per window
            (docs/guide/providers.md).
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
            collective / module / op span before it ends and is exported — `span` is the span,
            still writable (`span.set_attribute(...)`), `info` the `CollectiveInfo` /
            `ModuleInfo` / `OpInfo` the source reported (OTel contrib's `request_hook` idea).
            Deferred spans' hooks run when they are built (window end, or first read). Not
            called for spans not recorded (`record_spans=False`, a sampler's drop, the
            watchdog's in-flight spans). A hook that raises is counted in `get_callback_error_counts()`
            (`user_collective_hook`, ...), logged once, and the span is still exported.
        stack: record where each collective and redistribute was called: the user's frames,
            innermost first, as `"file:line:function"` in the span attribute `hp_otel.call.stack`
            (the innermost also as `code.file.path` / `code.line.number` / `code.function.name`),
            in the table at noise level 3 and in the JSON dump. Frames of hp_otel, torch,
            MindSpore, hyper-parallel, typing_extensions and the standard library are left out.
            True: the 8 innermost frames; an int 1..64: that many; False or 0: off (no frame
            walked). None (default): `HP_OTEL_STACK_DEPTH`, off when unset.
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
            runs deeper, forward or backward, counts for its ancestor at the depth (2:
            block-level spans on a 100-layer model, at a fraction of the cost). Default:
            `"full"` traced; counts-only: `metric_module_depth`, as deep as its labels go.
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
        self._setup(WindowOptions.parse(**{k: v for k, v in locals().items() if k != "self"}))

    @classmethod
    def from_options(cls, options: WindowOptions) -> CommDebugMode:
        """A window made from options already parsed (`WindowOptions.parse`): the instrumentor's way."""
        mode = cls.__new__(cls)
        mode._setup(options)
        return mode

    def _setup(self, options: WindowOptions) -> None:
        self.options, self.engine, self.module = options, options.engine, options.module
        self._recorder, self._metric_reader, self._build_on_exit = window.build_recorder(options)
        self._store = self._recorder.store
        self._sources: tuple[Source, ...] = (*default_sources(self.module, self.engine), *options.extra_sources)
        self._attachable = tuple((type(src).__name__, attachable(src)) for src in self._sources)  # src or adapter
        self._open = window.OpenState()  # the open window's state (hp_otel.mode.window)

    __enter__ = window.enter  # signal-guarded from their first instruction: see hp_otel.mode.window
    __exit__ = window.exit

    @property
    def active(self) -> bool:
        """True between `__enter__` and `__exit__`."""
        return self._open.token is not None

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
        window.partial_view(self, "get_comm_counts()")
        return _by_op(self._recorder.comm_counts, self._ops(normalized))

    def get_total_counts(self) -> int:
        return sum(self._recorder.comm_counts.values())

    def get_comm_module_counts(self, normalized: bool = False) -> dict[str, dict[str, dict[str, int]]]:
        """`{fqn: {"forward": {name: n}, "backward": {name: n}}}`; a collective counts for every enclosing module.

        With `normalized=True`, by normalised op (`all_reduce`), as `get_comm_counts(normalized=True)`.
        """
        window.partial_view(self, "get_comm_module_counts()")
        ops = self._ops(normalized)
        return {
            fqn: {phase: _by_op(counts, ops) for phase, counts in phases.items()}
            for fqn, phases in self._recorder.module_counts.items()
        }

    def _ops(self, normalized: bool) -> dict[str, str]:
        if not isinstance(normalized, bool):
            raise TypeError(f"normalized must be True or False, got {normalized!r}")
        return self._recorder.comm_ops if normalized else {}

    @property
    def comm_module_counts(self) -> dict[str, dict[str, dict[str, int]]]:
        """torch's CommDebugMode attribute name for `get_comm_module_counts()`."""
        return self.get_comm_module_counts()

    def get_parameter_info(self) -> dict[str, dict[str, dict[str, Any]]]:
        """`{module fqn: {param: {shape, dtype, placements}}}` of the modules that ran (needs `module=`)."""
        return module_info.parameter_info(build_call_tree(self.get_finished_spans()))

    def get_sharding_info(self) -> dict[str, str]:
        """`{"fc2.weight": "Shard(dim=1)"}` for DTensor parameters of the modules that ran (needs `module=`)."""
        return module_info.sharding_info(module_info.parameter_info(build_call_tree(self.get_finished_spans())))

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

    def get_metric_reader(self) -> InMemoryMetricReader | None:
        """The in-memory reader of hp_otel's default meter provider (None with your own provider)."""
        return self._metric_reader

    # --- output ------------------------------------------------------------------
    def generate_comm_debug_tracing_table(self, noise_level: int | None = None) -> str:
        """The call tree as text: 0 collectives, 1 (default) + ops, 2 + modules (every phase), 3 + detail."""
        return files.table_text(self, noise_level)

    generate_tracing_table = generate_comm_debug_tracing_table

    def log_comm_debug_tracing_table_to_file(
        self, file_name: str | os.PathLike[str] = "comm_mode_log.txt", noise_level: int | None = None
    ) -> None:
        """Write the table to a file, atomically."""
        files.write_table(self, file_name, noise_level)

    def generate_json_dump(
        self, file_name: str | os.PathLike[str] = "comm_mode_log.json", noise_level: int | None = None
    ) -> None:
        """Write the design's JSON structure (counts, sharding info, nested records) to a file, atomically."""
        files.write_json_dump(self, file_name, noise_level)

    def write_spans(
        self, path: str | os.PathLike[str], *, in_flight: bool = True, pause: Callable[[], None] | None = None
    ) -> None:
        """Write the window's spans as OTLP/JSON (what `hp-otel render` and `hp-otel ranks` read), atomically;
        safe from another thread while the window records (see `hp_otel.mode.files.write_spans`)."""
        files.write_spans(self, path, in_flight, pause)

    def write_collectives(self, path: str | os.PathLike[str], *, in_flight: bool = True) -> None:
        """Write the window's collectives file (what `hp-otel ranks` compares, a few percent of the spans file),
        atomically; safe from another thread (see `hp_otel.mode.files.write_collectives`)."""
        files.write_collectives(self, path, in_flight)

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
        """What is there now: no deferred span is built (that would run the user's span hooks)."""
        state = "active" if self._open.token is not None else "inactive"
        module = type(self.module).__name__ if self.module is not None else None
        unbuilt = self._recorder.unbuilt_events()
        return (
            f"CommDebugMode({state}, module={module}, collectives={self.get_total_counts()}, "
            f"spans={len(self._store)}, dropped={self._store.dropped_spans}"
            + (f", unbuilt_events={unbuilt})" if unbuilt else ")")
        )


def _by_op(counts: dict[str, int], ops: dict[str, str]) -> dict[str, int]:
    """`counts` keyed by op (`ops`: name -> normalised op; a name not in it stays itself)."""
    out: dict[str, int] = {}
    for name, n in counts.items():
        op = ops.get(name, name)
        out[op] = out.get(op, 0) + n
    return out
