"""The native gate's cache is trusted only when nobody else could have written it (issue 43).

A library at the gate's path runs inside the trainer when loaded, so: the gate is loaded only when
it and each folder from the cache folder down are this user's (or root's) and writable by no one
else, checked on the open file before `dlopen`; `hp-otel build-native` never reports another
user's file as the build; the build reaches its final name whole (renamed into place); a relative
`XDG_CACHE_HOME` is refused. Another user is played by `nobody` (files given to it as root).
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hp_otel.cli import main
from hp_otel.common import cache_dir
from hp_otel.sources.pytorch import native

NOBODY = 65534
PLANTED_C = r"""
#include <stdio.h>
__attribute__((constructor)) static void planted(void) {
    FILE *f = fopen("%s", "w");
    if (f) { fputs("ran", f); fclose(f); }
}
"""


def _root_or_skip() -> None:
    """Giving a file to another user needs root: CI runs as root, so there this must not skip."""
    if os.geteuid() != 0:
        if os.environ.get("CI"):
            pytest.fail("CI runs as root: the other-user cases must run")
        pytest.skip("needs root to give files to another user (nobody)")


def _planted_library(tmp_path: Path, marker: Path) -> Path:
    """A shared library whose constructor writes `marker`: its code ran when `marker` exists."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.fail("no C compiler (cc): CI installs gcc")
    source = tmp_path / "planted.c"
    source.write_text(PLANTED_C % marker)
    library = tmp_path / "planted.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", library, source], check=True)
    return library


def _gate_path(cache: Path) -> Path:
    name = native.build_name()
    return cache / "hp_otel" / "native" / name / f"{name}.so"


@pytest.fixture
def fresh_gate(monkeypatch):
    """A gate not yet looked for, nor loaded, in this process (the real build's module stays out)."""
    monkeypatch.setenv(native.NATIVE_ENV, "auto")
    monkeypatch.setattr(native, "_loaded", {})
    native.forget()
    yield
    native.forget()


def _plant(cache: Path, library: Path, owner: int | None = None, folder_mode: int = 0o755) -> Path:
    path = _gate_path(cache)
    path.parent.mkdir(parents=True)
    for folder in (cache / "hp_otel", cache / "hp_otel" / "native", path.parent):
        os.chmod(folder, folder_mode)
        if owner is not None:
            os.chown(folder, owner, owner)
    shutil.copy(library, path)
    if owner is not None:
        os.chown(path, owner, owner)
    return path


