"""Every attribute and metric name hp_otel can emit, checked against OpenTelemetry's naming rules.

The names are gathered, not listed: every name-valued constant of `hp_otel/spans/schema.py` (where
each name is defined once, under `schema.PREFIX`) and every `"hp_otel.…"` literal anywhere else in the
package; every instrument the package creates is named by a `schema.METRIC_*` constant. The rules
(OTel's "Attribute Naming" and metric naming guidance, as docs/reference/schema.md states them):
lower case, dot-separated components of letters, digits and `_`; the prefix `hp_otel.` or a semconv
key; no unit in the name (`_ns`, `_s`, `_bytes`: the unit is the metric's unit, durations are
seconds); `{object}.{property}`, not `{object}_{property}` (`group.size`, not `group_size`): a
component with `_` must be one of the words listed in SNAKE_CASE_WORDS; no attribute name that is
also another's namespace.
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
_STANDARD = ("code.", "error.", "service.", "host.", "process.")
# Components that are one word written in snake_case (semconv allows `_` within a component), not an
# `{object}_{property}` pair: each with why.
SNAKE_CASE_WORDS = {
    "in_flight": "a state (issued, not completed), not an object's property",
    "local_rank": "torch's own word (LOCAL_RANK), the rank within the node",
    "mesh_dim": "DeviceMesh's word for a mesh dimension's name (`mesh_dim_names`)",
    "split_sizes": "torch's argument names (`input_split_sizes`), Kineto's `In split size`",
    "is_dtensor": "a boolean predicate",
    "issued_by": "a relation (the module that issued it), not an object's property",
    "since_last_completion": "a gauge's phrase: seconds since the last completion",
    "oldest_in_flight": "the oldest call in flight (the object whose .age is measured)",
    "step_root": "the steps' root-span tracer (a scope attribute)",
}
# Components that are plural nouns or words of their own and end like a property
_PROPERTY_SUFFIXES = ("_size", "_id", "_name", "_count", "_type", "_kind", "_shape", "_shapes", "_op", "_ranks")


# "hp_otel.x" literals that are not telemetry: the package's own modules (import paths) and file formats.
_MODULES = {p.stem for p in PACKAGE.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()}
_NOT_TELEMETRY = {"hp_otel.comm_snapshot", "hp_otel.collectives"}


def emitted_names() -> dict[str, str]:
    """{name: where it is defined}: schema's name constants, and `"hp_otel.…"` literals elsewhere in the package."""
    names = {}
    for constant, value in vars(schema).items():
        if (
            constant.isupper()
            and constant != "PREFIX"
            and isinstance(value, str)
            and (value.startswith(schema.PREFIX) or value.startswith(_STANDARD))
        ):
            names[value] = f"schema.{constant}"
    for path in PACKAGE.rglob("*.py"):
        if path.name == "schema.py" and path.parent.name == "spans":
            continue
        for literal in re.findall(r"[\"'](hp_otel\.[a-z0-9_.]*[a-z0-9_])[\"']", path.read_text()):
            if literal.split(".")[1] not in _MODULES and literal not in _NOT_TELEMETRY:
                names.setdefault(literal, str(path.relative_to(PACKAGE.parent)))
    return names


def offences(name: str, attribute_names: set[str]) -> list[str]:
    parts = name.split(".")
    found = [f"component {p!r} is not lower-case letters, digits and _" for p in parts if not _COMPONENT.match(p)]
    if len(parts) < 2:
        found.append("no namespace")
    if not name.startswith(schema.PREFIX) and not name.startswith(_STANDARD):
        found.append(f"neither under {schema.PREFIX!r} nor a semconv key")
    last = parts[-1]
    found += [f"a unit in the name ({last!r})" for s in _UNIT_SUFFIXES if last.endswith(s) or last == s[1:]]
    for part in parts[1:]:
        if "_" in part and part not in SNAKE_CASE_WORDS:
            found.append(f"{{object}}_{{property}} ({part!r}): a dot is meant, or list it in SNAKE_CASE_WORDS")
        elif any(part.endswith(s) for s in _PROPERTY_SUFFIXES) and part not in SNAKE_CASE_WORDS:
            found.append(f"{{object}}_{{property}} ({part!r})")
    if name in attribute_names and any(other.startswith(name + ".") for other in attribute_names):
        found.append("also the namespace of another attribute")
    return sorted(set(found))


