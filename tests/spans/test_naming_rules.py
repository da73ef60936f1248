"""Every attribute and metric name hp_otel can emit, checked against OpenTelemetry's naming rules.

The names are gathered, not listed: every name-valued constant of `hp_otel/spans/schema.py` (where
each name is defined once) and every `"hp.…"` literal anywhere else in the package. The rules
(OTel's "Attribute Naming" and metric naming guidance, as docs/reference/schema.md states them):
lower case, dot-separated components of letters, digits and `_`; no unit in the name (`_ns`, `_s`,
`_bytes`: the unit is the metric's unit, durations are seconds); `{object}.{property}`, not
`{object}_{property}` (`group.size`, not `group_size`); no attribute name that is also another's
namespace. The names not yet renamed are listed with why (KNOWN): the test fails on a new offender
and on a listed one that no longer offends, so the list only shrinks.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hp_otel.spans import schema

pytestmark = pytest.mark.torch_free

PACKAGE = Path(schema.__file__).resolve().parents[1]
_COMPONENT = re.compile(r"^[a-z][a-z0-9_]*$")
_UNIT_SUFFIXES = ("_ns", "_us", "_ms", "_s", "_seconds", "_bytes")
_PROPERTY_SUFFIXES = ("_size", "_id", "_name", "_count", "_type", "_kind")
_STANDARD = ("code.", "error.", "service.", "host.", "process.")
# Left for a release of their own, with why (docs/reference/schema.md, "Names").
_GROUP_TABLE = (
    "the group's names (hp.collective.group, group_id, group_size, group_members) move under hp.collective.group.* "
    "together, with the readers of both, in one change: `hp.collective.group` is itself a name today"
)
_SERIES = "a Prometheus series name: renamed with the dashboards and alert rules, not under them"
KNOWN = {
    "hp.collective.group_size": _GROUP_TABLE,
    "hp.collective.group_id": _GROUP_TABLE,
    "hp.world_size": _GROUP_TABLE + " (the world is the default group)",
    "hp.collective.bytes": _SERIES + " (hp_collective_bytes_total)",
}


def emitted_names() -> dict[str, str]:
    """{name: where it is defined}: schema's name constants, and `"hp.…"` literals elsewhere in the package."""
    names = {}
    for constant, value in vars(schema).items():
        if constant.isupper() and isinstance(value, str) and (value.startswith("hp.") or value.startswith(_STANDARD)):
            names[value] = f"schema.{constant}"
    for path in PACKAGE.rglob("*.py"):
        if path.name == "schema.py" and path.parent.name == "spans":
            continue
        for literal in re.findall(r"[\"'](hp\.[a-z0-9_.]+)[\"']", path.read_text()):
            names.setdefault(literal, str(path.relative_to(PACKAGE.parent)))
    return names


def offences(name: str, attribute_names: set[str]) -> list[str]:
    parts = name.split(".")
    found = [f"component {p!r} is not lower-case letters, digits and _" for p in parts if not _COMPONENT.match(p)]
    if len(parts) < 2:
        found.append("no namespace")
    last = parts[-1]
    found += [f"a unit in the name ({last!r})" for s in _UNIT_SUFFIXES if last.endswith(s) or last == s[1:]]
    found += [f"{{object}}_{{property}} ({last!r})" for s in _PROPERTY_SUFFIXES if last.endswith(s) and last != s[1:]]
    if name in attribute_names and any(other.startswith(name + ".") for other in attribute_names):
        found.append("also the namespace of another attribute")
    return found


def test_the_gathered_names_cover_spans_resources_metrics_and_the_standard_keys() -> None:
    names = emitted_names()
    assert len(names) > 70
    for expected in (schema.COLLECTIVE_OP, schema.RESOURCE_RANK, schema.METRIC_DURATION, schema.ERROR_TYPE):
        assert expected in names
    assert schema.STEP_ROOT_SCOPE_ATTRIBUTE in names and "hp.collective.busbw" in names  # literals outside schema


def test_every_name_follows_the_naming_rules() -> None:
    names = emitted_names()
    metrics = {v for k, v in vars(schema).items() if k.startswith("METRIC_") and isinstance(v, str) and "." in v}
    attributes = set(names) - metrics
    broken = {name: offences(name, attributes) for name in names}
    broken = {name: why for name, why in broken.items() if why}
    assert set(broken) - set(KNOWN) == set(), {n: (names[n], broken[n]) for n in set(broken) - set(KNOWN)}
    assert set(KNOWN) - set(broken) == set(), f"fixed, take them off KNOWN: {set(KNOWN) - set(broken)}"


def test_the_rules_refuse_what_they_should() -> None:
    for bad in ("hp.collective.call_ns", "hp.watchdog.waited_s", "hp.collective.match_id", "Hp.rank", "hp"):
        assert offences(bad, set()), bad
    assert offences("hp.step", {"hp.step", "hp.step.root"})  # an attribute that is also a namespace
    assert not offences("hp.collective.call.duration", set()) and not offences("hp.module.type", set())


def test_old_names_are_read_as_the_new_ones() -> None:
    old = {"hp.collective.call_ns": 1_500_000, "hp.collective.waited_ns": 2_000, "hp.collective.match_id": "ab"}
    old |= {"hp.collective.bw_bytes": 512, "hp.watchdog.waited_s": 1.5, "hp.collective.op": "all_reduce"}
    assert schema.normalise_attributes(old) == {
        schema.COLLECTIVE_CALL_DURATION: 0.0015,
        schema.COLLECTIVE_WAIT_DURATION: 2e-6,
        schema.COLLECTIVE_MATCH_ID: "ab",
        schema.COLLECTIVE_BW_BYTES: 512,
        schema.WATCHDOG_WAITED_S: 1.5,
        schema.COLLECTIVE_OP: "all_reduce",
    }
    new = {schema.COLLECTIVE_OP: "all_reduce"}
    assert schema.normalise_attributes(new) is new  # today's names: the same dict, nothing copied
    # every old name maps to a name the schema defines now
    assert {new for new, _ in schema.LEGACY_ATTRIBUTES.values()} <= set(emitted_names())
