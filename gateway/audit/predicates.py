"""Predicates → formulas over dimensions: the auditor's reading of a WHERE clause.

A query's filter (and each GROUP BY cell's ``key = value``) is turned into a Boolean
formula whose leaves are *conditions on one dimension*:

- a declared column (``age > 30``, ``disease IN ('Crohn', 'Flu')``, ``zip IS NULL``);
- an expression compared with constants (``age / 10 = 3``): a dimension of its own,
  keyed by the expression's canonical SQL (it is not related to ``age`` — less precise,
  never wrong);
- anything else (LIKE, comparisons of two columns, CASE …): an opaque Boolean dimension
  keyed by its canonical SQL.

Only the query text and the public schema are read here.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Literal

from sqlglot import exp

from gateway.config import TableConfig

DimKind = Literal["ordered", "categorical", "opaque"]
CompareOp = Literal["eq", "lt", "le", "gt", "ge", "in", "isnull", "true"]


@dataclass(frozen=True)
class DimensionKey:
    """Names one dimension of the cell space.

    ``kind`` says how its domain is partitioned: ``ordered`` (numbers, dates: intervals
    between constants), ``categorical`` (text, booleans: the constants and "anything
    else") or ``opaque`` (a Boolean condition the auditor cannot decompose).
    ``column`` is set when the dimension is a declared column.
    """

    kind: DimKind
    sql: str
    column: str | None = None


@dataclass(frozen=True)
class Condition:
    """A leaf: ``dimension op values`` (``op == "true"`` for an opaque dimension)."""

    dimension: DimensionKey
    op: CompareOp
    values: tuple[Any, ...] = ()


@dataclass(frozen=True)
class Formula:
    """AND / OR / NOT over conditions; ``const`` is a Kleene truth value (0 F, 1 U, 2 T)."""

    op: Literal["and", "or", "not", "leaf", "const"]
    children: tuple[Formula, ...] = ()
    leaf: Condition | None = None
    const: int = 2

    def conditions(self) -> list[Condition]:
        if self.leaf is not None:
            return [self.leaf]
        return [c for ch in self.children for c in ch.conditions()]


TRUE = Formula("const", const=2)
FALSE = Formula("const", const=0)
NULL = Formula("const", const=1)


def conj(*parts: Formula) -> Formula:
    """The conjunction of formulas (TRUE when empty)."""
    kept = tuple(p for p in parts if p is not TRUE)
    if not kept:
        return TRUE
    return kept[0] if len(kept) == 1 else Formula("and", kept)


_FLIP = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le", "eq": "eq"}
_CMP: dict[type[exp.Expr], CompareOp] = {
    exp.EQ: "eq",
    exp.LT: "lt",
    exp.LTE: "le",
    exp.GT: "gt",
    exp.GTE: "ge",
}


class _NotConstant(Exception):
    pass


def constant_value(node: exp.Expr) -> Any:
    """The Python value of a literal (numbers as Fraction), or raise ``_NotConstant``."""
    if isinstance(node, exp.Paren):
        return constant_value(node.this)
    if isinstance(node, exp.Null):
        return None
    if isinstance(node, exp.Boolean):
        return bool(node.this)
    if isinstance(node, exp.Literal):
        if node.is_string:
            return str(node.this)
        try:
            return Fraction(str(node.this))
        except (ValueError, ZeroDivisionError):
            raise _NotConstant from None
    if isinstance(node, exp.Neg):
        v = constant_value(node.this)
        if isinstance(v, Fraction):
            return -v
        raise _NotConstant
    if isinstance(node, exp.Cast | exp.TryCast) and node.to.this in (
        exp.DataType.Type.DATE,
        exp.DataType.Type.DATETIME,
        exp.DataType.Type.TIMESTAMP,
    ):
        v = constant_value(node.this)
        if isinstance(v, str):
            return v
        raise _NotConstant
    if isinstance(node, exp.Date | exp.StrToDate | exp.TsOrDsToDate) and isinstance(
        node.this, exp.Literal
    ):
        return str(node.this.this)
    raise _NotConstant


def _date_number(v: Any) -> Fraction:
    if isinstance(v, dt.datetime):
        return Fraction(v.toordinal()) + Fraction(v.hour * 3600 + v.minute * 60 + v.second, 86400)
    if isinstance(v, dt.date):
        return Fraction(v.toordinal())
    if isinstance(v, str):
        try:
            return _date_number(dt.datetime.fromisoformat(v.strip()))
        except ValueError:
            raise _NotConstant from None
    raise _NotConstant


class FormulaBuilder:
    """Turns sqlglot predicates over one table into formulas (a pure pass over the AST)."""

    def __init__(self, table: TableConfig) -> None:
        self.table = table

    # -- dimensions -------------------------------------------------------------------

    def _column_dim(self, node: exp.Expr) -> DimensionKey | None:
        if isinstance(node, exp.Paren):
            return self._column_dim(node.this)
        if isinstance(node, exp.Column):
            name = node.name.lower()
            col = self.table.columns.get(name)
            if col is None:
                return None
            kind: DimKind = "ordered" if col.type in ("integer", "real", "date") else "categorical"
            return DimensionKey(kind, name, column=name)
        return None

    def _normalise(self, value: Any, dim: DimensionKey) -> Any:
        """A constant in the dimension's own terms, or raise ``_NotConstant``."""
        if value is None:
            return None
        col = self.table.columns.get(dim.column) if dim.column else None
        if dim.kind == "ordered":
            if col is not None and col.type == "date":
                return _date_number(value)
            if isinstance(value, bool) or not isinstance(value, Fraction | int | float):
                raise _NotConstant
            return Fraction(value)
        if col is not None and col.type == "boolean":
            if isinstance(value, bool):
                return value
            if isinstance(value, Fraction) and value in (0, 1):
                return bool(value)
            raise _NotConstant
        if isinstance(value, str):
            return value
        if isinstance(value, Fraction) and dim.column is None:
            return value
        raise _NotConstant

    def _expr_dim(self, node: exp.Expr, sample: Any) -> DimensionKey | None:
        """A dimension for a non-column expression over this table's columns."""
        if not any(True for _ in node.find_all(exp.Column)):
            return None
        if any(True for _ in node.find_all(exp.Subquery, exp.Select, exp.AggFunc)):
            return None
        kind: DimKind = "ordered" if isinstance(sample, Fraction) else "categorical"
        return DimensionKey(kind, _canonical(node))

    # -- formulas ---------------------------------------------------------------------

    def build(self, node: exp.Expr | None) -> Formula:
        """The formula of a predicate (TRUE for no predicate)."""
        if node is None:
            return TRUE
        return self._build(node)

    def _opaque(self, node: exp.Expr) -> Formula:
        dim = DimensionKey("opaque", _canonical(node))
        return Formula("leaf", leaf=Condition(dim, "true"))

    def _build(self, node: exp.Expr) -> Formula:
        if isinstance(node, exp.Paren):
            return self._build(node.this)
        if isinstance(node, exp.And):
            return Formula("and", (self._build(node.this), self._build(node.expression)))
        if isinstance(node, exp.Or):
            return Formula("or", (self._build(node.this), self._build(node.expression)))
        if isinstance(node, exp.Not):
            return Formula("not", (self._build(node.this),))
        if isinstance(node, exp.Boolean):
            return TRUE if node.this else FALSE
        if isinstance(node, exp.Null):
            return NULL
        dim = self._column_dim(node)
        if dim is not None and dim.column is not None:
            col = self.table.columns[dim.column]
            if col.type == "boolean":  # WHERE smoker means smoker = TRUE
                return Formula("leaf", leaf=Condition(dim, "in", (True,)))
        try:
            leaf = self._leaf(node)
        except _NotConstant:
            leaf = None
        return leaf if leaf is not None else self._opaque(node)

    def _leaf(self, node: exp.Expr) -> Formula | None:
        if isinstance(node, exp.NEQ):
            inner = self._leaf(exp.EQ(this=node.this, expression=node.expression))
            return None if inner is None else Formula("not", (inner,))
        if type(node) in _CMP:
            op = _CMP[type(node)]
            left, right = node.this, node.expression
            try:
                value = constant_value(right)
                subject = left
            except _NotConstant:
                value = constant_value(left)
                subject = right
                op = _FLIP[op]  # type: ignore[assignment]
            if value is None:  # comparing with NULL is never true
                return NULL
            return self._compare(subject, op, (value,))
        if isinstance(node, exp.Between):
            low = constant_value(node.args["low"])
            high = constant_value(node.args["high"])
            if low is None or high is None:
                return None
            a = self._compare(node.this, "ge", (low,))
            b = self._compare(node.this, "le", (high,))
            return None if a is None or b is None else Formula("and", (a, b))
        if isinstance(node, exp.In):
            if node.args.get("query") or not node.expressions:
                return None
            values = tuple(constant_value(v) for v in node.expressions)
            return self._compare(node.this, "in", values)
        if isinstance(node, exp.Is) and isinstance(node.expression, exp.Null):
            dim = self._column_dim(node.this)
            if dim is None or not self._nullable(dim):
                return None  # opaque: NULLs are modelled only where declared
            return Formula("leaf", leaf=Condition(dim, "isnull"))
        return None

    def _compare(self, subject: exp.Expr, op: CompareOp, values: tuple[Any, ...]) -> Formula | None:
        dim = self._column_dim(subject)
        sample = next((v for v in values if v is not None), None)
        if dim is None:
            if sample is None:
                return None
            dim = self._expr_dim(subject, sample)
            if dim is None:
                return None
        if dim.kind == "categorical" and op not in ("eq", "in"):
            return None  # order on text depends on collation: opaque
        norm = tuple(self._normalise(v, dim) for v in values)
        if op == "eq":
            op = "in"
        return Formula("leaf", leaf=Condition(dim, op, norm))

    def _nullable(self, dim: DimensionKey) -> bool:
        col = self.table.columns.get(dim.column) if dim.column else None
        return bool(getattr(col, "nullable", False))

    def group_condition(self, key: exp.Expr, value: Any) -> Formula:
        """The formula ``key = value`` of one GROUP BY cell (``value`` None: IS NULL)."""
        dim = self._column_dim(key)
        if value is None:
            if dim is not None and self._nullable(dim):
                return Formula("leaf", leaf=Condition(dim, "isnull"))
            return self._opaque(exp.Is(this=key.copy(), expression=exp.Null()))
        if (isinstance(value, float) and not isinstance(value, bool)) or (
            isinstance(value, int) and not isinstance(value, bool)
        ):
            value = Fraction(value)
        elif isinstance(value, dt.date):
            value = value.isoformat()
        try:
            if dim is None:
                dim = self._expr_dim(key, value)
                if dim is None:
                    raise _NotConstant
            return Formula("leaf", leaf=Condition(dim, "in", (self._normalise(value, dim),)))
        except _NotConstant:
            literal = exp.convert(value if not isinstance(value, Fraction) else float(value))
            return self._opaque(exp.EQ(this=key.copy(), expression=literal))


def _canonical(node: exp.Expr) -> str:
    return node.sql(normalize=True)


def formula_for_cell(
    builder: FormulaBuilder,
    where: exp.Expr | None,
    keys: tuple[exp.Expr, ...],
    values: tuple[Any, ...],
) -> Formula:
    """The region of one released cell: ``where ∧ key₁ = v₁ ∧ …``."""
    parts = [builder.build(where)]
    parts += [builder.group_condition(k, v) for k, v in zip(keys, values, strict=True)]
    return conj(*parts)


def builders(tables: Mapping[str, TableConfig]) -> dict[str, FormulaBuilder]:
    return {name: FormulaBuilder(t) for name, t in tables.items()}
