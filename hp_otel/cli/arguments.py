"""What every subcommand's arguments share: the argument types and the help formatter."""

from __future__ import annotations

import argparse

# `hp-otel demo` and `hp-otel render` show the same table by default: the demo's, the level with everything.
DEFAULT_NOISE_LEVEL = 3
NOISE_LEVEL_HELP = (
    "table detail, 0-3: 0 collectives only; 1 + DTensor ops; 2 + module boundaries (forward, backward, "
    "recompute, optimizer); 3 + redistributes, dtype/bytes/reduce op/bandwidth on collectives, exposed time"
)


class DefaultsFormatter(argparse.HelpFormatter):
    """Help lines end with the default, where there is one to state."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "%(default)" in text or action.default in (None, "", False, argparse.SUPPRESS):
            return text
        return f"{text} (default: %(default)s)"


def noise_level(text: str) -> int:
    """`--noise-level`: checked by `hp_otel.render.levels.noise_level`, the one check every caller uses."""
    from hp_otel.render.levels import noise_level as check

    try:
        return check(int(text) if text.isdigit() else text, "noise level", allow_none=False).level
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError("must be a positive integer")
    return int(text)


def seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value < float("inf"):
        raise argparse.ArgumentTypeError("must be a number of seconds, 0 or more")
    return value


def port(text: str) -> int:
    if not text.isdigit() or int(text) > 65535:
        raise argparse.ArgumentTypeError("must be a port number 0-65535")
    return int(text)
