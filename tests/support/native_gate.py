"""The native gate's fixtures (tests/conftest.py takes them in), for the tests that run with the gate
and without it: test_native_gate, test_op_filter.

`built` builds the gate when it is not yet (`native.build()`, ≈30 s once, cached). Under CI a
build that fails fails the tests; elsewhere they skip, saying why. `gate_on` and `gate_off` forget
the lookup before and after, so no test sees the gate another test found or turned off. hp_otel's
torch source is imported inside them: the conftest loads this module in the run without torch too.
"""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="module")
def built():
    from hp_otel.sources.pytorch import native

    try:
        return native.build()
    except native.NativeBuildError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"the native gate must build under CI: {exc}")
        pytest.skip(f"the native gate cannot be built here: {exc}")


@pytest.fixture
def gate_on(built, monkeypatch):
    from hp_otel.sources.pytorch import native

    monkeypatch.setenv(native.NATIVE_ENV, "auto")
    native.forget()
    yield native.gate()
    native.forget()


@pytest.fixture
def gate_off(monkeypatch):
    from hp_otel.sources.pytorch import native

    monkeypatch.setenv(native.NATIVE_ENV, "off")
    native.forget()
    yield
    native.forget()
