"""Layouts hp_otel cannot record correctly are refused with a clear error, before
anything is installed: windows of asyncio tasks interleaved on one thread (torch's modes
belong to the thread), and one model traced on two threads at once (module hooks belong
to the module). Windows one after another, nested in one task, or on separate threads
with separate models keep working."""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch
from events import design_mlp_forward
from torch.overrides import _get_current_function_mode_stack

from hp_otel import CommDebugMode
from hp_otel.spans import schema


def _alone() -> int:
    """The collectives of one design-MLP forward in a window of its own (the reference)."""
    with CommDebugMode() as mode:
        design_mlp_forward(mode.observer)
    return mode.get_total_counts()


def test_windows_of_interleaved_asyncio_tasks_are_refused() -> None:
    results: dict[str, object] = {}

    async def traced(name: str, started: asyncio.Event, other: asyncio.Event) -> None:
        try:
            with CommDebugMode() as mode:
                started.set()
                await other.wait()  # the other task runs while this window is open
                design_mlp_forward(mode.observer)
            results[name] = mode.get_total_counts()
        except RuntimeError as exc:
            started.set()
            results[name] = str(exc)

    async def main() -> None:
        a_started, b_started = asyncio.Event(), asyncio.Event()
        await asyncio.gather(
            asyncio.create_task(traced("a", a_started, b_started), name="task-a"),
            asyncio.create_task(traced("b", b_started, a_started), name="task-b"),
        )

    asyncio.run(main())
    assert results["a"] == _alone()  # its own collectives and nothing of b's
    assert "another window is open on this thread in asyncio task 'task-a'" in str(results["b"])
    assert "asyncio task 'task-b'" in str(results["b"])
    assert len(_get_current_function_mode_stack()) == 0


def test_windows_one_task_after_another_and_nested_in_one_task_work() -> None:
    counts = []

    async def traced() -> None:
        with CommDebugMode() as outer:
            design_mlp_forward(outer.observer)
            with CommDebugMode() as inner:
                await asyncio.sleep(0)
                design_mlp_forward(inner.observer)
            counts.append((outer.get_total_counts(), inner.get_total_counts()))

    async def main() -> None:
        for _ in range(3):
            await asyncio.create_task(traced())

    asyncio.run(main())
    assert counts == [(_alone(), _alone())] * 3


def test_one_model_on_two_threads_at_once_is_refused_with_the_thread_named() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    opened, release = threading.Event(), threading.Event()

    def hold_window() -> None:
        with CommDebugMode(model, engine="torch"):
            opened.set()
            release.wait(10)

    holder = threading.Thread(target=hold_window, name="trainer-1")
    holder.start()
    try:
        assert opened.wait(10)
        with pytest.raises(RuntimeError, match=r"module Sequential is already traced by a window on another thread "):
            with CommDebugMode(model, engine="torch"):
                pass
        hooks = sum(len(m._forward_pre_hooks) for m in model.modules())
        assert hooks == 2  # only the holder's: the refused window installed nothing
    finally:
        release.set()
        holder.join()
    with CommDebugMode(model, engine="torch") as mode:  # free again once the other thread's window closed
        model(torch.ones(1, 2))
    assert {s.name for s in mode.get_finished_spans()} >= {"Sequential", "0"}


def test_separate_models_on_separate_threads_are_fine() -> None:
    errors: list[BaseException] = []

    def work() -> None:
        model = torch.nn.Sequential(torch.nn.Linear(2, 2))
        try:
            for _ in range(20):
                with CommDebugMode(model, engine="torch"):
                    model(torch.ones(1, 2))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []


def _hold_on_thread(module: torch.nn.Module, name: str, opened: threading.Event, release: threading.Event) -> None:
    with CommDebugMode(module, engine="torch") as mode:
        opened.set()
        release.wait(10)
        module(torch.ones(1, 2))  # thread A's own spans: never in thread B's window
    assert {s.name for s in mode.get_finished_spans()} >= {type(module).__name__}


@pytest.mark.parametrize("held", ["model", "submodule"])
def test_a_model_and_its_submodule_on_two_threads_are_refused_with_the_thread_named(held: str) -> None:
    model = torch.nn.Sequential(torch.nn.Sequential(torch.nn.Linear(2, 2)))
    layer = model[0]
    held_module, other = (model, layer) if held == "model" else (layer, model)
    opened, release = threading.Event(), threading.Event()
    holder = threading.Thread(target=_hold_on_thread, args=(held_module, held, opened, release), name="trainer-A")
    holder.start()
    try:
        assert opened.wait(10)
        before = sum(len(m._forward_pre_hooks) for m in model.modules())
        expected = (
            r"module Sequential is already traced by a window on another thread \(thread 'trainer-A'\)"
            if held == "model"
            else r"module Sequential has a submodule \(Sequential\) that is already traced by a window on "
            r"another thread \(thread 'trainer-A'\)"
        )
        with pytest.raises(RuntimeError, match=expected):
            with CommDebugMode(other, engine="torch"):
                pass
        assert sum(len(m._forward_pre_hooks) for m in model.modules()) == before  # the refused one installed nothing
    finally:
        release.set()
        holder.join()
    with CommDebugMode(layer, engine="torch") as mode:  # free again once thread A's window closed
        layer(torch.ones(1, 2))
    assert len([s for s in mode.get_finished_spans() if s.attributes.get(schema.CALL_KIND) == schema.KIND_MODULE]) == 2
