"""Where installed packages really are: the one way hp_otel tells a library's file from the user's.

A path test on folder names (`.../torch/...`, `.../hp_otel/...`) misreads a checkout folder
that happens to carry such a name (a plain `git clone` of this repository is one): the
user's own files, and the venv inside it, would read as library files.  The package's
location, found by the import system, does not depend on what the folders above it are called.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterable


def package_dirs(packages: Iterable[str]) -> tuple[str, ...]:
    """The folders of the named top-level packages that are installed, or the file of a one-file
    module (`typing_extensions.py`), found without importing them; each as its real and its
    absolute path (a symlinked venv or checkout names its files either way)."""
    found: list[str] = []
    for name in packages:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        if spec is None:
            continue
        if spec.submodule_search_locations:
            paths = [os.path.join(location, "") for location in spec.submodule_search_locations]
        elif spec.origin and os.path.isfile(spec.origin):
            paths = [spec.origin]
        else:
            continue
        for path in paths:
            for variant in (os.path.realpath(path), os.path.abspath(path)):
                variant = os.path.join(variant, "") if path.endswith(os.sep) else variant
                if variant not in found:
                    found.append(variant)
    return tuple(found)
