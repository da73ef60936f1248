"""A kept span's attribute dict made from its names and values with the table sized at once.

The local store keeps a span's attributes as a tuple of names (one tuple shared by every span
with the same names) and a tuple of values; reading spans back makes a dict of each.
`dict(zip(names, values, strict=False))` takes every pair through the iterator protocol and grows the dict's
table as it fills.  A function made once per tuple of names, ``lambda v: {"a": v[0], "b": v[1]}``,
makes the same dict as a dict display of constant names: sized once, no pair objects
(docs/how-it-works/costs.md has the figures).  Making one compiles it: a tuple of names gets one
the second time a read asks (windows read step after step), once a process; names that are not
all `str`, or past the bounds, take `dict(zip(...))`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Maker = Callable[[tuple[Any, ...]], dict[str, Any]]

_MAX_NAMES = 64  # names a span: more take dict(zip(...))
_MAX_MAKERS = 512  # tuples of names given a function (a bound on the table and on compiling)
_makers: dict[tuple[Any, ...], Maker] = {}
_seen: set[tuple[Any, ...]] = set()  # asked for once already


def maker(names: tuple[Any, ...]) -> Maker:
    """The function making the attribute dict of `names` from a tuple of as many values.  A tuple of
    names is given its own function the second time it is asked for (a later read): a window read
    once compiles nothing."""
    made = _makers.get(names)
    if made is not None:
        return made
    if names not in _seen or len(names) > _MAX_NAMES or any(type(name) is not str for name in names):
        if len(_seen) < _MAX_MAKERS:
            _seen.add(names)
        return lambda values: dict(zip(names, values, strict=False))
    if len(_makers) >= _MAX_MAKERS:
        return lambda values: dict(zip(names, values, strict=False))
    # repr() of a str is a literal that reads back as that str: names are never read as code
    display = ", ".join(f"{name!r}: v[{index}]" for index, name in enumerate(names))
    made = _makers[names] = eval(f"lambda v: {{{display}}}", {"__builtins__": {}})
    return made
