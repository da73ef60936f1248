"""One trace per training step across all ranks, without the ranks talking to each other.

Every rank derives the same ids from the run id and the step (a SHA-256 hash):
the trace id, and the span id of one root span `step N`. Rank 0 emits that root span
(its SDK tracer is given exactly those ids); every rank, rank 0 included, emits a
`rank R` span whose parent is the root — on rank 0 the real span, elsewhere a
remote parent with the derived ids — and everything hp_otel records in the step nests
under its rank's `rank R`. Jaeger, Tempo and MLflow then show all ranks of step N in one
trace, listed as `step N`: `step N` → one `rank R` per rank → modules, ops, collectives.

The sampling decision is the configured sampler's on the derived trace id, taken the
same way on every rank, so ranks agree (ratio samplers decide from the trace id).
If rank 0 does not export (crashed, or its provider is not the SDK's), the other
ranks' spans still share the trace and show a missing parent.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import logging
import os
import uuid
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
from opentelemetry.trace import NonRecordingSpan, Span, SpanContext, SpanKind, TraceFlags, TracerProvider

from hp_otel.always_on import trace_list
from hp_otel.common import launcher_env, said_once
from hp_otel.common.env_read import getenv, sdk_disabled
from hp_otel.common.int_range import check_attribute_count
from hp_otel.record import matching
from hp_otel.record.span_builder import mark_error
from hp_otel.spans import schema
from hp_otel.version import __version__

logger = logging.getLogger("hp_otel")

_SCOPE = "hp_otel.always_on.steps"


def step_ids(run_id: str, step: int | str) -> tuple[int, int]:
    """(trace id, root span id) of a step: the same on every rank of the run, never zero."""
    digest = hashlib.sha256(f"hp_otel/{run_id}/{step}".encode()).digest()
    trace_id = int.from_bytes(digest[:16], "big") or 1
    span_id = int.from_bytes(digest[16:24], "big") or 1
    return trace_id, span_id


class _RootIds(IdGenerator):
    """Hands out the derived ids for the step root span, random ids otherwise."""

    def __init__(self) -> None:
        self.forced: contextvars.ContextVar[tuple[int, int] | None] = contextvars.ContextVar(
            "hp_otel_step_root_ids", default=None
        )
        self._random = RandomIdGenerator()

    def generate_trace_id(self) -> int:
        forced = self.forced.get()
        return forced[0] if forced else self._random.generate_trace_id()

    def generate_span_id(self) -> int:
        forced = self.forced.get()
        return forced[1] if forced else self._random.generate_span_id()


_ROOT_IDS = _RootIds()
_root_tracers: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def _tracers(provider: TracerProvider) -> tuple[Any, Any]:
    """(tracer for rank spans, tracer for root spans whose ids we choose); the second is None without the SDK."""
    cached = _root_tracers.get(provider)
    if cached is None:
        tracer = provider.get_tracer(_SCOPE, __version__, schema.SCHEMA_URL)
        # A scope of its own (the SDK caches one tracer per scope), so this tracer object is
        # ours alone: giving it our id generator leaves the provider and its other tracers untouched.
        root = provider.get_tracer(
            _SCOPE, __version__, schema.SCHEMA_URL, {schema.STEP_ROOT_SCOPE_ATTRIBUTE: "derived"}
        )
        if hasattr(root, "id_generator") and root is not tracer:
            root.id_generator = _ROOT_IDS
        else:
            root = None
        cached = _root_tracers[provider] = (tracer, root)
    return cached


def _sampled(tracer: Any, trace_id: int, attributes: dict[str, Any]) -> bool:
    """The configured sampler's decision for a root span of this trace (SDK tracers; others: sampled)."""
    sampler = getattr(tracer, "sampler", None)
    if sampler is None:
        return True
    name = schema.step_span_name(attributes[schema.STEP])
    result = sampler.should_sample(None, trace_id, name, SpanKind.INTERNAL, attributes)
    return bool(result.decision.is_sampled())


_process_run_id: str | None = None


def resolve_run_id(run_id: str | None = None) -> str:
    """The run id steps derive their trace ids from (see `hp_otel.common.launcher_env.run_id`)."""
    global _process_run_id
    if run_id:
        return run_id
    from hp_otel.export.telemetry import configured

    telemetry = configured()
    if telemetry is not None and telemetry.config.run_id:
        return telemetry.config.run_id
    found = launcher_env.run_id()
    if found:
        return found
    if _process_run_id is None:
        _process_run_id = f"process-{uuid.uuid4().hex}"
        said_once.log_once(
            __name__,
            "run_id",
            "hp_otel: no run id (HP_OTEL_RUN_ID, TORCHELASTIC_RUN_ID, MASTER_ADDR/MASTER_PORT); "
            "using %s — ranks of other processes will not share step traces",
            _process_run_id,
        )
    return _process_run_id


