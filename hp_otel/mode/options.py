"""A window's options, parsed, checked and defaulted once: `WindowOptions.parse(...)`.

`CommDebugMode`, the always-on instrumentor (`hp_otel.always_on.instrumentation`, and through
it the training callbacks of `hp_otel.integrations`) and the torch drop-in all make their
windows from a `WindowOptions`, so an option means the same everywhere and a wrong one raises
the same error (naming the argument and what it allows) wherever it is given.

One "not given" (`NOT_GIVEN`; None, where a signature shows it, is the same) and one meaning
per depth option once parsed:

- `stack_depth`: user frames per call stack, 0 off (not given: `HP_OTEL_STACK_DEPTH`, else off);
- `metric_depth`: module levels the metrics' `hp_otel.module.fqn` keeps, None the whole fqn (not
  given: `HP_OTEL_METRIC_MODULE_DEPTH`, else the caller's default: the whole fqn for a
  `CommDebugMode`, 1 for the instrumentor);
- `module_depth`: module levels hooked, None every module; not given, `hooked_depth` is every
  module in a traced window and the metric depth in a counts-only one.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

from hp_otel.record.call_stack import check_depth, depth_from_env
from hp_otel.record.metric_labels import resolve_depth
from hp_otel.record.user_hooks import NO_HOOKS, UserHooks
from hp_otel.record.watchdog import HangWatchdog
from hp_otel.sources import check_engine, is_mindspore_cell, is_torch_module

logger = logging.getLogger("hp_otel")

DEFAULT_MAX_SPANS = 100_000


class _NotGiven:
    """The type of `NOT_GIVEN`: an option the caller left out."""

    _instance: _NotGiven | None = None

    def __new__(cls) -> _NotGiven:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "NOT_GIVEN"

    def __bool__(self) -> bool:
        return False


NOT_GIVEN: Final = _NotGiven()


def given(value: object) -> bool:
    """An option the caller gave: neither `NOT_GIVEN` nor None."""
    return value is not NOT_GIVEN and value is not None


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


def check_module_depth(value: object) -> int | _NotGiven | None:
    """`module_depth=`: "full" -> None (every module), an int k >= 0 -> k, not given stays so; else an error."""
    if not given(value):
        return NOT_GIVEN
    if isinstance(value, str) and value == "full":
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise ValueError(f"module_depth must be 'full' or an int >= 0 (module levels hooked, the root is 0), got {value!r}")


def check_sources(sources: Any) -> tuple[Any, ...]:
    """`extra_sources=`: a sequence of sources (`attach`/`detach`, or the former `install`/`uninstall`)."""
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


def _check_bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return value


def _stack_depth(stack: object, lenient_env: bool) -> int:
    """`stack=` if given (a bad one raises), else HP_OTEL_STACK_DEPTH (`lenient_env`: a bad one is logged, off)."""
    if given(stack):
        return check_depth(stack)
    try:
        return depth_from_env()
    except ValueError as exc:
        if not lenient_env:
            raise
        logger.warning("hp_otel: %s; recording no call stacks", exc)  # zero-code runs: a typo must not stop training
        return 0


@dataclass(frozen=True)
class WindowOptions:
    """A window's options, checked: made by `parse`, read by `CommDebugMode` (see its docs for each)."""

    module: Any = None
    engine: str = "auto"
    tracer_provider: Any = None  # None: hp_otel's own SDK provider
    meter_provider: Any = None  # None: hp_otel's own SDK provider with an in-memory reader
    max_spans: int = DEFAULT_MAX_SPANS
    live: bool = False  # spans built as the work happens (else after the fact, from the event log)
    record_spans: bool = True
    ops: bool = True
    extra_sources: tuple[Any, ...] = ()
    watchdog: HangWatchdog | None = None
    hooks: UserHooks = NO_HOOKS
    stack_depth: int = 0  # user frames per call stack; 0: off
    metric_depth: int | None = None  # module levels the metrics keep; None: the whole fqn
    module_depth: int | _NotGiven | None = NOT_GIVEN  # module levels hooked; None: every module

    @property
    def hooked_depth(self) -> int | None:
        """How deep module sources hook (None: every module): as asked, else every module in a traced
        window and, in a counts-only one, only as deep as its metrics label."""
        if self.module_depth is not NOT_GIVEN:
            return self.module_depth  # type: ignore[return-value]
        return None if self.record_spans else self.metric_depth

    def replace(self, **changes: Any) -> WindowOptions:
        """These options with some changed (already checked values: a step's module, sampling, providers)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def parse(
        cls,
        module: Any = None,
        *,
        engine: str = "auto",
        tracer_provider: Any = None,
        meter_provider: Any = None,
        max_spans: int = DEFAULT_MAX_SPANS,
        live_spans: bool | None = None,
        record_spans: bool = True,
        ops: bool = True,
        extra_sources: Iterable[Any] = (),
        watchdog: HangWatchdog | None = None,
        collective_hook: Any = None,
        module_hook: Any = None,
        op_hook: Any = None,
        stack: object = NOT_GIVEN,
        metric_module_depth: object = NOT_GIVEN,
        module_depth: object = NOT_GIVEN,
        metric_depth_default: int | None = None,
        lenient_env: bool = False,
    ) -> WindowOptions:
        """Check every option (a wrong one raises, naming the argument and what it allows) and default
        the ones not given. `metric_depth_default`: the metric depth when neither the argument nor
        $HP_OTEL_METRIC_MODULE_DEPTH gives one; `lenient_env`: a bad $HP_OTEL_STACK_DEPTH is logged
        (stacks off) instead of raised, for zero-code runs."""
        engine = check_engine(engine)
        check_module(module, engine)
        if isinstance(max_spans, bool) or not isinstance(max_spans, int) or max_spans < 0:
            raise ValueError(f"max_spans must be a non-negative int, got {max_spans!r}")
        check_providers(tracer_provider, meter_provider)
        if live_spans is not None and not isinstance(live_spans, bool):
            raise TypeError(f"live_spans must be True, False or None, got {live_spans!r}")
        record_spans = _check_bool("record_spans", record_spans)
        ops = _check_bool("ops", ops)
        sources = check_sources(extra_sources)
        hooks = UserHooks.checked(collective_hook, module_hook, op_hook)
        if watchdog is not None and not isinstance(watchdog, HangWatchdog):
            raise TypeError(f"watchdog must be a hp_otel.HangWatchdog or None, got {type(watchdog).__name__}")
        stack_depth = _stack_depth(stack, lenient_env)
        metric_depth = resolve_depth(metric_module_depth if given(metric_module_depth) else None, metric_depth_default)
        return cls(
            module=module,
            engine=engine,
            tracer_provider=tracer_provider,
            meter_provider=meter_provider,
            max_spans=max_spans,
            live=bool(live_spans),  # opt-in: deferred spans are built whole, at window end or when read
            record_spans=record_spans,
            ops=ops,
            extra_sources=sources,
            watchdog=watchdog,
            hooks=hooks,
            stack_depth=stack_depth,
            metric_depth=metric_depth,
            module_depth=check_module_depth(module_depth),
        )
