"""mkdocs hook: replace `<!-- cli-help -->` in a page by every `hp-otel` subcommand's `--help`.

Generated from the parser at build time, so the reference cannot drift from the command
(a new `Command` row in `hp_otel.cli.COMMANDS` appears here by itself).
"""

from __future__ import annotations

import argparse
import os
from typing import Any

MARKER = "<!-- cli-help -->"


def _help_text(width: int = 100) -> str:
    from hp_otel.cli import COMMANDS, build_parser

    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(width)  # argparse wraps to the terminal: the same text on every machine
    try:
        parser = build_parser()
        (subparsers,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parts = ["## `hp-otel`", "", "```text", parser.format_help().rstrip(), "```", ""]
        for command in COMMANDS:
            parts += [f"## `hp-otel {command.name}`", "", "```text"]
            parts += [subparsers.choices[command.name].format_help().rstrip(), "```", ""]
        return "\n".join(parts)
    finally:
        if previous is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = previous


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, _help_text())
