"""pytest plugin (loaded automatically through the `pytest11` entry point).

Fixtures that wire hp_otel to the test:

- `hp_span_exporter`: an `InMemorySpanExporter` that receives every span hp_otel ends;
- `hp_tracer_provider` / `hp_meter_provider` / `hp_metric_reader`: SDK providers of
  this test only (spans exported synchronously, metrics read in memory);
- `comm_debug_mode`: a `CommDebugMode` wired to those providers (enter it with `with`);
- `make_comm_debug_mode(module=None, **kwargs)`: the same, for a module or more windows.

A mode a test leaves active fails the test at teardown (its hooks would leak into the
next test).  Assertions: `hp_otel.testing` (`assert_collective_counts`,
`assert_span_tree`, `span_outline`, `assert_no_callback_errors`, `assert_comm_snapshot`).
`--hp-otel-update-snapshots` rewrites the communication snapshots the session's tests
assert (see `hp_otel.testing.snapshots`); the summary lists the snapshots written.
Importing this module costs nothing: torch and the SDK load when a fixture is used.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest

_SNAPSHOTS = "hp_otel.testing.snapshots"
_UPDATE_OPTION = "--hp-otel-update-snapshots"
_snapshots_before = pytest.StashKey[int]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("hp_otel").addoption(
        _UPDATE_OPTION,
        action="store_true",
        default=False,
        help="rewrite the communication snapshots that assert_comm_snapshot compares against",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_snapshots_before] = len(sys.modules[_SNAPSHOTS].written) if _SNAPSHOTS in sys.modules else 0
    if config.getoption(_UPDATE_OPTION):
        from hp_otel.testing.snapshots import set_update_snapshots

        set_update_snapshots(True)


def pytest_unconfigure(config: pytest.Config) -> None:
    if config.getoption(_UPDATE_OPTION):
        from hp_otel.testing.snapshots import set_update_snapshots

        set_update_snapshots(False)  # an inline session (pytester) leaves the outer one as it was


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    module = sys.modules.get(_SNAPSHOTS)
    written = module.written[config.stash.get(_snapshots_before, 0) :] if module is not None else []
    if written:
        terminalreporter.write_sep("-", f"hp_otel: {len(written)} communication snapshot(s) written")
        for path in written:
            terminalreporter.write_line(str(path))


@pytest.fixture
def hp_span_exporter() -> Any:
    """Every span hp_otel ends in this test (through `hp_tracer_provider`)."""
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    return InMemorySpanExporter()


@pytest.fixture
def hp_tracer_provider(hp_span_exporter: Any) -> Iterator[Any]:
    """An SDK tracer provider of this test; spans reach `hp_span_exporter` as they end."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(hp_span_exporter))
    yield provider
    provider.shutdown()


@pytest.fixture
def hp_metric_reader() -> Any:
    """Reads hp_otel's metrics of this test (`get_metrics_data()`)."""
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    return InMemoryMetricReader()


@pytest.fixture
def hp_meter_provider(hp_metric_reader: Any) -> Iterator[Any]:
    """An SDK meter provider of this test, read by `hp_metric_reader`."""
    from opentelemetry.sdk.metrics import MeterProvider

    provider = MeterProvider(metric_readers=[hp_metric_reader])
    yield provider
    provider.shutdown()


@pytest.fixture
def make_comm_debug_mode(hp_tracer_provider: Any, hp_meter_provider: Any) -> Iterator[Callable[..., Any]]:
    """`make_comm_debug_mode(module=None, **kwargs)` -> a CommDebugMode wired to this test's providers."""
    from hp_otel import CommDebugMode

    made: list[Any] = []

    def make(module: Any = None, **kwargs: Any) -> Any:
        kwargs.setdefault("tracer_provider", hp_tracer_provider)
        kwargs.setdefault("meter_provider", hp_meter_provider)
        mode = CommDebugMode(module, **kwargs)
        made.append(mode)
        return mode

    yield make
    left_active = [mode for mode in made if mode.active]
    for mode in left_active:  # leave no hooks behind for the next test
        mode.__exit__(None, None, None)
    if left_active:
        pytest.fail(f"{len(left_active)} CommDebugMode window(s) were left active by the test", pytrace=False)


@pytest.fixture
def comm_debug_mode(make_comm_debug_mode: Callable[..., Any]) -> Any:
    """A CommDebugMode wired to `hp_tracer_provider` and `hp_meter_provider`; use it as `with comm_debug_mode:`."""
    return make_comm_debug_mode()
