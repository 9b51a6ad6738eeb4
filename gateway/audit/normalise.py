"""One leaf of a predicate, normalised onto the dimension of the column it reads.

Rewrites of one condition must be one region, or a differencing pair gets through as two
"unrelated" queries (``LOWER(zip) = '8423'`` against ``zip = '8423' AND NOT disease =
'Crohn'``). In order, a leaf is read as:

1. **Plain**: after identities are stripped (``x || ''``, ``x + 0``, ``x * 1``, ``x / 1``,
   ``- -x``, a cast to the column's own type, COALESCE of a column that is never NULL), a
   column compared with constants, IN, BETWEEN, IS NULL, or LIKE without wildcards.
2. **Enumerated**: a condition on one column whose domain is finite and public (declared
   values, booleans, a bounded integer column with at most ``ENUMERATE_MAX`` values, or
   for open text the constants the condition names plus ``OTHER``) is evaluated on every
   value (``evaluate``); its truth table becomes conditions on the column.
3. **Monotone**: a comparison of a monotone integer expression of one bounded column
   (sums, differences and products with constants, division by a constant, minus) is an
   interval of that column, found by bisection.
4. **Claimed**: anything else is an expression dimension (the expression compared with
   constants) or an opaque condition of its own, which *claims* the columns it reads: the
   auditor refuses to combine it with any other dimension on those columns (conservative:
   it cannot relate them, so it does not pretend they are unrelated).

A condition on one text column of a public lookup whose rows the gateway read
(``PublicLookup``, gateway/sql/public_lookups.py) is read instead as a condition on the
column the lookup is joined on: evaluated on each key's row, and on NULL for the anchor's
rows the join attaches no row to (``through_key``), so two columns of one lookup are
conditions on one dimension, the key's. Where that evaluation fails it is claimed (4.).

A condition with no column at all is evaluated; one that cannot be is ``Undecidable``.
"""

from __future__ import annotations

from collections.abc import Callable
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from sqlglot import exp

from gateway.audit.evaluate import OTHER, Unknown, caseless, evaluate, string_constants
from gateway.audit.formulas import (
    FALSE,
    NULL,
    TRUE,
    DimensionKey,
    Formula,
    Prefix,
    conj,
    disj,
    leaf,
    neg,
)
from gateway.core.config import ColumnConfig, TableConfig

if TYPE_CHECKING:
    from gateway.audit.predicates import FormulaBuilder

ENUMERATE_MAX = 4096
"""Bounded integer columns with at most this many values are enumerated; larger ones are
normalised only for monotone expressions (by bisection)."""

_CONSTS = {False: FALSE, None: NULL, True: TRUE}
_ORDER_OPS: dict[type[exp.Expr], str] = {exp.LT: "lt", exp.LTE: "le", exp.GT: "gt", exp.GTE: "ge"}
_FLIP = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le", "eq": "eq"}
_INTEGER_TYPES = {exp.DataType.Type.SMALLINT, exp.DataType.Type.INT, exp.DataType.Type.BIGINT}
_SAME_TYPE = {
    "real": {exp.DataType.Type.DOUBLE},
    "text": {exp.DataType.Type.TEXT, exp.DataType.Type.VARCHAR},
    "date": {exp.DataType.Type.DATE},
    "boolean": {exp.DataType.Type.BOOLEAN},
}


class Undecidable(Exception):
    """A condition the auditor can read in no sound way (a constant it cannot evaluate)."""


