"""A kept span's attribute dict made by a function per tuple of names: the dict `dict(zip(...))`
makes, for any names, compiled only when a later read asks again."""

from __future__ import annotations

import pytest

from hp_otel.record import attribute_dicts

pytestmark = pytest.mark.torch_free

_ODD_NAMES = ("a", "it's", 'say "x"', "back\\slash", "new\nline", "nul\x00", "{braces}", "v[0]", "é", "\ud800")


def test_a_function_is_made_the_second_time_and_makes_the_same_dict() -> None:
    names = (*_ODD_NAMES, "second-time")
    values = tuple(range(len(names)))
    first = attribute_dicts.maker(names)
    assert names not in attribute_dicts._makers  # read once: nothing compiled
    second = attribute_dicts.maker(names)
    assert attribute_dicts._makers[names] is second is attribute_dicts.maker(names)
    for make in (first, second):
        made = make(values)
        assert made == dict(zip(names, values, strict=True)) and list(made) == list(names)
        assert make(values) is not made  # a new dict each time


@pytest.mark.parametrize(
    "names",
    [(), ("one",), ("a", 1, (2,)), ("s", type("S", (str,), {})("sub"))],
    ids=["none", "one", "not-str", "str-subclass"],
)
def test_any_names_give_the_dict_of_their_values(names: tuple) -> None:
    values = tuple(object() for _ in names)
    for _ in range(3):
        made = attribute_dicts.maker(names)(values)
        assert made == dict(zip(names, values, strict=True)) and list(made) == list(names)
        assert all(made[name] is value for name, value in zip(names, values, strict=True))


def test_past_the_bounds_the_dict_is_still_made(monkeypatch) -> None:
    monkeypatch.setattr(attribute_dicts, "_makers", {})
    monkeypatch.setattr(attribute_dicts, "_seen", set())
    monkeypatch.setattr(attribute_dicts, "_MAX_MAKERS", 2)
    long = tuple(f"k{i}" for i in range(attribute_dicts._MAX_NAMES + 1))
    sets = [(f"x{i}", "y") for i in range(4)] + [long]
    for _ in range(3):
        for names in sets:
            values = tuple(range(len(names)))
            assert attribute_dicts.maker(names)(values) == dict(zip(names, values, strict=True))
    assert len(attribute_dicts._makers) == 2 and long not in attribute_dicts._makers
