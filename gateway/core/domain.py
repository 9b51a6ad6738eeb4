"""The domain model: which values a declared column holds, as the compiled SQL reads it.

One model, shared by the compiler (``gateway/sql/compile.py``, ``gateway/sql/portable.py``) and
the auditor (``gateway/audit/``), so that the auditor's logical cell space is exactly what
the compiled SQL computes (docs/design.md, invariant 10: one domain model). dpgate
reads a protected table as:

- **bounded numbers clamped**: an integer or real column with ``lower``/``upper`` reads as
  ``clamp(x, lower, upper)`` everywhere — in WHERE, GROUP BY and every aggregate. A value
  beyond a bound counts as the bound (``income > 150000`` counts an income of 10^7; ``age
  >= -1`` is everyone): no row lies outside the declared bounds.
- **declared values kept**: a column with ``values:`` keeps only the rows holding one of
  them; a boolean column only TRUE and FALSE.
- **NULL only where nullable**: a column declared (or, by default, catalogued) ``nullable:
  false`` keeps only the rows where it is not NULL.

Rows that a ``values:`` list or a ``nullable: false`` leaves out are left out of *every*
query on the table, ``COUNT(*)`` included: the table dpgate protects is the rows inside
the declared domain (``row_filter``). So a region "outside the domain" never exists, in
SQL or in the auditor; the auditor's pieces per column are the declared values (or the
bounded interval) plus NULL exactly when the column is nullable.
"""

from __future__ import annotations

from typing import Any

from sqlglot import exp

from gateway.core.config import ColumnConfig, TableConfig


def clamped(col: ColumnConfig) -> bool:
    """Whether the compiled SQL reads the column clamped to its declared bounds."""
    return col.numeric and col.bounded


def declared_values(col: ColumnConfig) -> tuple[Any, ...] | None:
    """The values a column is restricted to (booleans: FALSE, TRUE), or None (open)."""
    if col.type == "boolean":
        return (False, True)
    return col.values


def row_filter(table: TableConfig) -> exp.Expr | None:
    """The condition every row of ``table`` must meet to be part of any query (None:
    every row is). Built over quoted column names; the same for every dialect. A column
    whose domain the database enforces (``enforced``, read from its catalogue) needs no
    condition: every row already meets it."""
    parts: list[exp.Expr] = []
    for name, col in table.columns.items():
        if col.enforced:  # the database keeps it in its domain (gateway/sql/constraints.py)
            continue
        column = exp.column(name, quoted=True)
        values = declared_values(col)
        if values is not None:
            member: exp.Expr = exp.In(
                this=column, expressions=[_literal(v, col.type) for v in values]
            )
            if col.may_be_null:
                member = exp.Paren(
                    this=exp.or_(
                        member, exp.Is(this=column.copy(), expression=exp.Null()), copy=False
                    )
                )
            parts.append(member)
        elif not col.may_be_null:
            parts.append(exp.Not(this=exp.Is(this=column, expression=exp.Null())))
    if not parts:
        return None
    return exp.and_(*parts, copy=False) if len(parts) > 1 else parts[0]  # fresh nodes


def _literal(value: Any, ctype: str) -> exp.Expr:
    if ctype in ("text", "date"):
        return exp.Literal.string(str(value))
    if isinstance(value, bool):
        return exp.Boolean(this=value)
    if isinstance(value, int | float):
        literal = exp.Literal.number(repr(abs(value)) if isinstance(value, float) else abs(value))
        return exp.Neg(this=literal) if value < 0 else literal
    return exp.Literal.string(str(value))
