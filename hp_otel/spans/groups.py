"""A process group described once: its id on every collective, its members in one table.

A collective span carries `hp_otel.collective.group.id` and `hp_otel.collective.group.size`; the
group's name, members (strided runs, `RankSet`) and mesh dimension are written once per
group and window: on the first span of that group the recorder builds in the window (so a
trace, a spans file or a backend query of one step holds them), and in the collectives
file's `groups` table.  Every reader resolves a span's group through `GroupTable`, which
also reads the files of earlier versions (members as an int array on every span).

The id is the same on every rank: a hash of the group's name and members, which every
rank of a group knows alike without talking to the others.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from hp_otel.common.rank_set import EMPTY, RankSet
from hp_otel.spans import schema

_ID_BYTES = 6  # 12 hex digits: collisions need ~16 million groups in one run


@functools.lru_cache(maxsize=1024)
def group_id(name: str, members: RankSet) -> str:
    """The id every rank derives for the group `name` of `members` (hex)."""
    digest = hashlib.sha256(f"hp_otel/group/{name}/{members}".encode()).digest()
    return digest[:_ID_BYTES].hex()


def mesh_dim_of(desc: str) -> str:
    """A DeviceMesh dimension's name from torch's group description (`mesh_tp` -> `tp`; "" if not a mesh's)."""
    return desc[5:] if desc.startswith("mesh_") else ""


@dataclass(frozen=True)
class Group:
    """One process group as the spans describe it."""

    id: str
    name: str
    members: RankSet
    mesh_dim: str = ""

    def attributes(self) -> dict[str, Any]:
        """Its description as span attributes (the first span of the group in a window carries them)."""
        attrs: dict[str, Any] = {schema.COLLECTIVE_GROUP: self.name, schema.COLLECTIVE_GROUP_MEMBERS: str(self.members)}
        if self.mesh_dim:
            attrs[schema.COLLECTIVE_GROUP_MESH_DIM] = self.mesh_dim
        return attrs

    def to_json(self) -> dict[str, Any]:
        """Its entry in a file's group table (keyed by its id)."""
        out: dict[str, Any] = {"name": self.name, "members": str(self.members)}
        if self.mesh_dim:
            out["mesh_dim"] = self.mesh_dim
        return out

    def label(self) -> str:
        """`tp [0-7]`: how a picture names the group's row."""
        members = str(self.members)
        return f"{self.name or '?'} [{members}]" if members else self.name or "?"


@functools.lru_cache(maxsize=1024)
def group(name: str, members: Any, mesh_dim: str = "") -> Group:
    """The group `name` of `members` (a RankSet, or a tuple of ranks) with its id."""
    ranks = RankSet.of(members)
    return Group(group_id(name, ranks), name, ranks, mesh_dim)


DESCRIPTION_KEYS = (schema.COLLECTIVE_GROUP, schema.COLLECTIVE_GROUP_MEMBERS, schema.COLLECTIVE_GROUP_MESH_DIM)


class GroupTable:
    """Groups by id, as one rank's spans or file describe them; resolves any collective span's group."""

    def __init__(self) -> None:
        self.by_id: dict[str, Group] = {}

    @classmethod
    def of(cls, attributes: Iterable[Mapping[str, Any]]) -> GroupTable:
        """The groups described by these spans' attributes."""
        table = cls()
        for attrs in attributes:
            table.note(attrs)
        return table

    @classmethod
    def from_json(cls, entries: Mapping[str, Any]) -> GroupTable:
        """A file's `groups` table ({id: {"name", "members", "mesh_dim"}}); ValueError if malformed."""
        if not isinstance(entries, Mapping):
            raise ValueError("its groups are not an object")
        table = cls()
        for gid, entry in entries.items():
            if not isinstance(entry, Mapping):
                raise ValueError(f"group {gid!r} is not an object")
            members = RankSet.parse(str(entry.get("members", "")))
            table.by_id[str(gid)] = Group(str(gid), str(entry.get("name", "")), members, str(entry.get("mesh_dim", "")))
        return table

    def to_json(self) -> dict[str, Any]:
        return {gid: g.to_json() for gid, g in self.by_id.items()}

    def note(self, attrs: Mapping[str, Any]) -> None:
        """Learn the group a span describes (no-op for a span that describes none)."""
        gid = attrs.get(schema.COLLECTIVE_GROUP_ID)
        members = attrs.get(schema.COLLECTIVE_GROUP_MEMBERS)
        if gid is None or members is None or gid in self.by_id:
            return
        self.by_id[str(gid)] = Group(
            str(gid),
            str(attrs.get(schema.COLLECTIVE_GROUP, "")),
            RankSet.parse(str(members)),
            str(attrs.get(schema.COLLECTIVE_GROUP_MESH_DIM, "")),
        )

    def group_of(self, attrs: Mapping[str, Any]) -> Group:
        """A collective span's group: by its id from the table, or (files of earlier versions) from
        the name and member list it carries.  An id the table lacks is named by the id itself."""
        gid = attrs.get(schema.COLLECTIVE_GROUP_ID)
        if gid is not None:
            found = self.by_id.get(str(gid))
            if found is not None:
                return found
            members = attrs.get(schema.COLLECTIVE_GROUP_MEMBERS)
            if members is not None:  # described on this very span (the table was not fed it)
                self.note(attrs)
                return self.by_id[str(gid)]
            return Group(str(gid), f"#{gid}", EMPTY)
        ranks = attrs.get(schema.COLLECTIVE_GROUP_RANKS, ())
        return group(str(attrs.get(schema.COLLECTIVE_GROUP, "")), tuple(int(r) for r in ranks))
