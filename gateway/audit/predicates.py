"""Predicates → formulas over dimensions: the auditor's reading of a WHERE clause.

A query's filter (and each GROUP BY cell's ``key = value``) becomes a Boolean formula
(Kleene three-valued, like SQL) whose leaves are conditions on one *dimension*. Every
condition that can be is normalised onto the dimension of the column it reads, so that
rewrites of one condition are one region (``normalise``):

- a declared column compared with constants (``age > 30``, ``disease IN (…)``,
  ``BETWEEN``, ``IS NULL``), after identities are stripped (``zip || ''``, ``age + 0``,
  ``age * 1``, a cast to the same type, COALESCE of a column that is never NULL);
- ``x LIKE 'c'`` without wildcards, as ``x = 'c'`` (where no backend's case rules matter);
- CASE / IF, ``IS TRUE`` / ``IS FALSE``: expanded into their conditions;
- any other condition on *one* column whose domain can be enumerated (declared values,
  booleans, bounded integers, or the constants it names plus "any other text"): evaluated
  on every value (``evaluate``) — ``LOWER(city) = 'eger'``, ``age / 10 = 3`` (that is
  30 ≤ age ≤ 39), ``income / 1000 = 24`` (by bisection, the expression being monotone).

What cannot be normalised — arithmetic on reals, text order, a function of an open text
column (``LENGTH(zip) = 4``), a condition relating two columns — becomes a dimension of
its own (an expression compared with constants, or an opaque yes / no / unknown
condition) that *claims* the columns it reads. The auditor never treats such a dimension
as unrelated to another one on the same column: a query that would use two dimensions on
one column is refused (``Auditor``). Only the query text and the public schema are read.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import Any

from sqlglot import exp

from gateway.audit.formulas import (
    FALSE,
    NULL,
    TRUE,
    Condition,
    DimensionKey,
    DimKind,
    DomainConstraint,
    Formula,
    conj,
    disj,
    is_true,
    leaf,
    neg,
)
from gateway.audit.normalise import Normaliser, may_be_null
from gateway.core.config import TableConfig
from gateway.core.domain import null_condition
from gateway.core.joins import PublicLookup

__all__ = [
    "FALSE",
    "NULL",
    "TRUE",
    "Condition",
    "DimensionKey",
    "Formula",
    "FormulaBuilder",
    "conj",
    "constant_value",
]
CACHE_SIZE = 256
"""Formulas remembered per builder, keyed by AST node. An entry keeps its node alive —
and through the node's parents the whole query's AST (a few kB) — so the cache serves
the pre-audit, post-audit and ``remember`` of the plans in flight and the planner's
recent plans, not every plan ever audited: at 4096 it held up to ~4,000 dead ASTs per
table and kind, tens of MB per worker (issue 36)."""
LEAF_CACHE_SIZE = 1024
"""Leaf formulas remembered per builder, keyed by the leaf's shape (``_shape``): plain
tuples of node types and values, which keep no AST alive (a few hundred bytes each)."""

_FLIP = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le", "eq": "eq"}
_CMP: dict[type[exp.Expr], str] = {
    exp.EQ: "eq",
    exp.LT: "lt",
    exp.LTE: "le",
    exp.GT: "gt",
    exp.GTE: "ge",
}


class NotConstant(Exception):
    pass


def constant_value(node: exp.Expr) -> Any:
    """The Python value of a literal (numbers as Fraction), or raise ``NotConstant``."""
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
            raise NotConstant from None
    if isinstance(node, exp.Neg):
        v = constant_value(node.this)
        if isinstance(v, Fraction):
            return -v
        raise NotConstant
    if isinstance(node, exp.Cast | exp.TryCast) and node.to.this in (
        exp.DataType.Type.DATE,
        exp.DataType.Type.DATETIME,
        exp.DataType.Type.TIMESTAMP,
    ):
        v = constant_value(node.this)
        if isinstance(v, str):
            return v
        raise NotConstant
    if isinstance(node, exp.Date | exp.StrToDate | exp.TsOrDsToDate) and isinstance(
        node.this, exp.Literal
    ):
        return str(node.this.this)
    raise NotConstant


def date_number(v: Any) -> Fraction:
    if isinstance(v, dt.datetime):
        return Fraction(v.toordinal()) + Fraction(v.hour * 3600 + v.minute * 60 + v.second, 86400)
    if isinstance(v, dt.date):
        return Fraction(v.toordinal())
    if isinstance(v, str):
        try:
            return date_number(dt.datetime.fromisoformat(v.strip()))
        except ValueError:
            raise NotConstant from None
    raise NotConstant


class FormulaBuilder:
    """Turns sqlglot predicates over one table into formulas (a pure pass over the AST)."""

    def __init__(
        self, table: TableConfig, lookups: Mapping[str, tuple[str, PublicLookup, str]] | None = None
    ) -> None:
        self.table = table
        # public lookups' columns read through their rows (gateway/core/joins.py,
        # ``translations``): a condition on one is a condition on the key it is joined on
        self.lookups = dict(lookups or {})
        self._normaliser = Normaliser(table, self)
        self._cache: dict[int, tuple[exp.Expr, Formula]] = {}
        self._cells: dict[tuple[str, Any], Formula] = {}
        self._keys: dict[int, tuple[exp.Expr, str]] = {}
        self._counted: dict[int, tuple[exp.Expr, Formula]] = {}
        self._leaves: dict[tuple[Any, ...], Formula] = {}

    # -- dimensions -------------------------------------------------------------------

    def column_dim(self, name: str) -> DimensionKey:
        col = self.table.columns[name]
        kind: DimKind = "ordered" if col.type in ("integer", "real", "date") else "categorical"
        return DimensionKey(
            kind, name, column=name, columns=self.claims(name), nullable=col.may_be_null
        )

    def claims(self, name: str) -> frozenset[str]:
        """The columns a dimension on column ``name`` claims: itself, and the column a
        joined table's column is a function of (gateway/core/joins.py), so that the two are
        never taken for independent dimensions."""
        col = self.table.columns.get(name)
        if col is None or col.determined_by is None:
            return frozenset({name})
        return frozenset({name}) | self.claims(col.determined_by)

    def bare_column(self, node: exp.Expr) -> DimensionKey | None:
        while isinstance(node, exp.Paren):
            node = node.this
        name = node.name.lower() if isinstance(node, exp.Column) else ""
        if name in self.table.columns and name not in self.lookups:
            return self.column_dim(name)
        return None

    def normalise_value(self, value: Any, dim: DimensionKey) -> Any:
        """A constant in the dimension's own terms, or raise ``NotConstant``."""
        if value is None:
            return None
        col = self.table.columns.get(dim.column) if dim.column else None
        if dim.kind == "ordered":
            if col is not None and col.type == "date":
                return date_number(value)
            if isinstance(value, bool) or not isinstance(value, Fraction | int | float):
                raise NotConstant
            return Fraction(value)
        if col is not None and col.type == "boolean":
            if isinstance(value, bool):
                return value
            raise NotConstant
        if isinstance(value, str):
            return value
        if isinstance(value, Fraction) and dim.column is None:
            return value
        raise NotConstant

    def expression_dim(self, node: exp.Expr, sample: Any) -> DimensionKey:
        """A dimension for an expression compared with constants (claims its columns)."""
        kind: DimKind = "ordered" if isinstance(sample, Fraction) else "categorical"
        return DimensionKey(
            kind,
            canonical(node),
            columns=self.claims_of(node),
            nullable=may_be_null(node, self.table),
        )

    def opaque(self, node: exp.Expr) -> Formula:
        dim = DimensionKey(
            "opaque",
            canonical(node),
            columns=self.claims_of(node),
            nullable=may_be_null(node, self.table),
        )
        return leaf(dim, "true")

    def columns_of(self, node: exp.Expr) -> frozenset[str]:
        return frozenset(c.name.lower() for c in node.find_all(exp.Column))

    def claims_of(self, node: exp.Expr) -> frozenset[str]:
        """The columns an expression's own dimension claims (``claims`` of each)."""
        return frozenset().union(*(self.claims(c) for c in self.columns_of(node)))

    # -- formulas ---------------------------------------------------------------------

    def build(self, node: exp.Expr | None) -> Formula:
        """The formula of a predicate (TRUE for no predicate)."""
        if node is None:
            return TRUE
        hit = self._cache.get(id(node))
        if hit is not None and hit[0] is node:
            return hit[1]
        formula = self.formula(node)
        if len(self._cache) >= CACHE_SIZE:
            self._cache.clear()
        self._cache[id(node)] = (node, formula)  # keeps ``node`` alive: ids stay unique
        return formula

    def formula(self, node: exp.Expr) -> Formula:
        """The formula of a (sub-)predicate: structure first, then one leaf."""
        if isinstance(node, exp.Paren):
            return self.formula(node.this)
        if isinstance(node, exp.And):
            return conj(self.formula(node.this), self.formula(node.expression))
        if isinstance(node, exp.Or):
            return disj(self.formula(node.this), self.formula(node.expression))
        if isinstance(node, exp.Not):
            return neg(self.formula(node.this))
        if isinstance(node, exp.Boolean):
            return TRUE if node.this else FALSE
        if isinstance(node, exp.Null):
            return NULL
        if isinstance(node, exp.Case | exp.If):
            return self.branches(node, self.formula)
        if isinstance(node, exp.Is) and isinstance(node.expression, exp.Boolean):
            inner = self.formula(node.this)
            return is_true(inner if node.expression.this else neg(inner))
        compared = self._compared_branches(node)
        if compared is not None:
            return compared
        return self._leaf(node)

    def _leaf(self, node: exp.Expr) -> Formula:
        """The normaliser's reading of one leaf, remembered by the leaf's shape: a pure
        function of the node's structure and the table's declarations, so the same
        condition in another query's AST (a new object each time: ``build``'s cache
        misses it) is read once. A leaf that cannot be read raises each time."""
        key = _shape(node)
        try:
            hit = self._leaves.get(key)
        except TypeError:  # an argument sqlglot keeps unhashable: read it each time
            return self._normaliser.leaf(node)
        if hit is None:
            hit = self._normaliser.leaf(node)
            if len(self._leaves) >= LEAF_CACHE_SIZE:
                self._leaves.clear()
            self._leaves[key] = hit
        return hit

    def branches(self, node: exp.Case | exp.If, result: Callable[[exp.Expr], Formula]) -> Formula:
        """A CASE (or IF) as the conditions of its branches: branch i is taken where its
        condition is TRUE and no earlier one is; ``result`` gives each branch's formula."""
        if isinstance(node, exp.If):
            pairs = [(node.this, node.args["true"])]
            default = node.args.get("false")
        else:
            if node.this is not None:
                raise ValueError("simple CASE is not resolved")  # the analyzer refuses it
            pairs = [(b.this, b.args["true"]) for b in node.args.get("ifs") or []]
            default = node.args.get("default")
        taken: list[Formula] = []
        out: list[Formula] = []
        for cond, value in pairs:
            c = is_true(self.formula(cond))
            out.append(conj(*(neg(t) for t in taken), c, result(value)))
            taken.append(c)
        rest = result(default) if default is not None else NULL
        out.append(conj(*(neg(t) for t in taken), rest))
        return disj(*out)

    def _compared_branches(self, node: exp.Expr) -> Formula | None:
        """``CASE … END op constant`` (either side) as the CASE's branches."""
        if type(node) not in _CMP and not isinstance(node, exp.NEQ):
            return None
        for side, other in ((node.this, node.expression), (node.expression, node.this)):
            inner = side
            while isinstance(inner, exp.Paren):
                inner = inner.this
            if not isinstance(inner, exp.Case | exp.If) or inner.find(exp.Column) is None:
                continue
            if isinstance(inner, exp.Case) and inner.this is not None:
                return None
            if other.find(exp.Column) is not None:
                return None
            left = side is node.this

            def result(value: exp.Expr, other: exp.Expr = other, left: bool = left) -> Formula:
                a, b = (value, other) if left else (other, value)
                return self.formula(type(node)(this=a.copy(), expression=b.copy()))

            return self.branches(inner, result)
        return None

    def domain_constraints(self) -> tuple[DomainConstraint, ...]:
        """The table's declared ``null_when`` conditions, each as the rows it keeps: the
        column IS NULL exactly where the condition IS TRUE (a NULL condition does not
        hold), as the compiled SQL's domain filter reads it (``gateway/core/domain.py``)."""
        out = []
        for name, col in self.table.columns.items():
            condition = null_condition(col)
            if condition is None:
                continue
            holds = is_true(self.formula(condition))
            is_null = self.formula(exp.Is(this=exp.column(name), expression=exp.Null()))
            formula = disj(conj(is_null, holds), conj(neg(is_null), neg(holds)))
            dimensions = frozenset(c.dimension for c in formula.conditions())
            claimed = frozenset().union(*(d.columns for d in dimensions))
            out.append(DomainConstraint(formula, dimensions, claimed))
        return tuple(out)

    def counted(self, node: exp.Expr) -> Formula:
        """The rows where ``node`` is not NULL (what COUNT(node) counts)."""
        hit = self._counted.get(id(node))
        if hit is None or hit[0] is not node:
            if len(self._counted) >= CACHE_SIZE:
                self._counted.clear()
            formula = self.formula(exp.Not(this=exp.Is(this=node.copy(), expression=exp.Null())))
            hit = self._counted[id(node)] = (node, formula)  # keeps ``node`` alive
        return hit[1]

    def group_condition(self, key: exp.Expr, value: Any) -> Formula:
        """The formula ``key = value`` of one GROUP BY cell (``value`` None: IS NULL)."""
        known = self._keys.get(id(key))
        if known is None or known[0] is not key:
            if len(self._keys) >= CACHE_SIZE:
                self._keys.clear()
            known = self._keys[id(key)] = (key, canonical(key))  # keeps ``key`` alive
        cache_key = (known[1], _hashable(value))
        hit = self._cells.get(cache_key)
        if hit is not None:
            return hit
        dim = self.bare_column(key)
        formula: Formula | None = None
        if dim is not None:
            try:
                if value is None:
                    formula = leaf(dim, "isnull") if dim.nullable else FALSE
                else:
                    formula = leaf(dim, "in", (self.normalise_value(_number(value), dim),))
            except NotConstant:
                formula = None
        if formula is None:
            if value is None:
                node: exp.Expr = exp.Is(this=key.copy(), expression=exp.Null())
            else:
                node = exp.EQ(this=key.copy(), expression=_literal(value))
            formula = self.formula(node)
        if len(self._cells) >= CACHE_SIZE:
            self._cells.clear()
        self._cells[cache_key] = formula
        return formula


