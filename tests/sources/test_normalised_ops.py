"""Every collective a source can report carries a normalised op that `schema.NORMALISED_OPS` lists.

The op tables are found by walking every module of `hp_otel.sources` (a module-level
name -> op mapping, dict or read-only, with at least one normalised value is an op table), so a new engine's
table is checked without being named here; the explicit list proves the walk finds them.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping
from types import MappingProxyType

import pytest

import hp_otel.sources
from hp_otel.spans import schema


def _op_tables() -> dict[str, Mapping[str, str]]:
    tables = {}
    for module_info in pkgutil.walk_packages(hp_otel.sources.__path__, "hp_otel.sources."):
        module = importlib.import_module(module_info.name)
        for name, value in vars(module).items():
            if (
                isinstance(value, (dict, MappingProxyType))
                and value
                and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())
                and set(value.values()) & set(schema.NORMALISED_OPS)
            ):
                tables[f"{module.__name__}.{name}"] = value
    return tables


TABLES = _op_tables()


def test_the_walk_finds_every_engines_table() -> None:
    assert set(TABLES) >= {
        "hp_otel.sources.pytorch.collectives._NORMALISED",  # torch: aten/c10d/functional ops
        "hp_otel.sources.hyper_parallel.DIFFERENTIABLE_COLLECTIVES",
        "hp_otel.sources.hyper_parallel.PLATFORM_COLLECTIVES",
        "hp_otel.sources.hyper_parallel.TORCH_DISTRIBUTED_COLLECTIVES",
        "hp_otel.sources.mindspore.collectives.COLLECTIVES",
    }


@pytest.mark.parametrize("table", sorted(TABLES))
def test_every_op_of_the_table_is_a_normalised_op(table: str) -> None:
    unknown = {name: op for name, op in TABLES[table].items() if op not in schema.NORMALISED_OPS}
    assert not unknown, f"{table}: not in schema.NORMALISED_OPS: {unknown}"


def test_every_torch_collective_spec_of_this_build_reports_a_normalised_op() -> None:
    from hp_otel.sources.pytorch.collectives import _NORMALISED, collective_specs

    specs = collective_specs()  # every overload of the table's ops that this torch has
    assert specs and {spec.name for spec in specs.values()} <= set(_NORMALISED)
    assert {spec.normalised for spec in specs.values()} <= set(schema.NORMALISED_OPS)


def test_every_normalised_op_is_reported_by_some_engine() -> None:
    """The other direction: no op in the schema that nothing reports (a stale entry)."""
    reported = {op for table in TABLES.values() for op in table.values()}
    assert reported == set(schema.NORMALISED_OPS)


def test_every_collective_torchs_comm_debug_mode_counts_is_one_hp_otel_counts() -> None:
    """The drop-in's keys (`torch/op_keys.py`) name rows of the torch source's table: a collective
    torch counts and hp_otel does not would be missing from torch-shaped counts."""
    from hp_otel.sources.pytorch.collectives import _NORMALISED
    from hp_otel.torch import op_keys

    counted_by_torch = set(op_keys._NATIVE_TO_LEGACY) | set(op_keys._C10D_COUNTED)
    assert sorted(counted_by_torch - set(_NORMALISED)) == []