class Normaliser:
    """Reads one leaf of a predicate over ``table`` (see the module docstring)."""

    def __init__(self, table: TableConfig, builder: FormulaBuilder) -> None:
        self.table = table
        self.builder = builder

    def leaf(self, node: exp.Expr) -> Formula:
        node = strip_identities(node, self.table)
        plain = self.plain(node)
        if plain is not None:
            return plain
        columns = self.builder.columns_of(node)
        if not columns:
            return self.constant(node)
        if len(columns) == 1:
            (name,) = columns
            try:
                if name in self.builder.lookups:
                    found = self.through_key(node, name)
                else:
                    found = self.enumerated(node, name)
            except Unknown:
                found = None
            if found is not None:
                return found
        return self.claimed(node)

    # -- 1. plain --------------------------------------------------------------------

    def plain(self, node: exp.Expr) -> Formula | None:
        b = self.builder
        if isinstance(node, exp.NEQ):
            inner = self.plain(exp.EQ(this=node.this, expression=node.expression))
            return None if inner is None else neg(inner)
        if type(node) in _ORDER_OPS or isinstance(node, exp.EQ):
            op = "eq" if isinstance(node, exp.EQ) else _ORDER_OPS[type(node)]
            for subject, other, flip in (
                (node.this, node.expression, False),
                (node.expression, node.this, True),
            ):
                dim = b.bare_column(subject)
                if dim is None:
                    continue
                value = _constant(other)
                if value is _NOT:
                    return None
                if value is None:
                    return NULL  # comparing with NULL is never true
                return self.compare(dim, _FLIP[op] if flip else op, (value,))
            return None
        if isinstance(node, exp.Between):
            dim = b.bare_column(node.this)
            low, high = _constant(node.args["low"]), _constant(node.args["high"])
            if dim is None or low is _NOT or high is _NOT:
                return None
            if low is None or high is None:
                return conj(
                    NULL if low is None else self.compare(dim, "ge", (low,)) or NULL,
                    NULL if high is None else self.compare(dim, "le", (high,)) or NULL,
                )
            a, c = self.compare(dim, "ge", (low,)), self.compare(dim, "le", (high,))
            return None if a is None or c is None else conj(a, c)
        if isinstance(node, exp.In):
            dim = b.bare_column(node.this)
            if dim is None or node.args.get("query") or not node.expressions:
                return None
            values = tuple(_constant(v) for v in node.expressions)
            if any(v is _NOT for v in values):
                return None
            return self.compare(dim, "in", values)
        if isinstance(node, exp.Is) and isinstance(node.expression, exp.Null):
            dim = b.bare_column(node.this)
            if dim is None:
                return None
            return leaf(dim, "isnull") if dim.nullable else FALSE
        if isinstance(node, exp.Like):
            dim = b.bare_column(node.this)
            pattern = node.expression
            if dim is None or dim.kind != "categorical":
                return None
            if not (isinstance(pattern, exp.Literal) and pattern.is_string):
                return None
            p = str(pattern.this)
            if "_" in p or "\\" in p or not caseless(p) or "%" in p[:-1]:
                return None  # wildcards or case rules: enumerated, or claimed
            if not p.endswith("%"):
                return self.compare(dim, "in", (p,))
            if self.table.columns[dim.column or ""].values is not None:
                return None  # declared values: enumerated
            return leaf(dim, "prefix", (Prefix(p[:-1]),))
        return None

    def compare(self, dim: DimensionKey, op: str, values: tuple[Any, ...]) -> Formula | None:
        if dim.kind == "categorical" and op not in ("eq", "in"):
            return None  # order on text depends on collation
        try:
            norm = tuple(self.builder.normalise_value(v, dim) for v in values)
        except Exception:
            return None
        return leaf(dim, "in" if op == "eq" else op, norm)  # type: ignore[arg-type]

    # -- constants ---------------------------------------------------------------------

    def constant(self, node: exp.Expr) -> Formula:
        try:
            value = evaluate(node, "", None, string_constants(node))
        except Unknown:
            raise Undecidable(f"the condition '{node.sql()}' cannot be evaluated") from None
        if value is not None and not isinstance(value, bool):
            raise Undecidable(f"'{node.sql()}' is not a condition")
        return _CONSTS[value]

    # -- 2. and 3. enumerated, monotone --------------------------------------------------

    def enumerated(self, node: exp.Expr, name: str) -> Formula | None:
        col = self.table.columns[name]
        named = string_constants(node)
        domain = _domain(col, named)
        if domain is None:
            if col.type == "integer" and col.bounded:
                return self.monotone(node, name, col)
            return None
        truth: dict[Any, Any] = {}
        for value in domain:
            t = evaluate(node, name, value, named)
            if t is not None and not isinstance(t, bool):
                return None
            truth[value] = t
        if col.may_be_null:
            t = evaluate(node, name, None, named)
            if t is not None and not isinstance(t, bool):
                return None
            truth[None] = t
        return self.truth_table(name, col, truth)

    def through_key(self, node: exp.Expr, name: str) -> Formula | None:
        """A condition on a public lookup's column, as the keys whose row meets it
        (``PublicLookup``): evaluated on each row the join can attach, and on NULL for the
        anchor's rows it attaches none to (a key no row has, or NULL)."""
        via, lookup, column = self.builder.lookups[name]
        named = string_constants(node)
        truth_of: dict[Any, Any] = {}

        def truth(value: Any) -> Any:
            if value not in truth_of:
                t = evaluate(node, name, value, named)
                if t is not None and not isinstance(t, bool):
                    raise Unknown("not a truth value")
                truth_of[value] = t
            return truth_of[value]

        unmatched = truth(None)
        key = self.table.columns[via]
        table: dict[Any, Any] = {}
        for value in key.values if key.values is not None else (*lookup.rows, OTHER):
            row = lookup.rows.get(value) if isinstance(value, str) else None
            table[value] = unmatched if row is None else truth(row[column])
        if key.may_be_null:
            table[None] = unmatched
        return self.truth_table(via, key, table)

    def truth_table(self, name: str, col: ColumnConfig, truth: dict[Any, Any]) -> Formula:
        """Conditions on column ``name`` true exactly where ``truth`` says so (Kleene)."""
        dim = self.builder.column_dim(name)
        values = [v for v in truth if v is not None]
        if dim.kind == "ordered":
            ordered = sorted(values)
            f_true = _intervals(dim, [v for v in ordered if truth[v] is True], ordered)
            f_unknown = _intervals(dim, [v for v in ordered if truth[v] is None], ordered)
        else:
            f_true = self.members(dim, truth, True)
            f_unknown = self.members(dim, truth, None)
        f = disj(f_true, conj(f_unknown, NULL))
        if not dim.nullable:
            return f
        isnull = leaf(dim, "isnull")
        return disj(conj(f, neg(isnull)), conj(isnull, _CONSTS[truth.get(None)]))

    def members(self, dim: DimensionKey, truth: dict[Any, Any], which: Any) -> Formula:
        named = [v for v in truth if v is not None and v is not OTHER]
        hit = tuple(v for v in named if truth[v] is which)
        if OTHER in truth and truth[OTHER] is which:
            miss = tuple(v for v in named if truth[v] is not which)
            return neg(leaf(dim, "in", miss)) if miss else TRUE
        return leaf(dim, "in", hit) if hit else FALSE

    def monotone(self, node: exp.Expr, name: str, col: ColumnConfig) -> Formula | None:
        assert col.lower is not None and col.upper is not None
        low, high = int(col.lower), int(col.upper)
        parts = _monotone_parts(node)
        if parts is None:
            return None
        f = parts[0]
        sign = _direction(f, name)
        if sign not in (1, -1):
            return None

        def value(x: int) -> Any:
            v = evaluate(f, name, x)
            if not isinstance(v, int) or isinstance(v, bool):
                raise Unknown("not an integer")
            return v if sign == 1 else -v

        def first(pred: Callable[[Any], bool]) -> int:
            lo, hi = low, high + 1  # smallest x with pred(value(x)), or high + 1
            while lo < hi:
                mid = (lo + hi) // 2
                if pred(value(mid)):
                    hi = mid
                else:
                    lo = mid + 1
            return lo

        def interval(op: str, c: Fraction) -> list[tuple[int, int]]:
            if sign == -1:  # value() is −f: f op c ⟺ −f flipped-op −c
                op, c = _FLIP[op] if op != "eq" else "eq", -c
            if op == "ge":
                return [(first(lambda v: v >= c), high)]
            if op == "gt":
                return [(first(lambda v: v > c), high)]
            if op == "le":
                return [(low, first(lambda v: v > c) - 1)]
            if op == "lt":
                return [(low, first(lambda v: v >= c) - 1)]
            return [(first(lambda v: v >= c), first(lambda v: v > c) - 1)]

        negate, tests = parts[1], parts[2]
        spans: list[tuple[int, int]] = []
        for op, c in tests:
            spans += interval(op, c)
        if len(tests) == 2:  # BETWEEN: the intersection
            (a, b), (c2, d) = spans
            spans = [(max(a, c2), min(b, d))]
        spans = [(a, b) for a, b in spans if a <= b]
        if negate:
            spans = _complement(spans, low, high)
        dim = self.builder.column_dim(name)
        f_true = disj(*(_span(dim, a, b, low, high) for a, b in spans))
        if not dim.nullable:
            return f_true
        isnull = leaf(dim, "isnull")  # NULL in, NULL out: the comparison is unknown
        return disj(conj(f_true, neg(isnull)), conj(isnull, NULL))

    # -- 4. claimed ----------------------------------------------------------------------

    def claimed(self, node: exp.Expr) -> Formula:
        b = self.builder
        if type(node) in _ORDER_OPS or isinstance(node, exp.EQ | exp.NEQ):
            op = "eq" if isinstance(node, exp.EQ | exp.NEQ) else _ORDER_OPS[type(node)]
            for subject, other, flip in (
                (node.this, node.expression, False),
                (node.expression, node.this, True),
            ):
                value = _constant(other)
                if value is _NOT or b.bare_column(subject) is not None:
                    continue
                if subject.find(exp.Column) is None:
                    continue
                if value is None:
                    return NULL
                found = self.on_expression(subject, _FLIP[op] if flip else op, (value,))
                if found is not None:
                    return neg(found) if isinstance(node, exp.NEQ) else found
        if isinstance(node, exp.In) and b.bare_column(node.this) is None:
            values = tuple(_constant(v) for v in node.expressions)
            if values and all(v is not _NOT for v in values) and not node.args.get("query"):
                found = self.on_expression(node.this, "in", values)
                if found is not None:
                    return found
        return b.opaque(node)

    def on_expression(self, subject: exp.Expr, op: str, values: tuple[Any, ...]) -> Formula | None:
        sample = next((v for v in values if v is not None), None)
        if sample is None:
            return None
        dim = self.builder.expression_dim(subject, sample)
        return self.compare(dim, op, values)


