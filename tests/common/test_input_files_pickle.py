"""The pickle reader's fast path (`_plainly_bounded`): a dump whose bytes bound what it builds skips
the opcode scan, and what the scan refuses is refused all the same, with the scan's reason."""

from __future__ import annotations

import pickle
import pickletools

import pytest

from hp_otel.common import input_files
from hp_otel.common.input_files import InputFileError, parse_pickle

DUMP = {"entries": [{"frames": [{"name": "f", "line": 3}], "input_sizes": [[4, 8]]}], "pg_config": {}}


def _scans(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    seen: list[str] = []
    original = input_files._check_pickle

    def counted(data: bytes, name: str, what: str) -> None:
        seen.append(name)
        original(data, name, what)

    monkeypatch.setattr(input_files, "_check_pickle", counted)
    return seen


def test_a_plain_dump_is_read_without_the_opcode_scan(monkeypatch: pytest.MonkeyPatch) -> None:
    scans = _scans(monkeypatch)
    assert parse_pickle(pickle.dumps(DUMP, protocol=4), "d") == DUMP
    assert scans == []


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ({1, 2}, "a set"),
        (frozenset({1}), "a set"),
        (bytearray(b"ab"), "a buffer"),
        (pickle.Pickler, "names a class"),
    ],
    ids=["set", "frozenset", "bytearray", "class"],
)
def test_what_the_scan_refuses_is_refused_on_the_fast_path_too(
    monkeypatch: pytest.MonkeyPatch, value: object, reason: str
) -> None:
    scans = _scans(monkeypatch)
    data = pickle.dumps({**DUMP, "x": [value]}, protocol=5)
    with pytest.raises(InputFileError, match=reason):
        parse_pickle(data, "d")
    assert scans == ["d"]  # the scan ran once, to name the reason


def test_more_container_bytes_than_the_budget_take_the_exact_scan(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(input_files, "MAX_PICKLE_CONTAINERS", 3)
    scans = _scans(monkeypatch)
    data = pickle.dumps(DUMP, protocol=4)
    containers = sum(1 for op, _, _ in pickletools.genops(data) if op.name in input_files._CONTAINERS)
    assert containers > 3
    with pytest.raises(InputFileError, match="more than 3 lists"):
        parse_pickle(data, "d")
    assert scans == ["d"]