@dataclass
class StepSpans:
    """The spans of one step on this rank; `begin()` then `end()`."""

    step: int | str
    run_id: str
    rank: int
    tracer_provider: TracerProvider
    trace_id: int = 0
    root_span_id: int = 0
    sampled: bool = True
    root: Span | None = None
    rank_span: Span | None = None
    context: Any = None  # the OTel context with `rank_step` as current span
    _token: Any = field(default=None, repr=False)

    def begin(self) -> None:
        self.trace_id, self.root_span_id = step_ids(self.run_id, self.step)
        matching.register_step(self.trace_id, self.step)  # windows inside count their collectives per step
        tracer, root_tracer = _tracers(self.tracer_provider)
        attributes: dict[str, Any] = {schema.STEP: self.step, schema.RESOURCE_RUN_ID: self.run_id}
        world_size = launcher_env.world_size()
        if world_size is not None:
            attributes[schema.RESOURCE_WORLD_SIZE] = world_size
        self.sampled = _sampled(root_tracer or tracer, self.trace_id, attributes)
        if self.rank == 0 and root_tracer is not None:
            if trace_list.exporting_to_mlflow():  # its trace list shows no span name: the step in its own keys
                attributes.update(trace_list.mlflow_root_attributes(self.step, self.run_id, world_size))
            token = _ROOT_IDS.forced.set((self.trace_id, self.root_span_id))
            try:
                self.root = root_tracer.start_span(
                    schema.step_span_name(self.step), context=otel_context.Context(), attributes=attributes
                )
            finally:
                _ROOT_IDS.forced.reset(token)
            parent = trace.set_span_in_context(self.root, otel_context.Context())
        else:
            if self.rank == 0 and not sdk_disabled():  # disabled, the SDK's providers hand out no-ops
                said_once.log_once(
                    __name__,
                    "root",
                    "hp_otel: the tracer provider is not the OTel SDK's; step root spans are not emitted",
                )
            flags = TraceFlags(TraceFlags.SAMPLED if self.sampled else TraceFlags.DEFAULT)
            remote = SpanContext(self.trace_id, self.root_span_id, is_remote=True, trace_flags=flags)
            parent = trace.set_span_in_context(NonRecordingSpan(remote), otel_context.Context())
        self.rank_span = tracer.start_span(
            schema.rank_step_span_name(self.rank),
            context=parent,
            attributes={schema.STEP: self.step, schema.RESOURCE_RANK: self.rank},
        )
        self.context = trace.set_span_in_context(self.rank_span, parent)

    def end(self, error: BaseException | None = None) -> None:
        for span in (self.rank_span, self.root):
            if span is not None:
                if error is not None:
                    mark_error(span, error)
                span.end()
        self.rank_span = self.root = None


def check_step_arguments(step: Any, rank: Any) -> None:
    """`step` and `rank` become the `hp_otel.step` / `hp_otel.rank` attributes: refused here, named, when
    an exporter could not encode them (OTLP ints are int64)."""
    if isinstance(step, bool) or not isinstance(step, (int, str)) or (isinstance(step, str) and not step):
        raise TypeError(f"step must be an int or a non-empty str, got {step!r}")
    if isinstance(step, int):
        check_attribute_count(step, "step", " or a non-empty str")
    if rank is not None:
        check_attribute_count(rank, "rank", " or None")


def begin_step(
    step: int | str,
    *,
    run_id: str | None = None,
    rank: int | None = None,
    tracer_provider: TracerProvider | None = None,
) -> StepSpans:
    """Start the spans of a step (see `step()`); the caller ends them with `.end()`."""
    check_step_arguments(step, rank)
    if tracer_provider is None:
        from hp_otel.export.providers import default_tracer_provider

        tracer_provider = default_tracer_provider()
    spans = StepSpans(
        step, resolve_run_id(run_id), launcher_env.current_rank() if rank is None else rank, tracer_provider
    )
    spans.begin()
    return spans


class StepHandler(Protocol):
    """Takes over `step()` while registered: the always-on instrumentor records every step."""

    def explicit_step(
        self, step: int | str, *, run_id: str | None, rank: int | None, module: Any
    ) -> contextlib.AbstractContextManager[StepSpans]: ...


_step_handler: StepHandler | None = None


def set_step_handler(handler: StepHandler | None) -> None:
    """Route `step()` through `handler` (None: back to plain step spans)."""
    global _step_handler
    _step_handler = handler


@contextlib.contextmanager
def step(
    step: int | str,
    *,
    run_id: str | None = None,
    rank: int | None = None,
    tracer_provider: TracerProvider | None = None,
    module: Any = None,
) -> Iterator[StepSpans]:
    """Mark a training step (or a debug window): every rank's spans of it share one trace.

    ```
    for n, batch in enumerate(loader):
        with hp_otel.step(n):
            with CommDebugMode(module=model):   # or let the instrumentor record it
                train_step(model, batch)
    ```

    Inside, `rank_step` is the current span, so CommDebugMode windows (and your own
    spans) nest under it. With `HpOtelInstrumentor` active, the step is also recorded
    (counts always; spans when the step is sampled) — `module=` then adds module
    boundaries. Default provider: the one `hp_otel.configure()` installed, else
    hp_otel's in-memory one.
    """
    check_step_arguments(step, rank)
    handler = _step_handler
    if handler is not None:
        with handler.explicit_step(step, run_id=run_id, rank=rank, module=module) as spans:
            yield spans
        return
    with running(begin_step(step, run_id=run_id, rank=rank, tracer_provider=tracer_provider)) as spans:
        yield spans