_NOT = object()


def _constant(node: exp.Expr) -> Any:
    """A literal's value (numbers as Fraction), or ``_NOT``."""
    from gateway.audit.predicates import NotConstant, constant_value

    try:
        return constant_value(node)
    except NotConstant:
        return _NOT


def _domain(col: ColumnConfig, named: frozenset[str]) -> list[Any] | None:
    """The values to enumerate a column on (as the evaluator sees them), or None."""
    if col.type == "boolean":
        return [False, True]
    if col.values is not None:
        if col.type == "integer":
            return [int(v) for v in col.values]
        if col.type == "real":
            return [Fraction(v) for v in col.values]
        if col.type == "text":
            return [str(v) for v in col.values]
        return None
    if col.type == "text":
        return [*sorted(named), OTHER]
    if col.type == "integer" and col.bounded:
        assert col.lower is not None and col.upper is not None
        low, high = int(col.lower), int(col.upper)
        if high - low + 1 <= ENUMERATE_MAX:
            return list(range(low, high + 1))
    return None


def _intervals(dim: DimensionKey, chosen: list[Any], ordered: list[Any]) -> Formula:
    """Conditions true exactly on ``chosen`` among the enumerated ``ordered`` values."""
    if not chosen:
        return FALSE
    if len(chosen) == len(ordered):
        return TRUE
    position = {v: i for i, v in enumerate(ordered)}
    runs: list[list[Any]] = []
    for v in chosen:
        if runs and position[v] == position[runs[-1][-1]] + 1:
            runs[-1].append(v)
        else:
            runs.append([v])
    parts = []
    for run in runs:
        lo, hi = Fraction(run[0]), Fraction(run[-1])
        if lo == hi:
            parts.append(leaf(dim, "in", (lo,)))
        else:
            parts.append(conj(leaf(dim, "ge", (lo,)), leaf(dim, "le", (hi,))))
    return disj(*parts)


