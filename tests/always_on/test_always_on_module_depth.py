"""The instrumentor's metrics keep one module level by default (bounded by the model's top level)."""

from __future__ import annotations

import pytest
from events import ALL_REDUCE
from opentelemetry.test.test_base import TestBase

import hp_otel
from hp_otel.always_on.instrumentor import HpOtelInstrumentor
from hp_otel.record.metric_labels import ENV_VAR
from hp_otel.spans import schema
from hp_otel.spans.infos import ModuleInfo

pytestmark = pytest.mark.torch_free  # needs no torch: not rerun on torch 2.14.1 (tests/support/markers.py)


class TestAlwaysOnModuleDepth(TestBase):
    def tearDown(self) -> None:
        HpOtelInstrumentor().uninstrument()
        super().tearDown()

    def _labels(self, metric: str = schema.METRIC_CALLS, **kwargs: object) -> list[str | None]:
        from hp_otel.mode import registry

        HpOtelInstrumentor().instrument(
            tracer_provider=self.tracer_provider, meter_provider=self.meter_provider, **kwargs
        )
        with hp_otel.step(0, run_id="r", rank=0):
            observer = registry.current_mode.get().observer
            for i, fqn in enumerate(("layers.3.attn", "layers.5.attn")):
                observer.on_module_enter(ModuleInfo(fqn, fqn, "Attention"), "forward")
                observer.on_collective(ALL_REDUCE, i * 10_000, i * 10_000 + 1000)
                observer.on_module_exit(fqn, "forward")
        metrics = {m.name: m for m in self.get_sorted_metrics()}
        return sorted((p.attributes.get(schema.MODULE_FQN) for p in metrics[metric].data.data_points), key=str)

    def test_the_exposure_metrics_keep_the_same_level(self) -> None:
        # hp_otel.collective.time / .exposed kept every module at full depth: series grew with the model's depth
        with pytest.MonkeyPatch.context() as patch:
            patch.delenv(ENV_VAR, raising=False)
            assert self._labels(schema.METRIC_COMM_TIME) == ["layers", "layers"]  # exposed, overlapped
            (metric,) = [m for m in self.get_sorted_metrics() if m.name == schema.METRIC_COMM_TIME]
            # both modules' collectives, summed into the one series a state
            assert sum(p.value for p in metric.data.data_points) == pytest.approx(2000 / 1e9)

    def test_the_exposure_metrics_drop_the_module_with_none(self) -> None:
        assert self._labels(schema.METRIC_COMM_TIME, metric_module_depth="none") == [None, None]

    def test_default_is_one_level(self) -> None:
        with pytest.MonkeyPatch.context() as patch:
            patch.delenv(ENV_VAR, raising=False)
            assert self._labels() == ["layers"]

    def test_the_env_var(self) -> None:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv(ENV_VAR, "3")
            assert self._labels() == ["layers.*.attn"]  # layers 3 and 5 share one label set

    def test_the_argument_wins_over_the_env_var(self) -> None:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv(ENV_VAR, "2")
            assert self._labels(metric_module_depth="full") == ["layers.3.attn", "layers.5.attn"]

    def test_a_bad_value_is_refused_by_name(self) -> None:
        with pytest.raises(ValueError, match="metric_module_depth must be"):
            HpOtelInstrumentor().instrument(
                tracer_provider=self.tracer_provider, meter_provider=self.meter_provider, metric_module_depth=-2
            )
