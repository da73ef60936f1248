"""Your own sources (`CommDebugMode(extra_sources=[...])`): attached when the window opens, detached when
it closes; sources written with the former names `install` / `uninstall` still work, with a warning."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
from events import ALL_REDUCE, collective

from hp_otel import CommDebugMode
from hp_otel.record.observer import Observer

pytestmark = pytest.mark.torch_free  # needs no torch: not rerun on torch 2.14.1 (tests/support/markers.py)


class _Calls:
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.observer: Any = None


class MySource(_Calls):
    """A source as docs/guide/engines.md documents it: reports one collective when attached."""

    def attach(self, observer: Observer) -> None:
        self.calls.append("attach")
        self.observer = observer
        collective(observer)

    def detach(self) -> None:
        self.calls.append("detach")


def test_an_extra_source_is_attached_to_the_window_and_detached_after_it() -> None:
    source = MySource()
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        mode = CommDebugMode(extra_sources=[source])
    assert mode.sources[-1] is source
    with mode:
        assert source.calls == ["attach"] and source.observer is mode.observer
    assert source.calls == ["attach", "detach"]
    assert mode.get_comm_counts() == {ALL_REDUCE.name: 1}
    assert mode.get_callback_error_counts() == {}


def _former_names_source() -> Any:
    class FormerNamesSource(_Calls):  # made per test: the warning is given once per class
        def install(self, observer: Observer) -> None:
            self.calls.append("install")
            self.observer = observer
            collective(observer)

        def uninstall(self) -> None:
            self.calls.append("uninstall")

    return FormerNamesSource


def test_a_source_with_the_former_names_still_works_and_is_warned_about_once_per_class() -> None:
    cls = _former_names_source()
    source: Any = cls()
    with pytest.warns(DeprecationWarning, match=r"FormerNamesSource: .*now attach\(observer\) / detach\(\)") as seen:
        mode = CommDebugMode(extra_sources=[source])
    assert [w.filename for w in seen] == [__file__]  # points at the line that made the mode
    assert mode.sources[-1] is source  # the user's object, not an adapter
    with mode:
        assert source.calls == ["install"] and source.observer is mode.observer
    assert source.calls == ["install", "uninstall"]
    assert mode.get_comm_counts() == {ALL_REDUCE.name: 1}
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        with CommDebugMode(extra_sources=[cls()]) as again:  # the same class: no second warning
            pass
    assert again.get_comm_counts() == {ALL_REDUCE.name: 1}


@pytest.mark.parametrize("former_names", [False, True])
def test_a_source_that_cannot_attach_is_counted_under_its_own_name_and_detached(former_names: bool) -> None:
    class Broken(_Calls):
        def attach(self, observer: Observer) -> None:
            self.calls.append("attach")
            raise RuntimeError("cannot hook")

        def detach(self) -> None:
            self.calls.append("detach")

    if former_names:
        Broken.install, Broken.uninstall = Broken.attach, Broken.detach  # type: ignore[attr-defined]
        del Broken.attach, Broken.detach
    source = Broken()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        mode = CommDebugMode(extra_sources=[source])
    with mode:  # training goes on
        pass
    assert source.calls == ["attach", "detach"]
    assert mode.get_callback_error_counts() == {"attach:Broken": 1}


@pytest.mark.parametrize("not_a_source", [object(), _Calls()])
def test_an_object_without_attach_and_detach_is_refused(not_a_source: Any) -> None:
    name = type(not_a_source).__name__
    with pytest.raises(
        TypeError, match=rf"extra_sources: {name} is not a source \(needs attach\(observer\) and detach\(\)\)"
    ):
        CommDebugMode(extra_sources=[not_a_source])
