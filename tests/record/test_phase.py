"""Issue 40 item 3: the rules that turn what a source sees into a phase, owned by record/phase.py."""

from __future__ import annotations

import pytest

from hp_otel.record import phase
from hp_otel.spans import schema


@pytest.mark.parametrize(
    ("autograd_running", "expected"), [(False, schema.PHASE_FORWARD), (True, schema.PHASE_BACKWARD)]
)
def test_a_collective_issued_inside_autograd_is_hinted_backward(autograd_running: bool, expected: str) -> None:
    assert phase.of_collective(autograd_running) == expected
    assert phase.COLLECTIVE[autograd_running] == expected  # the table the hot hooks read


@pytest.mark.parametrize(
    ("autograd_running", "expected"), [(False, schema.PHASE_FORWARD), (True, schema.PHASE_RECOMPUTE)]
)
def test_a_forward_call_inside_autograd_is_a_recompute(autograd_running: bool, expected: str) -> None:
    """Activation checkpointing reruns forward from inside backward: that call is a recompute."""
    assert phase.of_forward_call(autograd_running) == expected
    assert phase.FORWARD_CALL[autograd_running] == expected  # the table the module hooks read


def test_work_inside_module_calls_takes_the_innermost_calls_phase() -> None:
    assert phase.enclosing([schema.PHASE_RECOMPUTE, schema.PHASE_BACKWARD]) == schema.PHASE_RECOMPUTE
    assert phase.enclosing(iter([schema.PHASE_BACKWARD, schema.PHASE_FORWARD])) == schema.PHASE_BACKWARD
    assert phase.enclosing([schema.PHASE_OPTIMIZER]) == schema.PHASE_OPTIMIZER


def test_work_outside_every_module_call_is_forward() -> None:
    assert phase.enclosing([]) == schema.PHASE_FORWARD
    assert phase.enclosing(iter(())) == schema.PHASE_FORWARD


def test_only_the_innermost_call_is_read() -> None:
    """The rest of the open calls are not walked (a caller may hand a lazy generator)."""

    def phases():  # type: ignore[no-untyped-def]
        yield schema.PHASE_BACKWARD
        raise AssertionError("read past the innermost call")

    assert phase.enclosing(phases()) == schema.PHASE_BACKWARD


@pytest.mark.parametrize(
    "stack",
    [
        [],
        [(schema.KIND_OP, schema.PHASE_FORWARD)],
        [(schema.KIND_MODULE, schema.PHASE_BACKWARD)],
        [(schema.KIND_MODULE, schema.PHASE_FORWARD), (schema.KIND_MODULE, schema.PHASE_RECOMPUTE)],
        [(schema.KIND_MODULE, schema.PHASE_RECOMPUTE), (schema.KIND_OP, schema.PHASE_FORWARD)],
        [
            (schema.KIND_MODULE, schema.PHASE_OPTIMIZER),
            (schema.KIND_REDISTRIBUTE, schema.PHASE_FORWARD),
            (schema.KIND_OP, schema.PHASE_BACKWARD),
        ],
        [(schema.KIND_MODULE, schema.PHASE_BACKWARD), (schema.KIND_MODULE, schema.PHASE_FORWARD)],
    ],
)
def test_the_span_builders_loop_gives_what_the_rule_gives(stack: list[tuple[str, str]]) -> None:
    """The builder walks its open calls itself (it asks for every op): the same answer as `enclosing`."""
    from types import SimpleNamespace

    from hp_otel.record.span_builder import SpanBuilder, _Frame

    frames = [_Frame(kind, None, None, None, None, phase_, None) for kind, phase_ in stack]  # type: ignore[arg-type]
    expected = phase.enclosing(p for kind, p in reversed(stack) if kind == schema.KIND_MODULE)
    assert SpanBuilder._phase(SimpleNamespace(_stack=frames)) == expected  # type: ignore[arg-type]


def test_the_sources_and_the_span_builder_decide_through_the_owner() -> None:
    """No other module spells a phase rule of its own (the five places that did, issue 40)."""
    import inspect

    from hp_otel.record import span_builder
    from hp_otel.sources import hyper_parallel
    from hp_otel.sources.pytorch import collective_timer, modules

    for module in (span_builder, hyper_parallel, collective_timer, modules):
        text = inspect.getsource(module)
        assert "!= -1 else schema.PHASE_" not in text, module.__name__
        assert "phase_of." in text, module.__name__
