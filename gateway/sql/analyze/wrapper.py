"""Pass 2: what BI tools wrap around queries, and the probes they send on connect.

- ``SELECT … FROM (<aggregate query>) AS t [ORDER BY …] [LIMIT n]``: an outer query that
  only picks, renames, orders and cuts the inner query's columns is folded into the
  plan (every other outer query is a nested aggregation: ``gateway.sql.analyze.nested``).
- ``SELECT 1``, ``SELECT version()``, ``SELECT current_schema()`` …: answered from
  constants, free of charge, without touching protected data.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlglot import exp

import gateway
from gateway.core.errors import UnsupportedQuery
from gateway.core.plan import ProbePlan, ValueType
from gateway.sql.analyze.groups import is_literal, literal_value

_PROBE_FUNCTIONS: dict[str, tuple[Any, ValueType]] = {
    # the same text as over the PostgreSQL protocol (gateway.pgwire.catalog)
    "VERSION": (gateway.VERSION_TEXT, "text"),
    "CURRENT_VERSION": (gateway.VERSION_TEXT, "text"),
    "CURRENT_SCHEMA": ("main", "text"),
    "CURRENT_DATABASE": ("dpgate", "text"),
    "CURRENT_USER": ("analyst", "text"),
    "USER": ("analyst", "text"),
    "DATABASE": ("dpgate", "text"),
}


@dataclass(frozen=True)
class OuterQuery:
    """The BI wrapper's part: which inner columns, renamed how, ordered and limited."""

    columns: tuple[tuple[str, str], ...] | None  # (inner name, outer name); None for '*'
    order_by: tuple[exp.Ordered, ...]
    limit: int | None
    offset: int


def probe_plan(select: exp.Select) -> ProbePlan | None:
    """A ProbePlan when ``select`` reads no table and computes only constants."""
    if select.args.get("from") or select.args.get("from_") or select.args.get("joins"):
        return None
    if select.args.get("where") or select.args.get("group"):
        return None
    columns: list[tuple[str, ValueType]] = []
    row: list[Any] = []
    for item in select.expressions:
        node = item.unalias()
        name = item.alias_or_name if isinstance(item, exp.Alias) else node.sql()
        fname = "" if is_literal(node) else _function_name(node)
        if fname and not isinstance(item, exp.Alias):
            name = "version" if fname == "CURRENT_VERSION" else fname.lower()  # PostgreSQL's
        if is_literal(node):
            value = literal_value(node)
            vtype: ValueType = (
                "text"
                if isinstance(value, str)
                else "boolean"
                if isinstance(value, bool)
                else "integer"
                if isinstance(value, int)
                else "real"
            )
        else:
            if fname not in _PROBE_FUNCTIONS:
                return None
            value, vtype = _PROBE_FUNCTIONS[fname]
        columns.append((name, vtype))
        row.append(value)
    if not columns:
        return None
    return ProbePlan(columns=tuple(columns), rows=(tuple(row),))


def _function_name(node: exp.Expr) -> str:
    if isinstance(node, exp.Anonymous):
        return node.name.upper()
    if isinstance(node, exp.Func):
        return node.sql_name().upper()
    if isinstance(node, exp.Column) and not node.table:
        return node.name.upper()  # CURRENT_USER without parentheses
    return ""


def unwrap(select: exp.Select) -> tuple[exp.Select, OuterQuery | None]:
    """Split a BI wrapper into (inner aggregate query, outer projection) if it is one."""
    from_ = select.args.get("from") or select.args.get("from_")
    if from_ is None or not isinstance(from_.this, exp.Subquery):
        return select, None
    inner = from_.this.this
    if not isinstance(inner, exp.Select):
        raise UnsupportedQuery(
            "the subquery in FROM must be one aggregate SELECT", construct="subquery"
        )
    # ``nested.split_nested`` has taken every outer query that does more than this.
    columns: list[tuple[str, str]] | None = []
    for item in select.expressions:
        node = item.unalias()
        if isinstance(node, exp.Star) or (
            isinstance(node, exp.Column) and isinstance(node.this, exp.Star)
        ):
            columns = None
            break
        assert isinstance(node, exp.Column) and columns is not None
        columns.append((node.name, item.alias_or_name))
    order = tuple(select.args["order"].expressions) if select.args.get("order") else ()
    return inner, OuterQuery(
        columns=tuple(columns) if columns is not None else None,
        order_by=order,
        limit=limit_value(select, "limit"),
        offset=limit_value(select, "offset") or 0,
    )


def limit_value(select: exp.Select, clause: str) -> int | None:
    node = select.args.get(clause)
    if node is None:
        return None
    value = node.expression if isinstance(node, exp.Limit | exp.Offset) else node
    literal = literal_value(value) if isinstance(value, exp.Expr) else value
    if not isinstance(literal, int) or isinstance(literal, bool) or literal < 0:
        raise UnsupportedQuery(
            f"{clause.upper()} takes a non-negative whole number", construct=clause.upper()
        )
    return literal