def _span(dim: DimensionKey, a: int, b: int, low: int, high: int) -> Formula:
    if a <= low and b >= high:
        return TRUE
    if a == b:
        return leaf(dim, "in", (Fraction(a),))
    parts = []
    if a > low:
        parts.append(leaf(dim, "ge", (Fraction(a),)))
    if b < high:
        parts.append(leaf(dim, "le", (Fraction(b),)))
    return conj(*parts)


def _complement(spans: list[tuple[int, int]], low: int, high: int) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    at = low
    for a, b in sorted(spans):
        if a > at:
            out.append((at, a - 1))
        at = max(at, b + 1)
    if at <= high:
        out.append((at, high))
    return out


def _monotone_parts(node: exp.Expr) -> tuple[exp.Expr, bool, list[tuple[str, Fraction]]] | None:
    """``f op c``, ``f IN (c)``, ``f BETWEEN a AND b`` (and ``<>``) as the expression ``f``,
    whether the test is negated, and the tests (two for BETWEEN: both must hold)."""
    if type(node) in _ORDER_OPS or isinstance(node, exp.EQ | exp.NEQ):
        op = "eq" if isinstance(node, exp.EQ | exp.NEQ) else _ORDER_OPS[type(node)]
        for subject, other, flip in (
            (node.this, node.expression, False),
            (node.expression, node.this, True),
        ):
            c = _constant(other)
            if isinstance(c, Fraction) and subject.find(exp.Column) is not None:
                return subject, isinstance(node, exp.NEQ), [(_FLIP[op] if flip else op, c)]
        return None
    if isinstance(node, exp.In) and not node.args.get("query") and len(node.expressions) == 1:
        c = _constant(node.expressions[0])
        if isinstance(c, Fraction):
            return node.this, False, [("eq", c)]
    if isinstance(node, exp.Between):
        a, b = _constant(node.args["low"]), _constant(node.args["high"])
        if isinstance(a, Fraction) and isinstance(b, Fraction):
            return node.this, False, [("ge", a), ("le", b)]
    return None


