"""Row expressions in their portable, total SQL form (a part of compilation).

The analyzer has proven, from declared bounds and literals, that every accepted
expression stays in range (``gateway/sql/analyze/totality.py``). The rows themselves are not
bound by the declaration, so this rewrite makes the proof hold on the data too:

- a bounded numeric column is clamped to its declared [lower, upper] wherever it is read
  (the domain model, ``gateway/core/domain.py``): arithmetic then cannot meet a value the
  intervals did not account for, and the auditor's cells are what the SQL computes. A
  comparison with a constant strictly inside the bounds (``age > 30``) reads the raw value:
  it gives the same answer for every value, and stays index-friendly;
- integer operands of arithmetic are widened to BIGINT and real ones to DOUBLE
  (NUMERIC on PostgreSQL, whose doubles raise on underflow), so a PostgreSQL
  ``integer`` or ``real`` column cannot overflow its storage type;
- every divisor is ``NULLIF(divisor, 0)``: division and modulo by zero are NULL on every
  backend; division of two integers truncates (``IntDiv``);
- LIKE and ILIKE get an explicit ``ESCAPE '\\'``, so a pattern means the same everywhere;
- CONCAT becomes ``||`` over COALESCE(part, ''); a predicate that is the operand of a
  comparison is parenthesised;
- column names are quoted.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

from sqlglot import exp

from gateway.core.config import ColumnConfig, TableConfig
from gateway.core.domain import clamped
from gateway.sql.analyze.totality import ExpressionTypes, Typed

_COMPARED = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.In, exp.Between, exp.Is)
_ARITHMETIC = (exp.Add, exp.Sub, exp.Mul, exp.Div, exp.IntDiv, exp.Mod, exp.Neg, exp.Abs)
_NUMERIC_FUNCTIONS = (exp.Round, exp.Floor, exp.Ceil)
_PREDICATES = (exp.Predicate, exp.Connector, exp.Not)


@cache
def _built(name: str) -> exp.DataType:
    # Built once per name: building a type parses its name, which cost 2% of a request
    # (compile runs for every query text not seen before).
    return exp.DataType.build(name)


def data_type(name: str) -> exp.DataType:
    """``exp.DataType.build(name)``, its name parsed once: a fresh copy each call."""
    return _built(name).copy()


def portable(node: exp.Expr, table: TableConfig, dialect: str) -> exp.Expr:
    """A rewritten copy of a resolved, accepted row expression (see the module doc)."""
    return _Rewriter(table, dialect).rewrite(node, parent=None)


def wide_real(dialect: str) -> exp.DataType:
    """The type real arithmetic runs in: DOUBLE, except on PostgreSQL, whose doubles
    raise on overflow and underflow (1e-310 * 1e-20): there NUMERIC, which does not.
    A node shared by every caller: copy it before putting it in a tree."""
    return _built("DECIMAL" if dialect == "postgres" else "DOUBLE")


class _Rewriter:
    def __init__(self, table: TableConfig, dialect: str) -> None:
        self.table = table
        self.types = ExpressionTypes(table)
        self.real = wide_real(dialect)

    def kind(self, node: exp.Expr) -> Typed:
        return self.types.of(node)

    def rewrite(self, node: exp.Expr, parent: exp.Expr | None) -> exp.Expr:
        if isinstance(node, exp.Column):
            return self.column(node, parent)
        if isinstance(node, exp.Div | exp.IntDiv):
            return self.division(node)
        if isinstance(node, exp.Mod):
            return exp.Mod(
                this=self.operand(node.this, node),
                expression=_nullif_zero(self.operand(node.expression, node)),
            )
        if isinstance(node, exp.Concat):
            # CONCAT is missing from older SQLite; || with NULL as '' means the same.
            parts = [
                exp.Coalesce(this=self.rewrite(p, node), expressions=[exp.Literal.string("")])
                for p in node.expressions
            ]
            joined: exp.Expr = parts[0]
            for part in parts[1:]:
                joined = exp.DPipe(this=joined, expression=part)
            return exp.Paren(this=joined)
        if isinstance(node, exp.Like | exp.ILike):
            like = type(node)(this=self.rewrite(node.this, node), expression=node.expression.copy())
            return exp.Escape(this=like, expression=exp.Literal.string("\\"))
        if isinstance(node, _COMPARED):
            # sqlglot prints `a > 1 = TRUE` unparenthesised, which PostgreSQL and DuckDB
            # cannot parse: a predicate that is an operand gets its parentheses.
            return _rebuilt(node, lambda child: _grouped(self.rewrite(child, node)))
        if isinstance(node, (*_ARITHMETIC, *_NUMERIC_FUNCTIONS)):
            return _rebuilt(
                node,
                lambda child: self.rewrite(child, node),
                operands=lambda child: self.operand(child, node),
            )
        return _rebuilt(node, lambda child: self.rewrite(child, node))

    def column(self, node: exp.Column, parent: exp.Expr | None) -> exp.Expr:
        quoted = exp.column(node.name, quoted=True)
        col = self.table.columns[node.name]
        if not clamped(col) or (parent is not None and _reads_alike(node, parent, col)):
            return quoted
        assert col.lower is not None and col.upper is not None
        lower, upper = _number(col.lower, col.type), _number(col.upper, col.type)
        return exp.Case(
            ifs=[
                exp.If(this=exp.LT(this=quoted.copy(), expression=lower), true=lower.copy()),
                exp.If(this=exp.GT(this=quoted.copy(), expression=upper), true=upper.copy()),
            ],
            default=quoted,
        )

    def operand(self, node: exp.Expr, parent: exp.Expr) -> exp.Expr:
        """A numeric operand, rewritten, widened to BIGINT or DOUBLE unless it is itself
        arithmetic (whose result is already wide)."""
        inner = node.unnest() if isinstance(node, exp.Paren) else node
        rewritten = self.rewrite(inner, parent)
        if isinstance(inner, _ARITHMETIC):
            return exp.Paren(this=rewritten)
        kind = self.kind(inner).kind
        if kind in ("integer", "null"):  # a bare NULL operand is ambiguous on PostgreSQL
            return exp.Cast(this=rewritten, to=data_type("BIGINT"))
        if kind == "real":
            return exp.Cast(this=rewritten, to=self.real.copy())
        return rewritten

    def division(self, node: exp.Div | exp.IntDiv) -> exp.Expr:
        left, right = self.kind(node.this), self.kind(node.expression)
        this = self.operand(node.this, node)
        divisor = _nullif_zero(self.operand(node.expression, node))
        if isinstance(node, exp.IntDiv) or left.kind == right.kind == "integer":
            return exp.IntDiv(this=this, expression=divisor)
        return exp.Div(this=this, expression=divisor, typed=False)


def _reads_alike(column: exp.Column, parent: exp.Expr, col: ColumnConfig) -> bool:
    """Whether ``parent`` (a predicate on ``column``) has the same value on the raw and on
    the clamped column, for every value: it must be constant below ``lower`` and above
    ``upper``, which holds for comparisons with constants far enough inside the bounds
    (PostgreSQL's NaN sorts above every number, like a value beyond ``upper``)."""
    assert col.lower is not None and col.upper is not None
    low, high = col.lower, col.upper

    def inside(value: exp.Expr | None, *, low_open: bool, high_open: bool) -> bool:
        c = _numeric_literal(value)
        if c is None:
            return False
        return (c > low if low_open else c >= low) and (c < high if high_open else c <= high)

    if isinstance(parent, exp.Is):
        return True
    if isinstance(parent, exp.In):
        if parent.this is not column or parent.args.get("query"):
            return False
        return all(inside(v, low_open=True, high_open=True) for v in parent.expressions)
    if isinstance(parent, exp.Between):
        return parent.this is column and (
            inside(parent.args.get("low"), low_open=True, high_open=False)
            and inside(parent.args.get("high"), low_open=False, high_open=True)
        )
    if not isinstance(parent, exp.EQ | exp.NEQ | exp.GT | exp.GTE | exp.LT | exp.LTE):
        return False
    op: type[exp.Expr]
    if parent.this is column:
        other, op = parent.expression, type(parent)
    elif parent.expression is column:
        other, op = parent.this, _MIRROR.get(type(parent), type(parent))
    else:
        return False
    if op in (exp.GT, exp.LTE):  # x > c, x <= c: lower <= c < upper
        return inside(other, low_open=False, high_open=True)
    if op in (exp.GTE, exp.LT):  # x >= c, x < c: lower < c <= upper
        return inside(other, low_open=True, high_open=False)
    return inside(other, low_open=True, high_open=True)  # = and <>: strictly inside


_MIRROR: dict[type[exp.Expr], type[exp.Expr]] = {
    exp.GT: exp.LT,
    exp.LT: exp.GT,
    exp.GTE: exp.LTE,
    exp.LTE: exp.GTE,
}


def _numeric_literal(node: exp.Expr | None) -> float | None:
    while isinstance(node, exp.Paren):
        node = node.this
    if isinstance(node, exp.Neg):
        inner = _numeric_literal(node.this)
        return None if inner is None else -inner
    if isinstance(node, exp.Literal) and not node.is_string:
        try:
            return float(str(node.this))
        except ValueError:
            return None
    return None


def _rebuilt(
    node: exp.Expr,
    child: Callable[[exp.Expr], exp.Expr],
    operands: Callable[[exp.Expr], exp.Expr] | None = None,
) -> exp.Expr:
    """A new node of ``node``'s type whose child expressions are ``child(c)`` (its
    ``this``/``expression`` are ``operands(c)`` when given). Built, not deep-copied and
    then overwritten: copying at every level made the rewrite quadratic in its size."""
    args: dict[str, object] = {}
    for key, value in node.args.items():
        rewrite = operands if operands is not None and key in ("this", "expression") else child
        if isinstance(value, exp.Expr):
            args[key] = rewrite(value)
        elif isinstance(value, list):
            args[key] = [rewrite(v) if isinstance(v, exp.Expr) else v for v in value]
        else:
            args[key] = value
    return type(node)(**args)


def _grouped(node: exp.Expr) -> exp.Expr:
    return exp.Paren(this=node) if isinstance(node, _PREDICATES) else node


def _nullif_zero(node: exp.Expr) -> exp.Expr:
    return exp.Nullif(this=node, expression=exp.Literal.number(0))


def _number(x: float, ctype: str) -> exp.Expr:
    value = int(x) if ctype == "integer" or float(x).is_integer() else float(x)
    literal = exp.Literal.number(repr(abs(value)) if isinstance(value, float) else abs(value))
    return exp.Neg(this=literal) if value < 0 else literal
