"""`hp-otel build-native`: compile the optional native gate in front of the collective kernels and
the DTensor op hook once (a new hp_otel release changes its source, so it is built again).

The gate (hp_otel/sources/pytorch/native) passes on, in C++, the collective calls no window records
and the op hook's calls that record nothing (attribute accesses, backward);
windows use the cached build from then on. Building is never done behind a user's back, so this
command is the one place it happens (CI runs it before the suite).
"""

from __future__ import annotations

import argparse
import sys


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--verbose", action="store_true", help="show the compiler's output")


def run(args: argparse.Namespace) -> int:
    from hp_otel.sources.pytorch import native

    try:
        path = native.build(verbose=args.verbose)
    except native.NativeBuildError as exc:
        print(f"hp-otel build-native: {exc}", file=sys.stderr)
        return 2
    print(f"native gate: {path}")
    return 0
