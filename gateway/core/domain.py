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
- **NULL exactly where declared**: a column with ``null_when`` keeps only the rows where
  it is NULL exactly when that condition on other columns holds (is TRUE), the condition
  read as every query reads those columns (bounded numbers clamped).

Rows that a ``values:`` list, a ``nullable: false`` or a ``null_when`` leaves out are left
out of *every* query on the table, ``COUNT(*)`` included: the table dpgate protects is
the rows inside the declared domain (``row_filter``). So a region "outside the domain"
never exists, in SQL or in the auditor; the auditor's pieces per column are the declared
values (or the bounded interval) plus NULL exactly when the column is nullable, and the
cells a ``null_when`` rules out hold no row (``gateway/audit/space.py``).
"""

from __future__ import annotations

from functools import cache
from typing import Any

import sqlglot
from sqlglot import exp

from gateway.core.config import ColumnConfig, TableConfig
from gateway.core.config_nulls import READ_DIALECT


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
    for name, col in table.columns.items():
        condition = null_condition(col)
        if condition is not None:
            parts.append(_null_exactly_when(name, _read_as_declared(condition, table)))
    if not parts:
        return None
    return exp.and_(*parts, copy=False) if len(parts) > 1 else parts[0]  # fresh nodes


def null_condition(col: ColumnConfig) -> exp.Expr | None:
    """The column's ``null_when`` condition (a fresh tree over bare column names), or
    None. The config has checked it (``gateway.core.config_nulls``)."""
    return None if col.null_when is None else _parsed(col.null_when).copy()


@cache
def _parsed(text: str) -> exp.Expr:
    return sqlglot.parse_one(text, read=READ_DIALECT)


def _null_exactly_when(name: str, condition: exp.Expr) -> exp.Expr:
    """``(1 where the condition is TRUE, else 0) = (1 where the column is NULL, else 0)``:
    the rows where the column is NULL exactly when the condition holds (a NULL
    condition does not hold). Integers, not booleans: every engine compares them."""

    def one_if(test: exp.Expr) -> exp.Expr:
        return exp.Case(
            ifs=[exp.If(this=test, true=exp.Literal.number(1))], default=exp.Literal.number(0)
        )

    is_null = exp.Is(this=exp.column(name, quoted=True), expression=exp.Null())
    return exp.EQ(this=one_if(exp.Paren(this=condition)), expression=one_if(is_null))


def _read_as_declared(condition: exp.Expr, table: TableConfig) -> exp.Expr:
    """``condition`` over quoted column names, each bounded number read clamped to its
    bounds where it is compared (as every query reads it: a value beyond a bound counts
    as the bound); ``IS NULL`` reads the column itself (clamping keeps NULL as NULL)."""

    def rewrite(node: exp.Expr) -> exp.Expr:
        if not isinstance(node, exp.Column):
            return node
        quoted = exp.column(node.name, quoted=True)
        col = table.columns[node.name]
        if isinstance(node.parent, exp.Is) or not clamped(col):
            return quoted
        assert col.lower is not None and col.upper is not None
        whole = col.type == "integer"  # whole-number bounds (the config checks)
        lower = _literal(int(col.lower) if whole else col.lower, col.type)
        upper = _literal(int(col.upper) if whole else col.upper, col.type)
        return exp.Case(
            ifs=[
                exp.If(this=exp.LT(this=quoted.copy(), expression=lower), true=lower.copy()),
                exp.If(this=exp.GT(this=quoted.copy(), expression=upper), true=upper.copy()),
            ],
            default=quoted,
        )

    return condition.transform(rewrite, copy=False)


def _literal(value: Any, ctype: str) -> exp.Expr:
    if ctype in ("text", "date"):
        return exp.Literal.string(str(value))
    if isinstance(value, bool):
        return exp.Boolean(this=value)
    if isinstance(value, int | float):
        literal = exp.Literal.number(repr(abs(value)) if isinstance(value, float) else abs(value))
        return exp.Neg(this=literal) if value < 0 else literal
    return exp.Literal.string(str(value))