def _direction(node: exp.Expr, name: str) -> int | None:
    """+1 / −1 when ``node`` is non-decreasing / non-increasing in column ``name`` (0 for a
    constant), None when it is neither or unknown."""
    if isinstance(node, exp.Paren):
        return _direction(node.this, name)
    if isinstance(node, exp.Column):
        return 1 if node.name.lower() == name else None
    if _constant(node) is not _NOT:
        return 0
    if isinstance(node, exp.Neg):
        d = _direction(node.this, name)
        return None if d is None else -d
    if isinstance(node, exp.Add | exp.Sub):
        a, b = _direction(node.this, name), _direction(node.expression, name)
        if a is None or b is None:
            return None
        if isinstance(node, exp.Sub):
            b = -b
        if a == 0 or b == 0 or a == b:
            return a or b
        return None
    if isinstance(node, exp.Mul):
        for x, y in ((node.this, node.expression), (node.expression, node.this)):
            c = _constant(y)
            if isinstance(c, Fraction) and c.denominator == 1:
                d = _direction(x, name)
                return None if d is None else (0 if c == 0 else d * (1 if c > 0 else -1))
        return None
    if isinstance(node, exp.Div | exp.IntDiv):
        c = _constant(node.expression)
        if not isinstance(c, Fraction) or c.denominator != 1 or c == 0:
            return None
        d = _direction(node.this, name)
        return None if d is None else d * (1 if c > 0 else -1)
    if isinstance(node, exp.Floor | exp.Ceil) or (
        isinstance(node, exp.Cast) and node.to.this in _INTEGER_TYPES
    ):
        return _direction(node.this, name)
    return None


