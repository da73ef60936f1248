"""Names in text meant for a terminal, shown visibly instead of acted on.

Module, op and group names come from users' models and from spans files others send: an
`ESC ] 0; ... BEL` retitles the terminal, `ESC [ 2J` clears it, a newline forges a table
line, U+202E turns the rest of a line around. `printable()` writes each such character as
an escape (`\\x1b`, `\\n`, `\\u202e`); every other character, CJK, accents and emoji
included, stays as it is. The same text is safe in XML once `<&>"'` are escaped.
"""

from __future__ import annotations

import re
from types import MappingProxyType

# C0 and C1 controls and DEL; the bidi embeddings, overrides, isolates and marks; the line and
# paragraph separators; lone surrogates (JSON can spell them) and the non-characters U+FFFE/FFFF.
_UNSAFE = re.compile(
    "[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff\ufffe\uffff]"
)
_NAMED = MappingProxyType({"\n": "\\n", "\r": "\\r", "\t": "\\t"})


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    code = ord(char)
    return _NAMED.get(char) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def printable(text: str) -> str:
    """`text` with control characters and bidi overrides written as escapes; the rest unchanged."""
    return _UNSAFE.sub(_escape, text)
