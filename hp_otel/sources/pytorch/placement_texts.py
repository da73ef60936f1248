"""The text of a DTensor spec's placements (`Shard(dim=0);Replicate()`), cached by the placement objects.

A redistribute's specs and their placements tuples are mostly made afresh for every call, but the
placement objects in them are the same ones step after step (sharding strategies keep them). So the
text is cached per placement object, by identity: no Python `__hash__` per placement, as keying by
the tuple's value costs (`codec.placements_text`).  Identity is exact because torch's placements
are immutable values (the fields their text shows have no setter; `_MaskPartial` is a frozen
dataclass); a weak reference in the entry tells a cached object from a later one that reuses its
id, and the cache is bounded.  Anything that is not a torch placement takes the codec's path.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

from torch.distributed.tensor.placement_types import Placement

from hp_otel.spans import codec

SEPARATOR = codec.PLACEMENT_SEPARATOR
# id(placement) -> (a weak reference to it, its text)
_texts: dict[int, tuple[weakref.ref[Any], str]] = {}
_CACHE_LIMIT = 1024


def placements_text(placements: Sequence[Any]) -> str:
    """What `codec.placements_text(placements)` gives, found by the placement objects' identity."""
    if len(placements) == 1:  # a 1-D mesh: the common case, no join
        placement = placements[0]
        entry = _texts.get(id(placement))
        if entry is not None and entry[0]() is placement:
            return entry[1]
    texts = []
    for placement in placements:
        entry = _texts.get(id(placement))
        if entry is None or entry[0]() is not placement:
            entry = _cache(placement)
            if entry is None:
                return codec.placements_text(placements)
        texts.append(entry[1])
    return SEPARATOR.join(texts)


def _cache(placement: Any) -> tuple[weakref.ref[Any], str] | None:
    """Cache a torch placement's text; None for anything else (not known to be immutable, or no weak reference)."""
    if not isinstance(placement, Placement):
        return None
    try:
        ref = weakref.ref(placement)
    except TypeError:
        return None
    if len(_texts) >= _CACHE_LIMIT:
        _texts.clear()
    entry = _texts[id(placement)] = (ref, codec.placements_text((placement,)))
    return entry
