"""said_once: one record of what hp_otel says once per process, for every place that says it."""

from __future__ import annotations

import ast
import logging
import threading
from pathlib import Path

import pytest

import hp_otel
from hp_otel.common import said_once

pytestmark = pytest.mark.torch_free


@pytest.fixture(autouse=True)
def nothing_said_yet(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(said_once, "_said", set())


def test_a_line_is_logged_once_per_room_and_what(caplog) -> None:
    with caplog.at_level(logging.INFO, logger="hp_otel"):
        results = [said_once.log_once("room.a", "x", "hp_otel: %s", "first") for _ in range(3)]
        said_once.log_once("room.a", "y", "hp_otel: other what", level=logging.INFO)
        said_once.log_once("room.b", "x", "hp_otel: other room")
    assert results == [True, False, False]
    assert [(r.getMessage(), r.levelno) for r in caplog.records] == [
        ("hp_otel: first", logging.WARNING),
        ("hp_otel: other what", logging.INFO),
        ("hp_otel: other room", logging.WARNING),
    ]


def test_forget_one_room_leaves_the_others_said() -> None:
    assert said_once.first_time("room.a", "x") and said_once.first_time("room.b", "x")
    said_once.forget("room.a")
    assert not said_once.already_said("room.a", "x") and said_once.already_said("room.b", "x")
    assert said_once.first_time("room.a", "x") and not said_once.first_time("room.b", "x")
    said_once.forget()
    assert not said_once.already_said("room.b", "x")


def test_already_said_does_not_record() -> None:
    assert not said_once.already_said("room", ("tuple", 1))
    assert not said_once.already_said("room", ("tuple", 1))
    assert said_once.first_time("room", ("tuple", 1))


def test_many_threads_asking_at_once_get_one_first_time() -> None:
    firsts: list[bool] = []
    start = threading.Barrier(16)

    def ask() -> None:
        start.wait()
        firsts.extend(said_once.first_time("room", n) for n in range(200))

    threads = [threading.Thread(target=ask) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(firsts) == 16 * 200 and sum(firsts) == 200


def test_no_module_keeps_a_once_record_of_its_own() -> None:
    """The former six mechanisms (module-level sets and `told` flags) stay gone: a new one fails here.
    Module level only: a local flag of one run (the bench's progress line) is not a process's record."""
    package = Path(hp_otel.__file__).parent
    own_records = []
    for path in package.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in [*tree.body, *(n for n in ast.walk(tree) if isinstance(n, ast.Constant))]:
            names = []
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and not (
                isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
            ):  # a string is a said_once owner's key, not a record of what was said
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = [t.id for t in targets if isinstance(t, ast.Name)]
            elif isinstance(node, ast.Constant) and node.value == "told":
                names = ["told"]
            own_records += [
                f"{path.relative_to(package)}:{name}"
                for name in names
                if any(word in name.lower() for word in ("told", "warned", "said_once", "say_once"))
            ]
    assert own_records == []