def strip_identities(node: exp.Expr, table: TableConfig) -> exp.Expr:
    """``node`` without the identity operations on its columns' values (a copy)."""

    def strip(n: exp.Expr) -> exp.Expr:
        inner = _identity_operand(n, table)
        while inner is not None:
            n = inner
            inner = _identity_operand(n, table)
        return n

    # one copy: ``transform`` would copy the copy again
    return node.copy().transform(strip, copy=False)


def _identity_operand(n: exp.Expr, table: TableConfig) -> exp.Expr | None:
    """The operand ``n`` is an identity of, if it is one (``x || ''`` → ``x``)."""
    if isinstance(n, exp.DPipe):
        for x, y in ((n.this, n.expression), (n.expression, n.this)):
            if _is_literal(y, ""):
                return x
    if isinstance(n, exp.Concat) and len(n.expressions) >= 1:
        rest = [p for p in n.expressions if not _is_literal(p, "")]
        if len(rest) == 1 and not may_be_null(rest[0], table):
            return rest[0]
    if isinstance(n, exp.Add):
        for x, y in ((n.this, n.expression), (n.expression, n.this)):
            if _is_number(y, 0) and _numeric(x, table):
                return x
    if isinstance(n, exp.Sub) and _is_number(n.expression, 0) and _numeric(n.this, table):
        return n.this
    if isinstance(n, exp.Mul):
        for x, y in ((n.this, n.expression), (n.expression, n.this)):
            if _is_number(y, 1) and _numeric(x, table):
                return x
    if (
        isinstance(n, exp.Div | exp.IntDiv)
        and _is_number(n.expression, 1)
        and _numeric(n.this, table)
    ):
        return n.this
    if isinstance(n, exp.Neg) and isinstance(n.this, exp.Neg):
        return n.this.this
    if isinstance(n, exp.Cast):
        col = _bare(n.this, table)
        if col is not None and not n.to.expressions:
            if col.type == "integer" and n.to.this in _INTEGER_TYPES:
                return n.this
            if n.to.this in _SAME_TYPE.get(col.type, set()):
                return n.this
    if isinstance(n, exp.Coalesce) and not may_be_null(n.this, table):
        return n.this
    return None


def _bare(node: exp.Expr, table: TableConfig) -> ColumnConfig | None:
    while isinstance(node, exp.Paren):
        node = node.this
    if isinstance(node, exp.Column):
        return table.columns.get(node.name.lower())
    return None


def _numeric(node: exp.Expr, table: TableConfig) -> bool:
    col = _bare(node, table)
    if col is not None:
        return col.numeric
    return isinstance(node, exp.Add | exp.Sub | exp.Mul | exp.Div | exp.IntDiv | exp.Neg)


def _is_literal(node: exp.Expr, text: str) -> bool:
    return isinstance(node, exp.Literal) and node.is_string and str(node.this) == text


def _is_number(node: exp.Expr, value: int) -> bool:
    c = _constant(node)
    return isinstance(c, Fraction) and c == value


_MAYBE_NULL = (exp.Null, exp.Nullif, exp.Div, exp.IntDiv, exp.Mod, exp.Substring, exp.Anonymous)


def _no_default(n: exp.Expr) -> bool:
    """A CASE without ELSE or an IF without a false branch: NULL when nothing holds."""
    if isinstance(n, exp.Case):
        return n.args.get("default") is None
    return isinstance(n, exp.If) and n.args.get("false") is None


def may_be_null(node: exp.Expr, table: TableConfig) -> bool:
    """Whether ``node`` can be NULL on some row (conservative: yes when unsure)."""
    for n in node.walk():
        if isinstance(n, exp.Column):
            col = table.columns.get(n.name.lower())
            if col is None or col.may_be_null:
                return True
        elif isinstance(n, _MAYBE_NULL) or _no_default(n):
            return True
    return False