def _shape(node: exp.Expr) -> tuple[Any, ...]:
    """The whole structure of an AST node, as a hashable value equal exactly when two
    nodes are alike: per node its type and, per argument, a child's shape or a value
    with its type (``1`` and ``True``, quoted and bare names, stay apart). Unlike
    sqlglot's own hash, equal shapes are equal trees, never a collision."""
    return (type(node), tuple((k, _arg_shape(v)) for k, v in node.args.items()))


def _arg_shape(value: Any) -> Any:
    if isinstance(value, exp.Expr):
        return _shape(value)
    if isinstance(value, list):
        return tuple(_arg_shape(v) for v in value)
    return (type(value), value)


def canonical(node: exp.Expr) -> str:
    return node.sql(normalize=True)


def _number(value: Any) -> Any:
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float):
        return Fraction(value)
    if isinstance(value, dt.date):
        return value.isoformat()
    return value


def _hashable(value: Any) -> Any:
    return (type(value).__name__, value)


def _literal(value: Any) -> exp.Expr:
    if isinstance(value, bool):
        return exp.Boolean(this=value)
    if isinstance(value, dt.date):
        return exp.Literal.string(value.isoformat())
    if isinstance(value, int | float):
        text = repr(abs(value)) if isinstance(value, float) else str(abs(value))
        literal = exp.Literal.number(text)
        return exp.Neg(this=literal) if value < 0 else literal
    return exp.Literal.string(str(value))


def builders(tables: Mapping[str, TableConfig]) -> dict[str, FormulaBuilder]:
    return {name: FormulaBuilder(t) for name, t in tables.items()}
