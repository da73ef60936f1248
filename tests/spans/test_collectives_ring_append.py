"""The step loop's collectives file is appended, not rewritten, each step (issue 42, item 5).

Referees: the spans each step handed to the ring (what must read back), the kernel's count of
bytes this process wrote (`wchar` of /proc/self/io) and the file's inode (a rewrite is a new file,
renamed over the name; an append keeps it). A torn append is made by hand at every byte it could
stop at: what reads back is then exactly the steps before it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from hp_otel.analysis import compare_files
from hp_otel.spans import schema
from hp_otel.spans.collectives_file import (
    COMPACT_FACTOR,
    CollectivesRing,
    collective_spans,
    collectives_payload,
    recover_torn_ring,
)

KEEP = 3
RESOURCE = {schema.RESOURCE_RANK: 0, schema.RESOURCE_WORLD_SIZE: 1}


def _step(n: int, calls: int = 3) -> list[SimpleNamespace]:
    """Step n's collective spans: `calls` all_reduces of its own shape, its window named after it."""
    out = []
    for seq in range(calls):
        attrs = {
            schema.CALL_KIND: schema.KIND_COLLECTIVE,
            schema.COLLECTIVE_NAME: "all_reduce",
            schema.COLLECTIVE_OP: "all_reduce",
            schema.COLLECTIVE_SEQ: n * calls + seq,
            schema.COLLECTIVE_INPUT_SHAPE: (n + 1, 8),
            schema.COLLECTIVE_WINDOW: f"step {n}",
        }
        out.append(
            SimpleNamespace(name="all_reduce", attributes=attrs, start_time=1000 * n + seq, end_time=1000 * n + 9)
        )
    return out


def _expected(steps: range) -> list[tuple[str, dict, int, int]]:
    return [(s.name, dict(s.attributes), s.start_time, s.end_time) for n in steps for s in _step(n)]


def _read_back(path: Path) -> list[tuple[str, dict, int, int]]:
    payload = json.loads(path.read_bytes())  # whole JSON after every complete write
    return [(name, {k: v for k, v in a.items() if k in _step(0)[0].attributes}, s, e)
            for name, a, s, e in collective_spans(payload)]  # fmt: skip


def _wchar() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    raise AssertionError("no wchar in /proc/self/io")


def test_each_step_reads_back_as_the_last_kept_steps(tmp_path: Path) -> None:
    ring = CollectivesRing(tmp_path, KEEP, 0)
    for n in range(20):
        ring.add(_step(n), RESOURCE)
        assert _read_back(Path(ring.path)) == _expected(range(max(0, n + 1 - KEEP), n + 1)), n
    (f,) = compare_files([ring.path]).files
    assert f.ring and sorted({c.window for c in f.calls}) == ["step 17", "step 18", "step 19"]


def test_a_step_writes_its_own_window_and_a_rewrite_comes_every_keep_plus_one_steps(tmp_path: Path) -> None:
    ring = CollectivesRing(tmp_path, KEEP, 0)
    window = len(json.dumps(collectives_payload(_step(0), RESOURCE), separators=(",", ":")))  # one step alone
    written, inodes, sizes = [], [], []
    for n in range(40):
        before = _wchar()
        ring.add(_step(n), RESOURCE)
        written.append(_wchar() - before)
        inodes.append(os.stat(ring.path).st_ino)
        sizes.append(os.path.getsize(ring.path))
    rewrites = [n for n in range(1, 40) if inodes[n] != inodes[n - 1]]
    # first once it holds COMPACT_FACTOR x KEEP steps; it then holds KEEP, and takes
    # (COMPACT_FACTOR - 1) x KEEP appends before the next rewrite
    period = (COMPACT_FACTOR - 1) * KEEP + 1
    assert rewrites == list(range(COMPACT_FACTOR * KEEP, 40, period)), rewrites
    appends = [written[n] for n in range(1, 40) if n not in rewrites]
    assert max(appends) <= window, (appends, window)  # its own window only (a step's header is not repeated)
    assert min(written[n] for n in rewrites) > KEEP * window // 2  # a rewrite writes the kept steps
    assert max(sizes) <= COMPACT_FACTOR * KEEP * window  # bounded however long the run
    per_step = sum(written[period:]) / len(written[period:])
    print(f"\nbytes written per step: {per_step:.0f} (one window {window}, the kept steps {KEEP * window})")
    assert per_step < 2 * window


