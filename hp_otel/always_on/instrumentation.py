"""Always-on instrumentation: `opentelemetry-instrument python train.py` records every step.

`HpOtelInstrumentor` follows opentelemetry-python-contrib's conventions: a
`BaseInstrumentor` subclass, found through the `opentelemetry_instrumentor` entry
point, honouring `instrument(tracer_provider=..., meter_provider=...)` (default: the
global providers, or — when nobody configured them — `hp_otel.configure()` from the
OTEL_* environment, unlike contrib's instrumentors, which leave export to the distro: a
visible choice, logged once, turned off by `configure_export=False` or
`HP_OTEL_CONFIGURE_EXPORT=0`) and suppression (`suppress_instrumentation()`: a step that starts
suppressed is not recorded).

Each step is one CommDebugMode window inside the step's spans (`hp_otel.always_on.steps`):
collective counts and metrics always (they are cheap), spans only when the configured
sampler samples the step. Steps are what you mark with `hp_otel.step(n)`; if you mark
none, each `torch.optim` `optimizer.step()` ends one step and starts the next (the
window before the first `optimizer.step()` is not recorded: no mode is active while
the program starts).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import wrapt
from opentelemetry import context as otel_context
from opentelemetry import metrics, trace
from opentelemetry.instrumentation.utils import is_instrumentation_enabled

from hp_otel.always_on.model_tracker import ModelTracker
from hp_otel.always_on.steps import StepCollectives, StepSpans, begin_step, running, set_step_handler, step_collectives
from hp_otel.common import launcher_env
from hp_otel.common.env_read import getenv
from hp_otel.record import installation, metric_labels
from hp_otel.spans import schema

if TYPE_CHECKING:
    from hp_otel.mode.options import WindowOptions

logger = logging.getLogger("hp_otel")

_session: StepSession | None = None
_HOLDER = "HpOtelInstrumentor"  # keeps hooks installed between its windows


def active_session() -> StepSession | None:
    """The always-on session while the instrumentor is active, else None."""
    return _session


def _is_configured(provider: Any, proxy_types: tuple[type, ...]) -> bool:
    return not isinstance(provider, proxy_types)


CONFIGURE_EXPORT_VARIABLE = "HP_OTEL_CONFIGURE_EXPORT"
_ON, _OFF = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _configure_export(value: Any) -> bool:
    """Whether to configure export when no global providers are set: the argument, else
    `HP_OTEL_CONFIGURE_EXPORT` (a bad value there is logged and the default kept), else yes."""
    if value is not None:
        if not isinstance(value, bool):
            raise ValueError(f"configure_export must be True or False, got {value!r}")
        return value
    raw = (getenv(CONFIGURE_EXPORT_VARIABLE) or "").strip().lower()
    if raw in _OFF:
        return False
    if raw and raw not in _ON:
        logger.warning(
            "hp_otel: %s must be 1/true/yes/on or 0/false/no/off, got %r; configuring export when no global "
            "providers are set (the default)",
            CONFIGURE_EXPORT_VARIABLE,
            raw,
        )
    return True


def _resolve_providers(tracer_provider: Any, meter_provider: Any, configure_export: bool = True) -> tuple[Any, Any]:
    """The caller's providers; else OTel's global ones if someone set them; else hp_otel.configure()'s
    (`configure_export`), or the global proxies as they are (contrib's way: export is the caller's)."""
    from opentelemetry.metrics import NoOpMeterProvider
    from opentelemetry.trace import NoOpTracerProvider, ProxyTracerProvider

    from hp_otel.common._otel_compat import proxy_meter_provider_class
    from hp_otel.export import telemetry as export

    if tracer_provider is None:
        candidate = trace.get_tracer_provider()
        if _is_configured(candidate, (ProxyTracerProvider, NoOpTracerProvider)):
            tracer_provider = candidate
    if meter_provider is None:
        candidate = metrics.get_meter_provider()
        if _is_configured(candidate, (proxy_meter_provider_class(), NoOpMeterProvider)):
            meter_provider = candidate
    if (tracer_provider is None or meter_provider is None) and not configure_export:
        return tracer_provider or trace.get_tracer_provider(), meter_provider or metrics.get_meter_provider()
    if tracer_provider is None or meter_provider is None:
        if export.configured() is None:
            logger.info(
                "hp_otel: no global OpenTelemetry providers are set, so the instrumentor exports with "
                "hp_otel.configure() from the OTEL_* environment; instrument(configure_export=False) or "
                "%s=0 leaves export to you (the global providers), as contrib instrumentors do",
                CONFIGURE_EXPORT_VARIABLE,
            )
        telemetry = export.configured() or export.configure()
        tracer_provider = tracer_provider or telemetry.tracer_provider
        meter_provider = meter_provider or telemetry.meter_provider
    return tracer_provider, meter_provider


class StepSession:
    """Opens one CommDebugMode window per step, inside that step's spans."""

    def __init__(
        self,
        tracer_provider: Any,
        meter_provider: Any,
        options: WindowOptions | None = None,
        collectives: StepCollectives | None = None,
    ) -> None:
        from hp_otel.mode.options import WindowOptions

        self.tracer_provider = tracer_provider
        self.meter_provider = meter_provider
        self.collectives = collectives  # each sampled step's collectives file (None: off)
        # every step's window is made from these (parsed once: hooks, stack depth, metric depth, module)
        self.options = (options or WindowOptions.parse(metric_depth_default=metric_labels.ALWAYS_ON_DEFAULT)).replace(
            tracer_provider=tracer_provider, meter_provider=meter_provider, live=False
        )  # live=False: the step pays an append per event; spans are built when it ends
        self.module = self.options.module
        # No module given (zero-code): find the model the optimizer trains, for module attribution.
        self.tracker = ModelTracker()
        self.implicit_steps = 0  # optimizer.step() calls seen
        self.explicit = False  # once the user marks steps, optimizer.step() no longer does
        self._implicit: tuple[StepSpans, Any] | None = None
        self._lock = threading.Lock()
        self._hook: Any = None
        self._stopped = False
        self.op_counts: Counter[str] = Counter()  # collectives per normalised op of every window closed

    # --- windows ----------------------------------------------------------------
    def _model(self, optimizer: Any = None) -> Any:
        """The module to attribute collectives to: given, else the one the tracker found (then it stops)."""
        if self.module is None and self.tracker.tracking:
            found = self.tracker.find(optimizer)
            if found is not None:
                self.module = found
                self.tracker.stop()
                logger.info("hp_otel: attributing collectives to the modules of %s", type(found).__name__)
        return self.module

    def _open_window(self, spans: StepSpans, module: Any) -> Any:
        from hp_otel.mode import CommDebugMode

        model = module if module is not None else self._model()
        mode = CommDebugMode.from_options(self.options.replace(module=model, record_spans=spans.sampled))
        token = otel_context.attach(spans.context)  # the window's spans nest under rank_step
        try:
            mode.__enter__()
        except BaseException:
            if mode.active:  # a Ctrl-C right after __enter__ returned: close the window before it propagates
                mode.__exit__(None, None, None)
            raise
        finally:
            otel_context.detach(token)
        return mode

    @contextlib.contextmanager
    def explicit_step(
        self, step: int | str, *, run_id: str | None, rank: int | None, module: Any
    ) -> Iterator[StepSpans]:
        self.explicit = True
        self._close_implicit()
        if not is_instrumentation_enabled():  # suppressed: no spans, no window
            yield StepSpans(step, run_id or "", rank or 0, self.tracer_provider, sampled=False)
            return
        spans = begin_step(step, run_id=run_id, rank=rank, tracer_provider=self.tracer_provider)
        mode = self._open_window(spans, module)

        def close_window(error: BaseException | None) -> None:
            mode.__exit__(type(error) if error else None, error, None)
            self.op_counts.update(mode.get_comm_counts(normalized=True))
            if self.collectives is not None:
                self.collectives.step_ended(spans, mode)

        with running(spans, before_end=close_window):
            yield spans

    # --- implicit steps: optimizer.step() boundaries ---------------------------------
    def _after_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.explicit:
            return
        try:
            with self._lock:
                self._close_implicit()
                self._model(optimizer)
                step = self.implicit_steps
                self.implicit_steps += 1
                if is_instrumentation_enabled():
                    spans = begin_step(step, tracer_provider=self.tracer_provider)
                    self._implicit = (spans, self._open_window(spans, None))
        except Exception as exc:  # never break training
            logger.warning("hp_otel: always-on step boundary failed; this step is not recorded", exc_info=exc)

    def _close_implicit(self) -> None:
        current, self._implicit = self._implicit, None
        if current is not None:
            spans, mode = current
            mode.__exit__(None, None, None)
            self.op_counts.update(mode.get_comm_counts(normalized=True))
            if self.collectives is not None:
                self.collectives.step_ended(spans, mode)
            spans.end()

    def start(self) -> None:
        """Hook torch's optimizers when torch is imported (at once if it is): never import it here (without
        torch, only explicit `hp_otel.step()` marks steps)."""
        self._stopped = False
        wrapt.register_post_import_hook(self._torch_imported, "torch")

    def _torch_imported(self, torch: Any) -> None:
        if self._stopped or self._hook is not None:
            return
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self._hook = register_optimizer_step_post_hook(self._after_optimizer_step)
        if self.module is None:
            self.tracker.start()

    def stop(self) -> None:
        self._stopped = True
        self.tracker.stop()
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        with self._lock:
            self._close_implicit()


