"""Folders given to `hp-otel ranks`: the rank files a run writes there, recognised by their names.

Users keep a run's output as a folder (`collectives_dir=`, the demo's `hp_otel_out/`, torch's
Flight Recorder dump folder), so a folder stands for the files in it whose names the writers
give them. One kind is read per folder: the demo writes a JSON dump and a spans file per rank
side by side, and reading both would give every rank twice. The kinds are tried in the order of
`KINDS` (the most compact evidence first); the others found are named in a note, not read.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class FileKind:
    """Files one writer names alike: `what` they are, the name's pattern (group 1: the rank), an example."""

    what: str
    pattern: re.Pattern[str]
    example: str


KINDS: tuple[FileKind, ...] = (
    # the step loop's ring (`collectives_dir=`: spans/collectives_file.RING_NAME) and a window's
    # `write_collectives` as the docs and `python -m benchmarks --ranks` name it
    FileKind("collectives files", re.compile(r"collectives[-_]rank(\d+)\.json"), "collectives-rank<N>.json"),
    FileKind("spans files", re.compile(r"(?:.+_)?spans_rank(\d+)\.json"), "spans_rank<N>.json"),  # write_spans
    FileKind("JSON dumps", re.compile(r"(?:.+_)?comm_rank(\d+)\.json"), "comm_rank<N>.json"),  # generate_json_dump
    # torch's TORCH_FR_DUMP_TEMP_FILE prefix (default /tmp/nccl_trace_rank_) + rank, and the docs' own
    FileKind(
        "Flight Recorder dumps", re.compile(r"(?:nccl|fr)_trace_rank_(\d+)(?:\.pkl|\.json)?"), "nccl_trace_rank_<N>"
    ),
)


class FolderError(ValueError):
    """A folder with no file a run writes, or one that cannot be listed: one line naming it."""


def files_in(folder: Path) -> tuple[FileKind, list[Path], dict[str, int]]:
    """The first kind of `KINDS` the folder holds, its files in rank order, and how many of each other kind."""
    found: dict[FileKind, list[tuple[int, str]]] = {}
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                for kind in KINDS:
                    match = kind.pattern.fullmatch(entry.name)
                    if match is not None:
                        if entry.is_file():  # follows a symlink; a folder of that name is no file
                            found.setdefault(kind, []).append((int(match.group(1)), entry.name))
                        break
    except OSError as exc:
        raise FolderError(f"{folder}: cannot list this folder ({exc.strerror or exc})") from exc
    chosen = next((kind for kind in KINDS if kind in found), None)
    if chosen is None:
        names = ", ".join(kind.example for kind in KINDS)
        raise FolderError(f"{folder}: no rank file in this folder (looked for {names}); give the files themselves")
    paths = [folder / name for _, name in sorted(found[chosen])]
    others = {kind.what: len(found[kind]) for kind in KINDS if kind in found and kind is not chosen}
    return chosen, paths, others


def expand(paths: Sequence[Path], note: Callable[[str], None]) -> list[Path]:
    """Each folder of `paths` replaced by its rank files (`files_in`); files are kept as given.
    `note` hears, per folder holding several kinds, which one was read."""
    out: list[Path] = []
    for path in paths:
        if not path.is_dir():
            out.append(path)
            continue
        kind, files, others = files_in(path)
        out.extend(files)
        if others:
            also = ", ".join(f"{n:,} {what}" for what, n in others.items())
            read = f"read its {len(files):,} {kind.what}"
            note(f"{path}: {read}; it also holds {also} (give those as files to compare them)")
    return out
