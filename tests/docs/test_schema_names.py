"""The migration table in docs/reference/schema.md is `schema.RENAMED`, row for row."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hp_otel.spans import schema

pytestmark = pytest.mark.torch_free

PAGE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "schema.md"


def test_the_migration_table_is_schema_renamed() -> None:
    rows = re.findall(r"^\| `(hp\.[a-z0-9_.]+)`[^|]* \| `(hp_otel\.[a-z0-9_.]+)`[^|]* \|$", PAGE.read_text(), re.M)
    assert dict(rows) == dict(schema.RENAMED)
    assert len(rows) == len(schema.RENAMED)  # each old name once


def test_the_page_names_the_prefix_and_says_why() -> None:
    text = PAGE.read_text()
    assert f"**Prefix: `{schema.PREFIX}`**" in text and "import name" in text
