"""Shared fixtures: a one-process fake process group for fast DTensor tests.

Test folders mirror the package (`tests/record/` tests `hp_otel/record/`, ...); what the
tests share — the referee, synthetic events, worker bodies of multi-process jobs, the
hyper-parallel stand-in, server launchers — lives in `tests/support/`, importable by name.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# Tests that abort a step on purpose leave functional collectives unwaited; torch then
# prints a C++ warning per thread at exit, after pytest's summary line. Set before torch loads.
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")

SUPPORT = str(Path(__file__).resolve().parent / "support")
if SUPPORT not in sys.path:
    sys.path.insert(0, SUPPORT)

# The markers' hooks (slow from its kinds, the torch_free checks), one plugin in tests/support.
from markers import (  # noqa: E402, F401
    pytest_collection_modifyitems,
    pytest_configure,
    pytest_ignore_collect,
    pytest_runtest_makereport,
)

# The native gate's fixtures (built, gate_on, gate_off), shared by the tests run with it and without it.
from native_gate import built, gate_off, gate_on  # noqa: E402, F401


@pytest.fixture(autouse=True)
def _one_off_windows(monkeypatch):
    """The suite's windows follow each other within milliseconds; in a program that makes the
    collective kernels stay registered between windows (`kernels.REOPEN_WITHIN_S`). Each test
    sees one-off windows unless it sets that itself (tests/sources/pytorch/test_inactive.py)."""
    try:
        monkeypatch.setattr("hp_otel.sources.pytorch.kernels.REOPEN_WITHIN_S", 0.0)
    except ImportError:  # no torch: no kernels
        pass


@pytest.fixture
def fake_group_timed(monkeypatch) -> None:
    """torch's fake process group timed as a real one: its collectives are otherwise left untimed
    (no bandwidth, out of the exposure figures), which tests of the timing itself cannot use."""
    from hp_otel.sources.pytorch import collectives

    monkeypatch.setattr(collectives, "torch_backend_name", lambda pg: "gloo")
    monkeypatch.setattr(collectives, "_groups", {})  # no group resolved as fake before


@pytest.fixture
def fake_world_of_4():
    """A 4-rank fake world (a 2 x 2 mesh has real sub-groups): the session's 2-rank one, if a test
    made it, is set aside and put back after (the default group is one per process)."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    had_world = dist.is_initialized()
    if had_world:
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
    yield 4
    dist.destroy_process_group()
    if had_world:
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)


@pytest.fixture(scope="session")
def fake_world():
    """A 2-rank world in this process over torch's fake process group (collectives return at once)."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if not dist.is_initialized():
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    yield 2
    dist.destroy_process_group()


@pytest.fixture
def tp_mlp(fake_world):
    """A fresh TP MLP (fc1 colwise, fc2 rowwise) and an input that requires grad."""
    import torch

    from hp_otel.workloads.tp_mlp import build_tp_mlp

    model = build_tp_mlp(fake_world)
    x = torch.randn(4, 16, requires_grad=True)
    return model, x