def test_the_gathered_names_cover_spans_resources_metrics_and_the_standard_keys() -> None:
    names = emitted_names()
    assert len(names) > 70
    for expected in (schema.COLLECTIVE_OP, schema.RESOURCE_RANK, schema.METRIC_DURATION, schema.ERROR_TYPE):
        assert expected in names
    assert schema.STEP_ROOT_SCOPE_ATTRIBUTE in names and schema.METRIC_IN_FLIGHT in names


def test_every_instrument_is_named_by_a_schema_constant() -> None:
    created = 0
    for path in PACKAGE.rglob("*.py"):
        for first in re.findall(r"\.create_[a-z_]+\(\s*([^,\s)]+)", path.read_text()):
            created += 1
            assert first.startswith("schema.METRIC_"), f"{path}: an instrument named {first}"
    assert created >= 8


def test_every_name_follows_the_naming_rules() -> None:
    names = emitted_names()
    metrics = {v for k, v in vars(schema).items() if k.startswith("METRIC_") and isinstance(v, str) and "." in v}
    attributes = set(names) - metrics
    broken = {name: offences(name, attributes) for name in names}
    assert {n: (names[n], why) for n, why in broken.items() if why} == {}


def test_no_old_prefix_is_left_in_the_package() -> None:
    """Only schema.py spells the old names (RENAMED, and the old files' group members)."""
    for path in PACKAGE.rglob("*.py"):
        if path.name == "schema.py" and path.parent.name == "spans":
            continue
        assert not re.findall(r"[\"']hp\.[a-z]", path.read_text()), path


def test_the_rules_refuse_what_they_should() -> None:
    for bad in (
        "hp_otel.collective.call_ns",
        "hp_otel.watchdog.waited_s",
        "hp_otel.collective.match_id",
        "hp_otel.collective.group_size",
        "hp_otel.collective.bytes",
        "Hp_otel.rank",
        "hp_otel",
        "hp.collective.op",
    ):
        assert offences(bad, set()), bad
    assert offences("hp_otel.step", {"hp_otel.step", "hp_otel.step.root"})  # an attribute that is also a namespace
    assert not offences("hp_otel.collective.call.duration", set()) and not offences("hp_otel.module.type", set())
    assert not offences("error.type", set())


def test_every_old_name_maps_to_a_name_the_schema_defines() -> None:
    names = emitted_names()
    assert set(schema.RENAMED.values()) <= set(names)
    assert all(old.startswith(schema.LEGACY_PREFIX) for old in schema.RENAMED)
    # every name of today has its old one (the prefix changed for all of them)
    today = {v for v in names if v.startswith(schema.PREFIX)} - {schema.COLLECTIVE_STATE}  # new in 0.2.0
    assert today <= set(schema.RENAMED.values()), today - set(schema.RENAMED.values())


def test_old_names_are_read_as_the_new_ones() -> None:
    old = {"hp.collective.call_ns": 1_500_000, "hp.collective.waited_ns": 2_000, "hp.collective.match_id": "ab"}
    old |= {"hp.collective.bw_bytes": 512, "hp.watchdog.waited_s": 1.5, "hp.collective.op": "all_reduce"}
    old |= {"hp.collective.group_size": 4, "hp.collective.backend": "nccl", "hp.collective.bytes": 64}
    assert schema.normalise_attributes(old) == {
        schema.COLLECTIVE_CALL_DURATION: 0.0015,
        schema.COLLECTIVE_WAIT_DURATION: 2e-6,
        schema.COLLECTIVE_MATCH_ID: "ab",
        schema.COLLECTIVE_BW_BYTES: 512,
        schema.WATCHDOG_WAITED_S: 1.5,
        schema.COLLECTIVE_OP: "all_reduce",
        schema.COLLECTIVE_GROUP_SIZE: 4,
        schema.COLLECTIVE_BACKEND: "nccl",
        schema.COLLECTIVE_BYTES: 64,
    }
    new = {schema.COLLECTIVE_OP: "all_reduce"}
    assert schema.normalise_attributes(new) is new  # today's names: the same dict, nothing copied
    # a new name already there wins over its old one
    assert schema.normalise_attributes({"hp.rank": 1, schema.RESOURCE_RANK: 2}) == {schema.RESOURCE_RANK: 2}
