"""The instrumentor's metrics keep one module level by default (bounded by the model's top level)."""

from __future__ import annotations

import pytest
from events import ALL_REDUCE
from opentelemetry.test.test_base import TestBase

import hp_otel
from hp_otel.always_on.instrumentation import HpOtelInstrumentor
from hp_otel.record.metric_labels import ENV_VAR
from hp_otel.spans import schema
from hp_otel.spans.infos import ModuleInfo

pytestmark = pytest.mark.torch_free  # needs no torch: not rerun on torch 2.14.1 (tests/support/markers.py)


class TestAlwaysOnModuleDepth(TestBase):
    def tearDown(self) -> None:
        HpOtelInstrumentor().uninstrument()
        super().tearDown()

    def _labels(self, **kwargs: object) -> list[str | None]:
        from hp_otel import mode as mode_module

        HpOtelInstrumentor().instrument(
            tracer_provider=self.tracer_provider, meter_provider=self.meter_provider, **kwargs
        )
        with hp_otel.step(0, run_id="r", rank=0):
            observer = mode_module._current_mode.get().observer
            observer.on_module_enter(ModuleInfo("layers.3.attn", "layers.3.attn", "Attention"), "forward")
            observer.on_collective(ALL_REDUCE, 0, 1000)
            observer.on_module_exit("layers.3.attn", "forward")
        metrics = {m.name: m for m in self.get_sorted_metrics()}
        return [p.attributes.get(schema.MODULE_FQN) for p in metrics[schema.METRIC_CALLS].data.data_points]

    def test_default_is_one_level(self) -> None:
        with pytest.MonkeyPatch.context() as patch:
            patch.delenv(ENV_VAR, raising=False)
            assert self._labels() == ["layers"]

    def test_the_env_var(self) -> None:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv(ENV_VAR, "2")
            assert self._labels() == ["layers.3"]

    def test_the_argument_wins_over_the_env_var(self) -> None:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv(ENV_VAR, "2")
            assert self._labels(metric_module_depth="full") == ["layers.3.attn"]

    def test_a_bad_value_is_refused_by_name(self) -> None:
        with pytest.raises(ValueError, match="metric_module_depth must be"):
            HpOtelInstrumentor().instrument(
                tracer_provider=self.tracer_provider, meter_provider=self.meter_provider, metric_module_depth=-2
            )