def _appended(tmp_path: Path) -> tuple[CollectivesRing, bytes, bytes, int]:
    """A ring after 2 steps, the file's bytes then, and the piece the third step's append writes at its offset."""
    ring = CollectivesRing(tmp_path, KEEP, 0)
    ring.add(_step(0), RESOURCE)
    ring.add(_step(1), RESOURCE)
    before = Path(ring.path).read_bytes()
    ring.add(_step(2), RESOURCE)
    after = Path(ring.path).read_bytes()
    offset = len(before) - 4  # the append writes over the closing "\n]}\n"
    assert after[:offset] == before[:offset]  # an append: nothing before the offset was written again
    return ring, before, after[offset:], offset


def test_an_append_torn_at_any_byte_reads_back_as_the_steps_before_it(tmp_path: Path) -> None:
    ring, before, piece, offset = _appended(tmp_path)
    path = Path(ring.path)
    for cut in range(len(piece) + 1):
        # what the file holds when the write stopped after `cut` bytes: the old closing bytes past them
        torn = before[:offset] + piece[:cut] + before[offset + cut :]
        path.write_bytes(torn)
        (f,) = compare_files([str(path)]).files
        whole_line = cut >= len(piece) - len(b"\n]}\n")  # the step's line is written, only the closing is not
        steps = range(3) if whole_line else range(2)
        assert sorted({c.window for c in f.calls}) == [f"step {n}" for n in steps], cut
        assert len(f.calls) == 3 * len(steps)


def test_a_file_cut_short_by_a_crash_keeps_its_whole_steps(tmp_path: Path) -> None:
    _, before, piece, offset = _appended(tmp_path)
    whole = before[:offset] + piece
    for cut in range(offset + 2, len(whole) - 4, 7):  # truncated anywhere in the last step's line
        payload = recover_torn_ring(whole[:cut], "x")
        assert payload is not None and payload["keep"] == KEEP
        assert [w["kinds"][0][schema.COLLECTIVE_WINDOW] for w in payload["windows"]] == ["step 0", "step 1"]
    assert recover_torn_ring(b'{"resourceSpans": [', "x") is None  # another file cut short stays not JSON


def test_a_file_changed_under_the_ring_is_rewritten_not_appended_to(tmp_path: Path) -> None:
    ring = CollectivesRing(tmp_path, KEEP, 0)
    ring.add(_step(0), RESOURCE)
    os.unlink(ring.path)  # removed meanwhile (a user cleaning the folder)
    ring.add(_step(1), RESOURCE)
    assert _read_back(Path(ring.path)) == _expected(range(2))
    with open(ring.path, "ab") as handle:  # someone else's bytes at its end
        handle.write(b"junk")
    ring.add(_step(2), RESOURCE)
    assert _read_back(Path(ring.path)) == _expected(range(3)) and ring.rewrites == 3


@pytest.mark.parametrize("keep", [1, 2])
def test_small_rings_keep_their_last_steps(tmp_path: Path, keep: int) -> None:
    ring = CollectivesRing(tmp_path, keep, 0)
    for n in range(7):
        ring.add(_step(n), RESOURCE)
        assert _read_back(Path(ring.path)) == _expected(range(max(0, n + 1 - keep), n + 1)), n


def test_a_link_or_fifo_put_at_the_name_between_steps_is_replaced_never_written(tmp_path: Path) -> None:
    """The folder may be shared: what is at the name since the last write is not the ring's file."""
    victim = tmp_path / "victim"
    victim.write_text("untouched")
    folder = tmp_path / "run"
    folder.mkdir()
    ring = CollectivesRing(folder, KEEP, 0)
    ring.add(_step(0), RESOURCE)
    os.unlink(ring.path)
    os.symlink(victim, ring.path)
    ring.add(_step(1), RESOURCE)
    assert victim.read_text() == "untouched" and not Path(ring.path).is_symlink()
    assert _read_back(Path(ring.path)) == _expected(range(2))
    os.unlink(ring.path)
    os.mkfifo(ring.path)  # opening it to write would wait for a reader forever
    ring.add(_step(2), RESOURCE)
    assert Path(ring.path).is_file() and _read_back(Path(ring.path)) == _expected(range(3))
