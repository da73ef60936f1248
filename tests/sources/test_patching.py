"""`SharedPatches`, the one reference count of every shared hook (the redistribute wrapper, FSDP's
and Work.wait's patches, the DTensor class hook): installed by the first holder, restored by
identity when the last lets go, kept between windows only where it may linger."""

from __future__ import annotations

import types
from collections.abc import Callable

import pytest

from hp_otel.record import installation
from hp_otel.sources.patching import AttributePatch, SharedPatches

pytestmark = pytest.mark.torch_free


def _target() -> tuple[types.SimpleNamespace, object]:
    def original() -> str:
        return "original"

    return types.SimpleNamespace(f=original), original


def _wrapping(owner: types.SimpleNamespace, plans: list[int]) -> Callable[[], list[AttributePatch]]:
    def plan() -> list[AttributePatch]:
        plans.append(1)
        return [AttributePatch(owner, "f", lambda original: lambda: "wrapped " + original())]

    return plan


def test_first_holder_installs_last_restores_by_identity() -> None:
    owner, original = _target()
    plans: list[int] = []
    shared = SharedPatches(_wrapping(owner, plans))
    assert shared.acquire() is True
    assert shared.acquire() is True  # nested: the same installation
    assert owner.f() == "wrapped original" and shared.users == 2 and len(plans) == 1
    shared.release()
    assert owner.f() == "wrapped original"
    shared.release()
    assert owner.f is original and shared.users == 0
    shared.release()  # one release too many changes nothing
    assert owner.f is original and shared.users == 0


@pytest.mark.parametrize("lingers", [True, False])
def test_kept_between_windows_only_where_it_may_linger(lingers: bool) -> None:
    owner, original = _target()
    plans: list[int] = []
    shared = SharedPatches(_wrapping(owner, plans), lingers=lingers)
    installation.install()
    try:
        shared.acquire()
        shared.release()
        assert (owner.f is original) is not lingers
        shared.acquire()  # a lingering one is taken over, not planned again
        assert len(plans) == (1 if lingers else 2)
        shared.release()
    finally:
        installation.uninstall()
    assert owner.f is original and installation.lingering_count() == 0


def test_a_declined_plan_holds_nothing_and_is_asked_again() -> None:
    answers: list[list[AttributePatch] | None] = [None]
    owner, original = _target()
    shared = SharedPatches(lambda: answers.pop(), lingers=False)
    assert shared.acquire() is False and shared.users == 0
    shared.release()  # the caller that was refused may still release: nothing happens
    assert shared.users == 0
    answers.append([AttributePatch(owner, "f", lambda _original: lambda: "wrapped")])
    assert shared.acquire() is True and owner.f() == "wrapped"
    shared.release()
    assert owner.f is original