def _warn_if_resource_lacks_rank(tracer_provider: Any) -> None:
    """Providers hp_otel did not make (the distro's) lack the ranks unless the resource detector is named."""
    resource = getattr(tracer_provider, "resource", None)
    if resource is None or launcher_env.global_rank() is None or schema.RESOURCE_RANK in resource.attributes:
        return
    logger.warning(
        "hp_otel: the tracer provider's resource has no %s, so spans and metrics cannot be told apart by rank; "
        "set OTEL_EXPERIMENTAL_RESOURCE_DETECTORS=hp_otel for the SDK to add it",
        schema.RESOURCE_RANK,
    )


# The settings `instrument(...)` takes that are a window's options (`WindowOptions.parse`), by the same names.
WINDOW_SETTING_NAMES = (
    "tracer_provider",
    "meter_provider",
    "module",
    "collective_hook",
    "module_hook",
    "op_hook",
    "stack",
    "metric_module_depth",
)
# All the settings it takes besides the providers' defaults; the training callbacks
# (hp_otel.integrations) take the same ones, checked by the same code.
SETTING_NAMES = (*WINDOW_SETTING_NAMES, "collectives_dir", "collectives_steps", "configure_export")


@dataclass(frozen=True)
class SessionSettings:
    """The instrumentor's settings, checked once (a bad one raises, naming it): what `instrument(...)`
    takes, and what a training callback takes, so both record their steps the same way. The window's
    options are parsed by the one parser every window uses (`hp_otel.mode.options.WindowOptions`)."""

    window: WindowOptions
    collectives: StepCollectives | None = None
    configure_export: bool | None = None  # None: HP_OTEL_CONFIGURE_EXPORT, else yes

    @classmethod
    def checked(cls, kwargs: Mapping[str, Any], *, strict: bool = False) -> SessionSettings:
        """From `instrument()`'s keyword arguments; `strict`: an unknown name is a TypeError (a
        callback's typo), where `instrument()` ignores what it does not know, as contrib's do."""
        from hp_otel.mode.options import WindowOptions
        from hp_otel.sources import check_settings

        unknown = sorted(set(kwargs) - set(SETTING_NAMES))
        if strict and unknown:
            raise TypeError(f"unknown setting(s) {', '.join(unknown)}; the settings are: {', '.join(SETTING_NAMES)}")
        # What every step's window is made from: a wrong one raises now, not at each step (as a lost step)
        window = WindowOptions.parse(
            **{name: kwargs[name] for name in WINDOW_SETTING_NAMES if name in kwargs},
            metric_depth_default=metric_labels.ALWAYS_ON_DEFAULT,
            lenient_env=True,  # zero-code runs: a typo in $HP_OTEL_STACK_DEPTH must not stop training
        )
        check_settings()
        collectives = step_collectives(kwargs.get("collectives_dir"), kwargs.get("collectives_steps"))
        configure_export = kwargs.get("configure_export")
        if configure_export is not None:
            _configure_export(configure_export)  # a bad one raises now, not at the first step
        return cls(window, collectives, configure_export)

    def session(self) -> StepSession:
        """A step session with these settings (providers resolved now: `hp_otel.configure()` may run late)."""
        tracer_provider, meter_provider = _resolve_providers(
            self.window.tracer_provider, self.window.meter_provider, _configure_export(self.configure_export)
        )
        _warn_if_resource_lacks_rank(tracer_provider)
        return StepSession(tracer_provider, meter_provider, self.window, self.collectives)


def start(settings: Mapping[str, Any]) -> None:
    """Start recording every step with `instrument()`'s settings (`HpOtelInstrumentor`, once a
    framework is imported); a bad setting raises, naming it."""
    global _session
    checked = SessionSettings.checked(settings)
    stop()  # a second start replaces the first session
    session = checked.session()
    installation.hold(_HOLDER)  # a window per step: hooks stay in between (see hp_otel.record.installation)
    session.start()
    _session = session
    set_step_handler(session)  # hp_otel.step() now records through the session


def stop() -> None:
    """Close the open step, remove the hooks, release what the windows left installed (`uninstrument()`)."""
    global _session
    session, _session = _session, None
    if session is None:
        return
    set_step_handler(None)
    session.stop()
    installation.release(_HOLDER)  # what the windows left installed is removed now
