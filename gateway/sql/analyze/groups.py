"""Pass 3: GROUP BY keys, and which of their values the schema declares public.

A key's values are public when the admin declared them (``values:``), when the key is a
boolean, a bounded integer column (or a bounded integer column divided by a positive
constant) with at most ``MAX_PUBLIC_DOMAIN`` values, or a CASE whose results are all
literals. Otherwise ``domain`` is None and groups go through DP partition selection.
"""

from __future__ import annotations

import math
from typing import Any

from sqlglot import exp

from gateway.core.config import TableConfig
from gateway.core.plan import ValueType
from gateway.sql.analyze.resolve import infer_type

MAX_PUBLIC_DOMAIN = 1000


def public_domain(node: exp.Expr, table: TableConfig) -> tuple[Any, ...] | None:
    """The declared public values of a resolved group expression, in a stable order.

    A column that may hold NULL has NULL among its values (last): a GROUP BY over its
    declared values releases the NULL group too, so that no group of the table is left
    out of the answer (gateway/core/domain.py)."""
    domain = _public_domain(node, table)
    if domain is None or None in domain:
        return domain
    inner = node
    while isinstance(inner, exp.Paren):
        inner = inner.this
    if isinstance(inner, exp.Div | exp.IntDiv):
        inner = inner.this
        while isinstance(inner, exp.Paren):
            inner = inner.this
    if isinstance(inner, exp.Column) and table.columns[inner.name].may_be_null:
        return (*domain, None)
    return domain


def _public_domain(node: exp.Expr, table: TableConfig) -> tuple[Any, ...] | None:
    while isinstance(node, exp.Paren):
        node = node.this
    if isinstance(node, exp.Column):
        col = table.columns[node.name]
        if col.values is not None:
            return col.values
        if col.type == "boolean":
            return (False, True)
        if col.type == "integer" and col.bounded:
            lo, hi = math.ceil(col.lower or 0), math.floor(col.upper or 0)
            if hi - lo + 1 <= MAX_PUBLIC_DOMAIN:
                return tuple(range(lo, hi + 1))
        return None
    if isinstance(node, exp.Div | exp.IntDiv):
        inner = node.this
        while isinstance(inner, exp.Paren):
            inner = inner.this
        divisor = node.expression
        if (
            isinstance(inner, exp.Column)
            and isinstance(divisor, exp.Literal)
            and divisor.is_int
            and int(divisor.this) > 0
        ):
            col = table.columns[inner.name]
            if col.type == "integer" and col.bounded:
                d = int(divisor.this)
                lo, hi = (
                    _trunc_div(math.ceil(col.lower or 0), d),
                    _trunc_div(math.floor(col.upper or 0), d),
                )
                if hi - lo + 1 <= MAX_PUBLIC_DOMAIN:
                    return tuple(range(lo, hi + 1))
        return None
    if isinstance(node, exp.Case):
        results = [i.args["true"] for i in node.args.get("ifs") or []]
        default = node.args.get("default")
        values: list[Any] = []
        for r in results + ([default] if default is not None else []):
            value = literal_value(r)
            if value is _NOT_LITERAL:
                return None
            if value not in values:
                values.append(value)
        if default is None and None not in values:
            values.append(None)
        return tuple(values)
    return None


def narrow_domain(
    domain: tuple[Any, ...] | None, key: exp.Expr, where: exp.Expr | None
) -> tuple[Any, ...] | None:
    """Keep the declared values the WHERE clause itself admits for this key.

    Only top-level conjuncts ``key = literal`` and ``key IN (literals)`` are used: the
    released groups are then those the query's own text selects (public information),
    not every declared value with noise on an empty group.
    """
    if domain is None or where is None:
        return domain
    conjuncts = list(where.flatten()) if isinstance(where, exp.And) else [where]
    target = key.sql()
    allowed: set[Any] | None = None
    for c in conjuncts:
        while isinstance(c, exp.Paren):
            c = c.this
        values: list[Any] | None = None
        if isinstance(c, exp.EQ):
            for side, other in ((c.this, c.expression), (c.expression, c.this)):
                if side.sql() == target and is_literal(other):
                    values = [literal_value(other)]
        elif (
            isinstance(c, exp.In)
            and c.this.sql() == target
            and not c.args.get("query")
            and all(is_literal(e) for e in c.expressions)
        ):
            values = [literal_value(e) for e in c.expressions]
        if values is not None:
            allowed = set(values) if allowed is None else allowed & set(values)
    if allowed is None:
        return domain
    return tuple(v for v in domain if v in allowed)


def _trunc_div(a: int, d: int) -> int:
    """Integer division truncating toward zero, as the compiled SQL computes it."""
    q = abs(a) // d
    return q if a >= 0 else -q


_NOT_LITERAL = object()


def literal_value(node: exp.Expr) -> Any:
    """The Python value of a literal expression, or ``_NOT_LITERAL``."""
    while isinstance(node, exp.Paren):
        node = node.this
    if isinstance(node, exp.Null):
        return None
    if isinstance(node, exp.Boolean):
        return bool(node.this)
    if isinstance(node, exp.Neg) and isinstance(node.this, exp.Literal) and not node.this.is_string:
        inner = literal_value(node.this)
        return -inner
    if isinstance(node, exp.Literal):
        if node.is_string:
            return node.this
        text = node.this
        try:
            return int(text)
        except ValueError:
            return float(text)
    return _NOT_LITERAL


def is_literal(node: exp.Expr) -> bool:
    return literal_value(node) is not _NOT_LITERAL


def key_type(node: exp.Expr, table: TableConfig) -> ValueType:
    return infer_type(node, table)
