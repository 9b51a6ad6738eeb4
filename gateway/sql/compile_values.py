"""The per-row values measures aggregate: clamped columns, their squares, and the
bucket of a quantile's fine histogram (gateway/sql/compile.py builds the statement around them).

Every literal is exact on every backend (integers, or dyadic rationals written as the
doubles that equal them), so the same rows give the same integers on SQLite, PostgreSQL
and DuckDB.
"""

from __future__ import annotations

from fractions import Fraction

from sqlglot import exp

from gateway.core.config import TableConfig
from gateway.core.plan import Measure, QuantileGrid
from gateway.sql.portable import data_type


def histogram_input(m: Measure) -> exp.Expr:
    """The quantile's column itself (COUNT of it is the number of values; its bucket is
    ``bucket_index`` of it)."""
    assert isinstance(m.expression, exp.Column)
    return exp.column(m.expression.name, quoted=True)


def bucket_index(value: exp.Expr, grid: QuantileGrid) -> exp.Expr:
    """The bucket of ``grid`` a row's ``value`` falls in: ⌊(clamp(value) − lower)/width⌋,
    NULL for NULL. The clamp (NaN goes to the upper bound, as every comparison orders it
    there) and a cap keep it in 0 … buckets − 1 (the upper bound itself, which lands one
    past the last bucket when the span is a whole number of buckets, counts in the
    last). The width is a power of two, so the
    scaling is exact in doubles, and FLOOR is monotone: the buckets keep the values'
    order on every backend."""
    lower, upper = number_literal(float(grid.lower)), number_literal(float(grid.upper))
    clamped = exp.Case(
        ifs=[
            exp.If(this=exp.LT(this=value.copy(), expression=lower), true=lower.copy()),
            exp.If(this=exp.GT(this=value.copy(), expression=upper), true=upper.copy()),
        ],
        default=value.copy(),
    )
    if grid.integral:
        offset: exp.Expr = exp.Sub(
            this=exp.Cast(this=clamped, to=data_type("BIGINT")), expression=lower.copy()
        )
        return exp.Cast(this=offset, to=data_type("BIGINT"))
    shifted = exp.Sub(this=exp.Cast(this=clamped, to=data_type("DOUBLE")), expression=lower.copy())
    scaled = exp.Mul(this=exp.Paren(this=shifted), expression=fraction_literal(1 / grid.width))
    index = exp.Cast(this=exp.Floor(this=scaled), to=data_type("BIGINT"))
    last = exp.Literal.number(grid.buckets - 1)
    # the upper bound itself, one past the last bucket when the span is a whole number of
    # buckets, counts in the last (the window sums see the buckets the mechanism weighs)
    return exp.Case(
        ifs=[exp.If(this=exp.GT(this=index.copy(), expression=last), true=last.copy())],
        default=index,
    )


def near_rank(
    below: exp.Expr, count: exp.Expr, n: exp.Expr, p: Fraction, window: exp.Expr
) -> exp.Expr:
    """A bucket holding ``count`` values after ``below`` others of ``n`` meets the ranks
    [t − window, t + window], t = p·(n − 1), and holds a value: below ≤ t + window and
    below + count ≥ t − window, t computed in doubles (the caller widens the window by
    their rounding)."""
    target = exp.Mul(
        this=exp.Paren(
            this=exp.Sub(
                this=exp.Cast(this=n.copy(), to=data_type("DOUBLE")),
                expression=exp.Literal.number(1),
            )
        ),
        expression=number_literal(float(p)),
    )
    return exp.and_(
        exp.GT(this=count.copy(), expression=exp.Literal.number(0)),
        exp.LTE(
            this=below.copy(), expression=exp.Add(this=target.copy(), expression=window.copy())
        ),
        exp.GTE(
            this=exp.Add(this=below.copy(), expression=count.copy()),
            expression=exp.Sub(this=target, expression=window.copy()),
        ),
    )


def squares_input(m: Measure, table: TableConfig) -> exp.Expr:
    """The square of the clamped column, on the grid of the squares (``m.resolution``):
    exact 64-bit integers for an integer column whose squares stay small, otherwise
    ROUND(v·v / resolution) computed in doubles (identical IEEE arithmetic everywhere)."""
    assert isinstance(m.expression, exp.Column)
    steps = 1 / m.resolution
    integer = table.columns[m.expression.name].type == "integer"
    if steps == 1 and integer:
        whole = exp.Cast(this=clamped_value(m, None), to=data_type("BIGINT"))
        return exp.Mul(this=whole, expression=whole.copy())
    # |v| under `small` squares to under a quarter step, which rounds to 0 anyway: sent
    # to 0 first, so that v·v never underflows (PostgreSQL reports that as an error).
    small = Fraction(1)
    while small * small >= m.resolution / 4:
        small /= 2
    while (small * 2) ** 2 < m.resolution / 4:
        small *= 2
    v = exp.Cast(this=clamped_value(m, small), to=data_type("DOUBLE"))
    square = exp.Mul(this=v, expression=v.copy())
    scaled = exp.Mul(this=exp.Paren(this=square), expression=fraction_literal(steps))
    return exp.Cast(this=exp.Round(this=scaled), to=data_type("BIGINT"))


def clamped_value(m: Measure, zero_below: Fraction | None) -> exp.Expr:
    """The measure's column clamped to [lower, upper]; magnitudes under ``zero_below``
    (a power of two, exact as a literal) sent to 0."""
    assert isinstance(m.expression, exp.Column)
    assert m.lower is not None and m.upper is not None
    value = exp.column(m.expression.name, quoted=True)
    lower, upper = number_literal(m.lower), number_literal(m.upper)
    ifs = [
        exp.If(this=exp.LT(this=value.copy(), expression=lower), true=lower.copy()),
        exp.If(this=exp.GT(this=value.copy(), expression=upper), true=upper.copy()),
    ]
    if zero_below is not None:
        small = fraction_literal(zero_below)
        ifs.append(
            exp.If(
                this=exp.and_(
                    exp.GT(this=value.copy(), expression=exp.Neg(this=small.copy())),
                    exp.LT(this=value.copy(), expression=small.copy()),
                ),
                true=exp.Literal.number(0),
            )
        )
    return exp.Case(ifs=ifs, default=value)


def number_literal(x: float) -> exp.Expr:
    if float(x).is_integer():
        literal = exp.Literal.number(int(x))
    else:
        literal = exp.Literal.number(repr(float(x)))
    return exp.Neg(this=exp.Literal.number(str(literal.this).lstrip("-"))) if x < 0 else literal


def fraction_literal(f: Fraction) -> exp.Expr:
    if f < 0:
        return exp.Neg(this=fraction_literal(-f))
    if f.denominator == 1:
        return exp.Literal.number(f.numerator)
    return exp.Literal.number(repr(float(f)))  # powers of two are exact in binary floating point
