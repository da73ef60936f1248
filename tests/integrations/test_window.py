"""Which steps a callback traces (`StepWindow`): every step, every N-th, a range; a bad `steps=`
is refused with the argument's name and what is allowed."""

from __future__ import annotations

import pytest

from hp_otel.integrations.window import StepWindow

pytestmark = pytest.mark.torch_free


def _traced(steps, upto: int = 12) -> list[int]:
    window = StepWindow(steps)
    return [n for n in range(upto) if n in window]


def test_every_step_every_nth_and_a_range() -> None:
    assert _traced(None) == list(range(12))
    assert _traced(1) == list(range(12))
    assert _traced(5) == [0, 5, 10]
    assert _traced(range(3, 6)) == [3, 4, 5]
    assert _traced(range(2, 12, 4)) == [2, 6, 10]


def test_only_a_range_finishes() -> None:
    assert not StepWindow(None).finished(10**9) and not StepWindow(3).finished(10**9)
    window = StepWindow(range(2, 10, 4))  # steps 2, 6
    assert [n for n in range(10) if window.finished(n)] == [7, 8, 9]


def test_a_step_that_is_no_step_number_is_not_traced() -> None:
    window = StepWindow(None)
    assert -1 not in window and True not in window and "3" not in window and 2.0 not in window


@pytest.mark.parametrize(
    ("steps", "error"),
    [
        (0, ValueError),
        (-2, ValueError),
        (True, TypeError),
        (2.0, TypeError),
        ("10", TypeError),
        ([1, 2], TypeError),
        (range(-1, 3), ValueError),
        (range(10, 0, -1), ValueError),
    ],
)
def test_a_bad_steps_is_refused_naming_what_is_allowed(steps, error) -> None:
    with pytest.raises(error, match=r"steps must be None \(every step\), an int N >= 1 .* or a range of steps"):
        StepWindow(steps)


def test_an_empty_range_is_refused() -> None:
    with pytest.raises(ValueError, match=r"steps=range\(5, 5\) holds no step"):
        StepWindow(range(5, 5))
