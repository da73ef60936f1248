"""The `hp-otel` command: see the collectives of a distributed-tensor training step.

demo: a real 2-process CPU run; render: a table from a saved spans file; ranks: compare the
ranks' files (divergence, hang, stragglers); diff: compare two runs' communication;
plot / chrome-trace: pictures; build-native: the optional C++ gate
in front of the collective kernels.
"""

from __future__ import annotations

import argparse
import errno
import sys
from collections.abc import Callable, Sequence
from typing import NamedTuple

from hp_otel.cli import build_native, demo, diff, pictures, ranks, render
from hp_otel.cli.arguments import DefaultsFormatter
from hp_otel.common.safe_text import printable
from hp_otel.version import __version__


class Command(NamedTuple):
    """One subcommand: a row of `COMMANDS` is all it takes to add one."""

    name: str
    help: str  # its line in `hp-otel --help`
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]  # the exit status
    description: str | None = None  # its `--help` text above the arguments (None: none)
    deprecated_aliases: tuple[str, ...] = ()  # old names: still work, with a note on stderr


# --- the registry -------------------------------------------------------------------

COMMANDS: tuple[Command, ...] = (
    Command(
        "demo",
        "2-process CPU tensor-parallel step (MLP or transformer) under CommDebugMode",
        demo.add_arguments,
        demo.run,
        description="A real 2-process CPU (gloo) tensor-parallel forward+backward under CommDebugMode "
        "(a TP MLP, or a 2-layer TP + sequence-parallel transformer): prints rank 0's counts and tables, "
        "writes every rank's JSON dump and spans into --out.",
    ),
    Command(
        "render",
        "re-render the table and counts from a spans file (OTLP/JSON)",
        render.add_arguments,
        render.run,
        description="Rebuild the collective counts and the tracing table from a spans file "
        "(the demo's spans_rank<r>.json, or any OTLP/JSON file of hp_otel spans).",
    ),
    Command(
        "ranks",
        "compare per-rank spans files: first divergence, hang suspects, stragglers "
        "(exit 0 agree, 3 not, 4 ranks without a file, 2 bad input)",
        ranks.add_arguments,
        ranks.run,
        description="Lines up the ranks' collectives (spans files, JSON dumps or torch Flight Recorder dumps, one "
        "per rank) by group and sequence number: where they first diverge, which rank never reached a collective "
        "(a hang), who arrives last (stragglers), each rank's exposed communication, and the bandwidth per group, "
        "op and rank.",
    ),
    Command(
        "diff",
        "compare two runs' collectives per module, phase and op (exit 0 same, 3 different, 2 bad input)",
        diff.add_arguments,
        diff.run,
        description="Two runs side by side (two spans files, JSON dumps or snapshots, or two folders of per-rank "
        "files): per module, phase and collective op, the count and bytes before and after, what appeared and "
        "what vanished, then the totals.",
    ),
    Command(
        "plot",
        "draw one step across ranks as a timeline (SVG, or HTML that opens without a server)",
        pictures.add_plot_arguments,
        pictures.run_plot,
        description="A lane per rank on one time axis; modules, ops and redistributes as bars, collectives "
        "coloured by op, the same collective joined across ranks so skew shows. Hover a bar for details.",
    ),
    Command(
        "chrome-trace",
        "write spans as Chrome/Perfetto trace-event JSON, optionally merged with a torch.profiler trace",
        pictures.add_chrome_trace_arguments,
        pictures.run_chrome_trace,
        description="Open the result in ui.perfetto.dev or chrome://tracing. With --merge, hp_otel's tracks are "
        "added to a torch.profiler chrome trace of the same run (same clock), next to its CPU ops and kernels.",
        deprecated_aliases=("export",),
    ),
    Command(
        "build-native",
        "compile the optional native gate that passes unrecorded collective and DTensor op-hook calls on in C++ "
        "(once per machine and hp_otel release)",
        build_native.add_arguments,
        build_native.run,
        description="Builds hp_otel/sources/pytorch/native/passthrough.cpp with torch.utils.cpp_extension (a C++ "
        "compiler and ninja) into ~/.cache/hp_otel/native; windows then use it (HP_OTEL_TORCH_NATIVE=off: not). "
        "Exit 0 built or already there, 2 when it cannot be built (the message says what is missing).",
    ),
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hp-otel", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"hp-otel {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.add_arguments(
            sub.add_parser(
                command.name,
                aliases=list(command.deprecated_aliases),
                help=command.help
                + "".join(f" ({alias}: its old name, deprecated)" for alias in command.deprecated_aliases),
                description=command.description,
                formatter_class=DefaultsFormatter,
            )
        )
    return parser


# What a shell reports for a program that SIGPIPE ended (`hp-otel ranks --json ... | head`).
EXIT_BROKEN_PIPE = 128 + 13


def main(argv: Sequence[str] | None = None) -> int:
    name = "hp-otel"
    try:
        args = build_parser().parse_args(argv)
        command = next(c for c in COMMANDS if args.command in (c.name, *c.deprecated_aliases))
        name = f"hp-otel {command.name}"
        if args.command != command.name:
            print(printable(f"hp-otel: `{args.command}` is deprecated, use `hp-otel {command.name}`"), file=sys.stderr)
        status = command.run(args)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's flush at exit
        return status
    except BrokenPipeError:
        _quiet_stdout()
        return EXIT_BROKEN_PIPE
    except OSError as exc:
        line = _write_error(exc)
        if line is None:
            raise
        print(printable(f"{name}: {line}"), file=sys.stderr)
        return EXIT_BAD_OUTPUT


# A disk full, a quota or an I/O error while writing: one line, not a traceback.
EXIT_BAD_OUTPUT = 2
_WRITE_ERRORS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO, errno.EROFS})


def _write_error(exc: OSError) -> str | None:
    """The line to say for an output that could not be written, or None for any other error (raised).

    A file hp_otel writes names its argument already (`common/files.py`); a write to stdout
    names none: then stdout is silenced (its unwritten buffer would fail again at exit)."""
    if getattr(exc, "hp_otel_argument", None) is not None:
        return str(exc)
    if exc.errno in _WRITE_ERRORS and exc.filename is None:
        _quiet_stdout()
        return f"cannot write to stdout ({exc.strerror})"
    return None


def _quiet_stdout() -> None:
    """The reader went away (`| head`): stop quietly, as Unix tools do, with no traceback and no
    "Exception ignored" from the interpreter's final flush (Python's documented recipe: stdout to devnull)."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is not a file (captured): nothing left to flush into the pipe
        pass