@contextlib.contextmanager
def running(spans: StepSpans, before_end: Callable[[BaseException | None], None] | None = None) -> Iterator[StepSpans]:
    """Make the step's `rank_step` span current for the block, then end the step with the block's error.

    `before_end` runs first (with that error), e.g. to close a recording window inside the step.
    """
    token = otel_context.attach(spans.context)
    error: BaseException | None = None
    try:
        yield spans
    except BaseException as exc:
        error = exc
        raise
    finally:
        otel_context.detach(token)
        if before_end is not None:
            before_end(error)
        spans.end(error)


COLLECTIVES_DIR_VARIABLE = "HP_OTEL_COLLECTIVES_DIR"
COLLECTIVES_STEPS_VARIABLE = "HP_OTEL_COLLECTIVES_STEPS"


class StepCollectives:
    """Each sampled step's collectives into this rank's collectives file in `folder`, which keeps the
    last `keep` steps (`hp_otel.spans.collectives_file.CollectivesRing`): the evidence `hp-otel ranks`
    compares, left by a step loop at every moment, bounded however long the run.

    An unsampled step builds no spans, so it leaves nothing here (its counts still go to the
    metrics); sampling keeps the same steps on every rank, so the ranks' files hold the same steps.
    A write that fails never stops training: it is counted in `faults` and logged once."""

    def __init__(self, folder: str, keep: int) -> None:
        self.folder = folder
        self.keep = keep
        self.faults = 0
        self.written = 0  # steps written
        self._rings: dict[int, Any] = {}  # rank -> its ring (one, unless a test plays several ranks)

    def step_ended(self, spans: StepSpans, mode: Any) -> None:
        """After the step's window closed: add its collectives to the rank's file (sampled steps)."""
        if not spans.sampled:
            return
        try:
            from hp_otel.spans.collectives_file import CollectivesRing

            ring = self._rings.get(spans.rank)
            if ring is None:
                ring = self._rings[spans.rank] = CollectivesRing(self.folder, self.keep, spans.rank)
            finished = mode.get_finished_spans()
            resource = dict(finished[0].resource.attributes) if finished and finished[0].resource is not None else {}
            resource.setdefault(schema.RESOURCE_RANK, spans.rank)
            ring.add(finished, resource)
            self.written += 1
        except Exception as exc:  # never break training
            self.faults += 1
            if self.faults == 1:
                logger.warning("hp_otel: writing the step's collectives file in %s failed", self.folder, exc_info=exc)

    @property
    def paths(self) -> list[str]:
        return [ring.path for ring in self._rings.values()]


def _keep_steps(value: Any, where: str) -> int:
    if isinstance(value, str):
        value = value.strip()
        value = int(value) if value.isdigit() else value
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1_000:
        raise ValueError(f"{where} must be a number of steps 1..1000, got {value!r}")
    return value


def _folder(value: Any, where: str) -> str:
    if not isinstance(value, (str, os.PathLike)) or not os.fspath(value):
        raise TypeError(f"{where} must be a folder path (str or os.PathLike), got {value!r}")
    folder = os.fspath(value)
    os.makedirs(folder, exist_ok=True)  # FileExistsError / PermissionError name the path
    return str(folder)


def step_collectives(folder: Any = None, keep: Any = None) -> StepCollectives | None:
    """The step loop's collectives files: `folder` / `keep` as given (a bad one raises), else
    `HP_OTEL_COLLECTIVES_DIR` / `HP_OTEL_COLLECTIVES_STEPS` (a bad one is logged: no file). None: off."""
    from hp_otel.spans.collectives_file import DEFAULT_KEEP

    if folder is not None:
        steps = DEFAULT_KEEP if keep is None else _keep_steps(keep, "collectives_steps")
        return StepCollectives(_folder(folder, "collectives_dir"), steps)
    raw = getenv(COLLECTIVES_DIR_VARIABLE)
    if not raw:
        if keep is not None:
            _keep_steps(keep, "collectives_steps")
        return None
    try:
        if keep is not None:
            steps = _keep_steps(keep, "collectives_steps")
        else:
            raw_steps = getenv(COLLECTIVES_STEPS_VARIABLE)
            steps = _keep_steps(raw_steps, COLLECTIVES_STEPS_VARIABLE) if raw_steps else DEFAULT_KEEP
        return StepCollectives(_folder(raw, COLLECTIVES_DIR_VARIABLE), steps)
    except (OSError, TypeError, ValueError) as exc:  # zero-code runs: a typo in a setting must not stop training
        logger.warning("hp_otel: %s; writing no collectives files", exc)
        return None
