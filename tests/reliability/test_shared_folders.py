"""Shared folders (`HP_OTEL_COLLECTIVES_DIR`, `HP_OTEL_PROMETHEUS_SD_DIR`): what another user plants
there never makes hp_otel write a file elsewhere (issue 43).

The other user is `nobody`: a forked child that drops to it plants links, FIFOs and folders in a
sticky, world-writable folder (as /tmp is); the rank writes as root, which may write anywhere, so
only hp_otel's own care keeps the victim file unchanged.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
import traceback
from pathlib import Path
from types import SimpleNamespace

import pytest

from hp_otel.export.prometheus_sd import SD_DIR_VARIABLE, write_target
from hp_otel.spans import schema
from hp_otel.spans.collectives_file import CollectivesRing

pytestmark = pytest.mark.torch_free  # needs no torch: not rerun on torch 2.14.1 (tests/support/markers.py)

NOBODY = 65534
VICTIM_TEXT = "root:x:0:0:root:/root:/bin/bash\n"


def _root_or_skip() -> None:
    if os.geteuid() != 0:
        if os.environ.get("CI"):
            pytest.fail("CI runs as root: the other-user cases must run")
        pytest.skip("needs root to act as another user (nobody)")


def _as_nobody(action) -> None:
    """Run `action()` in a forked child that has become `nobody`; fail if it failed."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            action()
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "nobody's planting failed"


@pytest.fixture
def shared():
    """(a sticky world-writable folder, a root-only file that nobody cannot write)."""
    _root_or_skip()
    tmp_path = Path(tempfile.mkdtemp(prefix="hp_otel-shared-"))  # pytest's own is 0700 above: nobody could not enter
    os.chmod(tmp_path, 0o755)
    folder = tmp_path / "shared"
    folder.mkdir()
    os.chmod(folder, 0o1777)
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    victim = private / "passwd"
    victim.write_text(VICTIM_TEXT)
    yield folder, victim
    shutil.rmtree(tmp_path)


def _spans() -> list:
    attrs = {schema.CALL_KIND: schema.KIND_COLLECTIVE, schema.COLLECTIVE_OP: "all_reduce", schema.COLLECTIVE_SEQ: 1}
    return [SimpleNamespace(name="all_reduce", attributes=attrs, start_time=1, end_time=2)]


def test_a_link_at_the_collectives_file_is_replaced_not_followed(shared):
    folder, victim = shared
    link = folder / "collectives-rank0.json"
    _as_nobody(lambda: os.symlink(victim, link))
    CollectivesRing(folder, 4, 0).add(_spans(), {schema.RESOURCE_RANK: 0})
    assert victim.read_text() == VICTIM_TEXT
    assert not link.is_symlink() and link.lstat().st_uid == 0
    assert json.loads(link.read_text())["windows"][0]["calls"][0][1] == "all_reduce"
    assert link.stat().st_mode & 0o022 == 0  # only its owner can write it


def test_a_link_at_the_scrape_target_is_replaced_not_followed(shared, monkeypatch):
    folder, victim = shared
    link = folder / "run-rank0.json"
    _as_nobody(lambda: os.symlink(victim, link))
    path = write_target("10.0.0.1", 9464, "run", {SD_DIR_VARIABLE: str(folder), "RANK": "0"})
    assert path == link
    assert victim.read_text() == VICTIM_TEXT
    assert not link.is_symlink()
    assert json.loads(link.read_text())[0]["targets"] == ["10.0.0.1:9464"]


def test_a_fifo_at_the_name_never_blocks_the_write(shared):
    """Opening a FIFO for writing waits for a reader forever: the rank would hang at its step's end."""
    folder, _ = shared
    fifo = folder / "collectives-rank0.json"
    _as_nobody(lambda: os.mkfifo(fifo))
    done = threading.Event()

    def write():
        CollectivesRing(folder, 4, 0).add(_spans(), {schema.RESOURCE_RANK: 0})
        done.set()

    threading.Thread(target=write, daemon=True).start()
    assert done.wait(10), "the write blocked on a FIFO planted at its name"
    assert fifo.is_file()


def test_a_folder_linked_by_another_user_is_refused(shared):
    """`HP_OTEL_COLLECTIVES_DIR=/shared/run` where nobody made /shared/run a link to a root-only folder."""
    folder, victim = shared
    run = folder / "run"
    _as_nobody(lambda: os.symlink(victim.parent, run))
    with pytest.raises(PermissionError, match=rf"collectives file: .*run' is a symlink owned by uid {NOBODY}"):
        CollectivesRing(run, 4, 0).add(_spans(), {schema.RESOURCE_RANK: 0})
    assert sorted(os.listdir(victim.parent)) == ["passwd"]


def test_a_folder_linked_by_its_user_is_followed(tmp_path):
    """The user's own link (a scratch disk) is still theirs to use."""
    from hp_otel.common.files import write_in_folder

    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    write_in_folder(tmp_path / "link", "x.json", lambda handle: handle.write("{}"), "collectives file")
    assert (real / "x.json").read_text() == "{}"
    assert sorted(os.listdir(real)) == ["x.json"]  # no temporary file left
