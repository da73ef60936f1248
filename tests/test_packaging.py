"""The wheel users install holds the whole package: every subpackage, `py.typed`, and entry
points that name modules inside it (a re-layout that forgets a folder fails here, not at a
user's `import`); and only the product: the benchmarks and the tests stay in the repository."""

from __future__ import annotations

import configparser
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.torch_free  # needs no torch: not rerun on torch 2.14.1 (tests/support/markers.py)

ROOT = Path(__file__).resolve().parents[1]


def _build_wheel(tmp: Path) -> Path:
    """Built from a copy of what git would check out (tracked and new, not ignored), as on a clean
    machine: a build in the work tree reuses the editable install's egg-info file list."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split("\0")
    tree = tmp / "checkout"
    for name in filter(None, listed):
        if (ROOT / name).is_file():
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, tree / name)
    out = tmp / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out), str(tree)],
        check=True,
        capture_output=True,
    )
    (wheel,) = out.glob("hp_otel-*.whl")
    return wheel


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build_wheel(tmp_path_factory.mktemp("wheel"))


def test_wheel_holds_every_package_py_typed_and_its_entry_points(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        (entry_points_file,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        entry_points = configparser.ConfigParser()
        entry_points.read_string(archive.read(entry_points_file).decode())

    package = ROOT / "hp_otel"
    source_modules = {p.relative_to(ROOT).as_posix() for p in package.rglob("*.py") if "__pycache__" not in p.parts}
    assert source_modules - names == set(), "modules missing from the wheel"
    assert "hp_otel/py.typed" in names

    groups = {group: dict(entry_points[group]) for group in entry_points.sections()}
    plugin_groups = ("opentelemetry_instrumentor", "opentelemetry_resource_detector", "pytest11")
    assert set(groups) >= {"console_scripts", *plugin_groups}
    for group in plugin_groups:
        assert set(groups[group]) == {"hp_otel"}, group  # the names users and tools look up stay
    for group, entries in groups.items():
        for name, target in entries.items():
            module = target.split(":")[0].strip()
            assert module.replace(".", "/") + ".py" in names or module.replace(".", "/") + "/__init__.py" in names, (
                f"{group}:{name} names {module}, which is not in the wheel"
            )


def test_wheel_holds_the_product_only(wheel: Path) -> None:
    """hp_otel and its metadata: no `benchmarks/` (run from the repository), no tests, no bench module."""
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    tops = {name.split("/")[0] for name in names}
    assert {top for top in tops if not top.endswith(".dist-info")} == {"hp_otel"}, sorted(tops)
    assert [n for n in names if "bench" in n.rsplit("/", 1)[-1] or "/tests/" in n or "rank_files" in n] == []
    shipped_cli = {n.rsplit("/", 1)[-1] for n in names if n.startswith("hp_otel/cli/")}
    assert shipped_cli == {f"{m}.py" for m in _CLI_MODULES}, sorted(shipped_cli)


# What `hp-otel` runs (hp_otel/cli/__init__.py's COMMANDS) and the helpers its commands share.
_CLI_MODULES = (
    "__init__", "__main__", "arguments", "build_native", "demo", "diff", "pictures", "progress", "ranks",
    "render", "run_folders",
)  # fmt: skip
