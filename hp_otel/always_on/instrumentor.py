"""`HpOtelInstrumentor`, the class `opentelemetry-instrument` loads into every Python process.

So it is light: it imports neither torch nor MindSpore nor hp_otel's recording machinery.
`instrument()` waits for a framework (a post-import hook on `torch`, `mindspore` or
`hp_otel.always_on.steps`, i.e. `hp_otel.step()`) and only then starts recording and export
(`hp_otel.always_on.instrumentation.start`): a launcher, a data worker or a script that never
imports one pays only for this module. Not started at all under `OTEL_SDK_DISABLED=true`, in a
launcher (`torchrun`), or in a child `multiprocessing` started (one line says so).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Collection
from typing import Any

import wrapt
from opentelemetry.instrumentation.instrumentor import BaseInstrumentor

from hp_otel.always_on.package import _instruments, _instruments_any
from hp_otel.common import launcher_env
from hp_otel.common.env_read import SDK_DISABLED_VARIABLE, sdk_disabled

logger = logging.getLogger("hp_otel")

# Importing any of these starts the session: a framework to record, or hp_otel's own step API.
TRIGGER_MODULES = ("torch", "mindspore", "hp_otel.always_on.steps")
# What BaseInstrumentor.instrument() passes on to _instrument() in some releases: not settings.
_CONTRIB_ARGUMENTS = ("skip_dep_check", "raise_exception_on_conflict")


class HpOtelInstrumentor(BaseInstrumentor):  # type: ignore[misc]
    """Always-on hp_otel: counts every collective of every step, spans for sampled steps.

    `HpOtelInstrumentor().instrument(tracer_provider=tp, meter_provider=mp, module=model)`;
    all arguments optional. `uninstrument()` closes the open step and removes the hook.
    `collective_hook=`, `module_hook=`, `op_hook=`: your `fn(span, info)` for each span of a
    sampled step, as in `CommDebugMode`; a step's spans are built when the step ends, so
    the hooks run then. `stack=`: where each collective of a sampled step was called, as
    `CommDebugMode(stack=...)` (True, or a depth 1..64); default: `HP_OTEL_STACK_DEPTH`
    (a depth, 0 or unset: off). An unsampled step walks no frame. `metric_module_depth=`: module
    levels the metrics keep (as in `CommDebugMode`; default $HP_OTEL_METRIC_MODULE_DEPTH, else 1:
    the model's top-level children). `configure_export=`: with no providers passed and none set
    globally, True (default; `HP_OTEL_CONFIGURE_EXPORT`) exports with `hp_otel.configure()`, False
    uses OTel's global (proxy) providers as contrib instrumentors do, leaving export to you.
    `collectives_dir=`: a folder where each rank keeps the collectives of its last sampled steps in
    `collectives-rank<R>.json` (what `hp-otel ranks` compares), `collectives_steps=` of them (default 4);
    default: `HP_OTEL_COLLECTIVES_DIR` / `HP_OTEL_COLLECTIVES_STEPS` (unset: no file).

    Recording starts when torch, MindSpore or `hp_otel.step` is first imported (at once if one
    already is); settings passed here are checked at once (a bad one raises).
    """

    _pending: dict[str, Any] | None = None  # the settings, while no framework has been imported

    def instrumentation_dependencies(self) -> Collection[str]:
        """The installed framework it instruments (contrib's `instruments-any`: torch or MindSpore), as
        `BaseInstrumentor.instrument()` checks them all: torch if installed, else MindSpore, else
        torch's requirement (none installed: nothing to instrument, the SDK says so)."""
        from importlib.metadata import PackageNotFoundError, distribution

        for requirement in _instruments_any:
            try:
                distribution(requirement.split()[0])
            except PackageNotFoundError:
                continue
            return (*_instruments, requirement)
        return (*_instruments, _instruments_any[0])

    def _instrument(self, **kwargs: Any) -> None:
        settings = {name: value for name, value in kwargs.items() if name not in _CONTRIB_ARGUMENTS}
        if sdk_disabled():
            logger.debug(
                "hp_otel: %s=true: not instrumented (nothing recorded, opened or exported)", SDK_DISABLED_VARIABLE
            )
            return
        if launcher_env.is_launcher_process():
            # `opentelemetry-instrument torchrun ...` instruments the launcher too: it runs no step,
            # and configuring export there would take rank 0's Prometheus port.
            logger.debug("hp_otel: a launcher process (torchrun/msrun): not instrumented")
            return
        if settings or any(name in sys.modules for name in TRIGGER_MODULES):
            from hp_otel.always_on import instrumentation  # a program's own call: it pays for what it asked

            instrumentation.start(settings)  # a bad setting or a fault raises here, to the caller
            return
        self._pending = settings
        for name in TRIGGER_MODULES:
            wrapt.register_post_import_hook(self._framework_imported, name)

    def _framework_imported(self, module: Any) -> None:
        """A post-import hook, run inside the program's `import torch`: whatever fails is one log line."""
        settings, self._pending = self._pending, None
        if settings is None:  # started already (another trigger), or uninstrumented meanwhile
            return
        if launcher_env.is_multiprocessing_child():
            logger.info(
                "hp_otel: process %d is a multiprocessing child (a data worker or helper) of process %d: not "
                "instrumented, its parent records the rank (to record here, call hp_otel.configure() and "
                "HpOtelInstrumentor().instrument() in it)",
                os.getpid(),
                os.getppid(),
            )
            return
        try:
            from hp_otel.always_on import instrumentation

            instrumentation.start(settings)
        except Exception as exc:  # inside the user's import: never break it
            logger.warning("hp_otel: always-on recording not started (training goes on unrecorded): %s", exc)
            logger.debug("hp_otel: always-on start failed", exc_info=exc)

    def _uninstrument(self, **kwargs: Any) -> None:
        self._pending = None  # a hook still waiting for its import then does nothing
        instrumentation = sys.modules.get("hp_otel.always_on.instrumentation")
        if instrumentation is not None:
            instrumentation.stop()
