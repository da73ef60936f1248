"""Every metric is named once in `spans/schema.py`, made by one instrument in hp_otel (in whichever
module keeps its family: `record/instruments.py`, `record/exposure_metrics.py`,
`record/liveness.py`) with a unit, and listed in docs/reference/schema.md; no instrument is made
under a name the schema does not hold. Read from the source with `ast`: nothing is recorded."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import hp_otel
from hp_otel.spans import schema

pytestmark = pytest.mark.torch_free

PACKAGE = Path(hp_otel.__file__).parent
REFERENCE = PACKAGE.parent / "docs" / "reference" / "schema.md"
METRICS = {
    name: value
    for name, value in vars(schema).items()
    if name.startswith("METRIC_") and not name.endswith("_UNIT") and isinstance(value, str)
}


# The OTel Meter's instrument factories.
_METER_METHODS = frozenset(
    {
        "create_counter",
        "create_up_down_counter",
        "create_histogram",
        "create_gauge",
        "create_observable_counter",
        "create_observable_up_down_counter",
        "create_observable_gauge",
    }
)


def _instruments() -> list[tuple[str, str, bool]]:
    """(module path, the first argument's source, has a unit) of every `<meter>.create_*(...)` call."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in _METER_METHODS
                and node.args
            ):
                has_unit = any(k.arg == "unit" for k in node.keywords)
                found.append((str(path.relative_to(PACKAGE)), ast.unparse(node.args[0]), has_unit))
    return found


INSTRUMENTS = _instruments()


def test_the_walk_finds_the_instrument_modules() -> None:
    assert {path for path, _, _ in INSTRUMENTS} >= {
        "record/instruments.py",
        "record/exposure_metrics.py",
        "record/liveness.py",
    }


@pytest.mark.parametrize("name", sorted(METRICS))
def test_each_metric_has_one_instrument_with_a_unit_and_a_reference_row(name: str) -> None:
    made = [(path, has_unit) for path, arg, has_unit in INSTRUMENTS if arg.rpartition(".")[2] == name]
    assert len(made) == 1, f"{name}: made by {made or 'no instrument'}"
    assert made[0][1], f"{name}: its instrument has no unit"
    assert f"`{METRICS[name]}`" in REFERENCE.read_text(encoding="utf-8"), f"{METRICS[name]} not in {REFERENCE.name}"


def test_no_instrument_is_made_under_a_name_the_schema_does_not_hold() -> None:
    stray = [(path, arg) for path, arg, _ in INSTRUMENTS if arg.rpartition(".")[2] not in METRICS]
    assert stray == []
