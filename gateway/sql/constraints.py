"""What a table's CHECK constraints let a column hold, read from their SQL text.

The compiled SQL keeps only the rows inside each column's declared domain (``row_filter``
in ``gateway/core/domain.py``). Where the database itself already guarantees that — the
column is NOT NULL in the catalogue and a CHECK constraint admits only declared values —
the filter on that column decides nothing, yet costs a predicate per row: on PostgreSQL
at 10M rows, the IN lists of four declared columns more than doubled an AVG. This module
reads CHECK constraints (schema metadata, never rows) into, per column, the set or
integer interval of values they admit, and says whether that lies inside a declared
value list.

Only forms whose meaning is certain are read: ``col IN (…)``, ``col = v``, PostgreSQL's
``col = ANY (ARRAY[…])``, comparisons of a column with a literal and ``BETWEEN``, joined
by AND. Anything else (OR, functions, NOT) adds nothing, which is safe: it can only
narrow what the constraint admits. An interval stands for its integers only where the
column's storage is integral (``integral``); SQLite stores 1.5 in an INTEGER column, so
its intervals are never read as integer sets.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError

from gateway.sql.analyze.groups import is_literal, literal_value

#: The largest integer interval turned into a set of values (a declared ``values:``
#: list is short; a wide interval is never inside one).
_MAX_INTERVAL = 10_000


@dataclass
class Admitted:
    """What the constraints admit for one column: a value set and/or bounds."""

    values: frozenset[Any] | None = None
    lower: float = -math.inf
    upper: float = math.inf

    def _in_bounds(self, v: Any) -> bool:
        if isinstance(v, bool) or not isinstance(v, int | float):
            return True  # bounds say nothing of text
        return self.lower <= v <= self.upper

    def within(self, declared: Iterable[Any], *, integral: bool) -> bool:
        """Whether every non-NULL value admitted is one of ``declared``."""
        allowed = set(declared)
        if self.values is not None:
            return all(v in allowed for v in self.values if self._in_bounds(v))
        if not integral or math.isinf(self.lower) or math.isinf(self.upper):
            return False
        lo, hi = math.ceil(self.lower), math.floor(self.upper)
        if hi - lo > _MAX_INTERVAL:
            return False
        return all(i in allowed for i in range(lo, hi + 1))


def admitted_by_checks(checks: Iterable[str], dialect: str) -> dict[str, Admitted]:
    """Per column (lower-case name), what the CHECK constraints ``checks`` (their SQL
    text, as the catalogue gives it) admit. Columns they say nothing about are absent."""
    out: dict[str, Admitted] = {}
    for text in checks:
        try:
            tree = sqlglot.parse_one(text, read=dialect)
        except (ParseError, TokenError, ValueError):
            continue
        for conjunct in _conjuncts(tree):
            _read(conjunct, out)
    return out


def _conjuncts(node: exp.Expr) -> list[exp.Expr]:
    while isinstance(node, exp.Paren):
        node = node.this
    if isinstance(node, exp.And):
        return _conjuncts(node.this) + _conjuncts(node.expression)
    return [node]


def _read(node: exp.Expr, out: dict[str, Admitted]) -> None:
    if (
        isinstance(node, exp.In)
        and isinstance(node.this, exp.Column)
        and not node.args.get("query")
    ):
        _restrict(out, node.this, _literals(node.expressions))
    elif isinstance(node, exp.EQ) and isinstance(node.this, exp.Column):
        other = node.expression
        if isinstance(other, exp.Any):
            inner = other.this.this if isinstance(other.this, exp.Paren) else other.this
            if isinstance(inner, exp.Array):
                _restrict(out, node.this, _literals(inner.expressions))
        else:
            _restrict(out, node.this, _literals([other]))
    elif isinstance(node, exp.Between) and isinstance(node.this, exp.Column):
        _bound(out, node.this, node.args.get("low"), lower=True)
        _bound(out, node.this, node.args.get("high"), lower=False)
    elif isinstance(node, exp.GTE | exp.GT | exp.LTE | exp.LT):
        left, right = node.this, node.expression
        lower = isinstance(node, exp.GTE | exp.GT)
        if isinstance(left, exp.Column):
            _bound(out, left, right, lower=lower, strict=isinstance(node, exp.GT | exp.LT))
        elif isinstance(right, exp.Column):  # 0 <= col
            _bound(out, right, left, lower=not lower, strict=isinstance(node, exp.GT | exp.LT))


def _literals(nodes: Iterable[exp.Expr]) -> frozenset[Any] | None:
    values = [_literal(n) for n in nodes]
    if any(v is _UNKNOWN for v in values):
        return None
    return frozenset(values)


def _literal(node: exp.Expr | None) -> Any:
    """A literal's Python value (through the casts PostgreSQL writes, ``0::bigint``), or
    ``_UNKNOWN``."""
    while isinstance(node, exp.Cast | exp.Paren):
        node = node.this
    if node is None or not is_literal(node):
        return _UNKNOWN
    return literal_value(node)


_UNKNOWN = object()


def _restrict(out: dict[str, Admitted], column: exp.Column, values: frozenset[Any] | None) -> None:
    if values is None:
        return
    a = out.setdefault(column.name.lower(), Admitted())
    a.values = values if a.values is None else a.values & values


def _bound(
    out: dict[str, Admitted],
    column: exp.Column,
    node: exp.Expr | None,
    *,
    lower: bool,
    strict: bool = False,
) -> None:
    value = _literal(node)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return
    a = out.setdefault(column.name.lower(), Admitted())
    if lower:
        bound = math.nextafter(value, math.inf) if strict else value
        a.lower = max(a.lower, bound)
    else:
        bound = math.nextafter(value, -math.inf) if strict else value
        a.upper = min(a.upper, bound)


def enforced_columns(
    declared: Mapping[str, tuple[tuple[Any, ...] | None, bool]],
    catalogue: Mapping[str, tuple[bool, bool, bool]],
    checks: Iterable[str],
    dialect: str,
) -> set[str]:
    """The declared columns whose whole domain the database enforces.

    ``declared``: column → (declared values or None, whether NULL is in the domain);
    ``catalogue``: column → (NOT NULL, integral storage, boolean storage);
    ``checks``: the table's CHECK constraints as SQL text.
    """
    admitted = admitted_by_checks(checks, dialect)
    out: set[str] = set()
    for name, (values, may_be_null) in declared.items():
        known = catalogue.get(name)
        if known is None:
            continue
        not_null, integral, boolean = known
        if not may_be_null and not not_null:
            continue
        if values is not None:
            if boolean and set(values) == {False, True}:
                pass  # a BOOLEAN column holds nothing else
            elif name not in admitted or not admitted[name].within(values, integral=integral):
                continue
        out.add(name)
    return out


def bounded_columns(
    bounds: Mapping[str, tuple[float, float]],
    catalogue: Mapping[str, tuple[bool, bool, bool]],
    checks: Iterable[str],
    dialect: str,
) -> set[str]:
    """The bounded integer columns the database keeps whole and inside their bounds.

    ``bounds``: column → declared (lower, upper) of an integer column; ``catalogue`` and
    ``checks`` as for ``enforced_columns``. A column qualifies when its storage is
    integral and its CHECK constraints admit only values in [lower, upper]: clamping it
    to its bounds then changes no row (NULL aside, which a SUM skips either way), so a
    SUM may read it as stored. Never on SQLite (no column is integral there).
    """
    admitted = admitted_by_checks(checks, dialect)
    out: set[str] = set()
    for name, (lower, upper) in bounds.items():
        known, a = catalogue.get(name), admitted.get(name)
        if known is None or a is None or not known[1]:
            continue
        if lower <= a.lower and a.upper <= upper:
            out.add(name)
    return out