def test_a_library_planted_by_another_user_never_runs(tmp_path, monkeypatch, fresh_gate, caplog):
    _root_or_skip()
    marker = tmp_path / "ran"
    library = _planted_library(tmp_path, marker)
    shared = tmp_path / "shared"  # a shared XDG_CACHE_HOME: anyone may create folders in it
    shared.mkdir(mode=0o1777)
    os.chmod(shared, 0o1777)
    planted = _plant(shared, library, owner=NOBODY)
    monkeypatch.setenv("XDG_CACHE_HOME", str(shared))
    with caplog.at_level(logging.INFO, logger="hp_otel"):
        assert native.gate() is None
    assert not marker.exists(), "the planted library's code ran in this process"
    said = [r for r in caplog.records if "native gate" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.WARNING
    assert f"uid {NOBODY}" in said[0].getMessage() and "not loaded" in said[0].getMessage()
    # build-native does not report it as the build: one line, exit 2, naming the file's owner
    assert main(["build-native"]) == 2
    assert planted.exists()  # left for the user to look at, not run


def test_build_native_refuses_another_users_file(tmp_path, monkeypatch, capsys):
    _root_or_skip()
    library = _planted_library(tmp_path, tmp_path / "ran")
    cache = tmp_path / "cache"
    cache.mkdir()
    _plant(cache, library, owner=NOBODY)
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    assert main(["build-native"]) == 2
    out = capsys.readouterr()
    assert "native gate:" not in out.out
    err = out.err.strip().splitlines()
    assert len(err) == 1 and f"uid {NOBODY}" in err[0] and "hp_otel" in err[0]


def test_a_group_writable_cache_folder_is_not_loaded(tmp_path, monkeypatch, fresh_gate, caplog):
    """Our own folder, but group-writable (umask 002): anyone in the group could replace the library."""
    marker = tmp_path / "ran"
    library = _planted_library(tmp_path, marker)
    cache = tmp_path / "cache"
    cache.mkdir()
    _plant(cache, library, folder_mode=0o775)
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    with caplog.at_level(logging.INFO, logger="hp_otel"):
        assert native.gate() is None
    assert not marker.exists()
    assert any("mode 775" in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)


def test_a_private_library_is_loaded_and_its_code_runs(tmp_path):
    """The referee for the cases above: the same library, private to this user, is dlopened (in a fresh
    process: one that loaded the real gate already has a library under that name)."""
    marker = tmp_path / "ran"
    library = _planted_library(tmp_path, marker)
    cache = tmp_path / "cache"
    cache.mkdir()
    _plant(cache, library)
    look = "from hp_otel.sources.pytorch import native; print(native.gate())"
    env = {**os.environ, "XDG_CACHE_HOME": str(cache), native.NATIVE_ENV: "auto"}
    done = subprocess.run([sys.executable, "-c", look], env=env, capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "None"  # it is no Python module: the import fails after dlopen
    assert marker.read_text() == "ran"


def test_a_relative_cache_home_is_refused(tmp_path, monkeypatch, fresh_gate, caplog, capsys):
    """`XDG_CACHE_HOME=cache` would load whatever the job's working directory holds."""
    marker = tmp_path / "ran"
    library = _planted_library(tmp_path, marker)
    _plant(tmp_path, library)  # ./hp_otel/native/... in the working directory
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", ".")
    with pytest.raises(ValueError, match=r"XDG_CACHE_HOME='\.' is a relative path"):
        cache_dir.cache_folder()
    with caplog.at_level(logging.INFO, logger="hp_otel"):
        assert native.gate() is None
    assert not marker.exists()
    assert any("XDG_CACHE_HOME" in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)
    assert main(["build-native"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "XDG_CACHE_HOME='.' is a relative path" in err[0]


class _FakeLoad:
    """`cpp_extension.load` writing the library in pieces, as the linker does, then maybe failing."""

    def __init__(self, final: Path, fail: bool) -> None:
        self.final, self.fail = final, fail
        self.final_seen_while_writing = False

    def __call__(self, name, sources, build_directory, **kwargs):
        out = Path(build_directory) / f"{name}.so"
        with open(out, "wb") as handle:
            handle.write(b"\x7fELF" + b"\0" * 4096)  # the first part of the file
            handle.flush()
            self.final_seen_while_writing = self.final.exists()
            if self.fail:
                raise RuntimeError("ld: killed")
            handle.write(b"\0" * 4096)


@pytest.mark.parametrize("fail", [True, False])
def test_the_build_reaches_its_name_whole(tmp_path, monkeypatch, fail):
    """A partial library at the final name kills training with SIGBUS when loaded: it is never there."""
    from torch.utils import cpp_extension

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    final = _gate_path(tmp_path)
    fake = _FakeLoad(final, fail)
    monkeypatch.setattr(cpp_extension, "load", fake)
    if fail:
        with pytest.raises(native.NativeBuildError, match="ld: killed"):
            native.build()
        assert not final.exists()
    else:
        assert native.build() == final
        assert final.stat().st_size == 4 + 2 * 4096
    assert not fake.final_seen_while_writing
    assert os.listdir(final.parent.parent) in ([], [final.parent.name])  # no scratch folder left
    for folder in (tmp_path / "hp_otel", final.parent.parent, final.parent):
        assert folder.stat().st_mode & 0o077 == 0  # made private
