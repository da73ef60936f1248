"""hp_otel's entry points as `pip install` writes them, made from this checkout's pyproject.toml.

The development venv may hold hp_otel installed from another checkout, whose metadata
lacks entry points added here. A `hp_otel-<version>.dist-info` folder put first on
PYTHONPATH makes `importlib.metadata` (and so the OpenTelemetry SDK and
`opentelemetry-instrument`) see exactly the entry points this pyproject.toml declares.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def write_dist_info(dest: Path) -> Path:
    """Write the dist-info into `dest` (a folder to put on sys.path) and return `dest`."""
    from hp_otel.version import __version__

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    groups = dict(project.get("entry-points", {}))
    groups["console_scripts"] = project.get("scripts", {})
    info = dest / f"hp_otel-{__version__}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: hp_otel\nVersion: {__version__}\n")
    lines = []
    for group, entries in groups.items():
        lines.append(f"[{group}]")
        lines.extend(f"{name} = {target}" for name, target in entries.items())
        lines.append("")
    (info / "entry_points.txt").write_text("\n".join(lines))
    return dest


def subprocess_env(dist_dir: Path, **extra: str) -> dict[str, str]:
    """This environment with the checkout and its metadata first on PYTHONPATH."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(dist_dir), str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(extra)
    return env
