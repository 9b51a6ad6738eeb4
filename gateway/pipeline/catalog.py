"""The public catalogue: what the admin declared about the protected tables (names,
types, bounds, value domains, the conditions under which a column is NULL, privacy
units). Read from the config only, never from the
protected database (its statistics, such as row estimates, would leak)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.core.config import TableConfig


def public_schema(tables: Mapping[str, TableConfig]) -> dict[str, Any]:
    """``GET /v1/schema``: every protected table with its declared public facts."""
    out = []
    for t in tables.values():
        columns = []
        for c in t.columns.values():
            col: dict[str, Any] = {"name": c.name, "type": c.type, "nullable": c.may_be_null}
            if c.bounded:
                col["lower"], col["upper"] = c.lower, c.upper
            if c.values is not None:
                col["values"] = list(c.values)
            if c.null_when is not None:
                col["null_when"] = c.null_when  # NULL exactly when this holds
            if c.name.lower() == t.privacy_unit:
                col["privacy_unit"] = True
            columns.append(col)
        out.append(
            {
                "name": t.name,
                "schema": t.schema or "main",
                "privacy_unit": t.privacy_unit,
                "max_rows_per_unit": t.max_rows_per_unit if t.privacy_unit else 1,
                "max_groups_per_unit": t.max_groups_per_unit,
                "columns": columns,
                **_joins(t),
            }
        )
    return {"ok": True, "tables": out}


def _joins(t: TableConfig) -> dict[str, Any]:
    """What a table may be joined on (docs/design.md, "Joins"): a public table and its
    key; the references a query may join along."""
    out: dict[str, Any] = {}
    if t.public:
        out["public"], out["key"] = True, t.key
    if t.references:
        out["references"] = [
            {"column": r.column, "table": r.table, "target": r.target} for r in t.references
        ]
    return out
