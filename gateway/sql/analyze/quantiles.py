"""Pass 4b: quantiles (PERCENTILE_CONT, MEDIAN, MIN, MAX) and spread (VARIANCE, STDDEV).

A quantile of a bounded numeric column is released by choosing one bucket of a *public*
grid of up to ``MAX_BUCKETS`` buckets: its edges come from the declared bounds alone
(``quantile_grid``), never from the data. The database computes, after the usual
per-unit contribution bounding, the number of values (a ``histogram`` measure) and the
exact count of every non-empty bucket (one more branch of the same statement, grouped by
the bucket: ``gateway/sql/compile.py``); only those counts leave it, and the exponential
mechanism picks the bucket from them (``mechanisms.histogram_quantile``,
``gateway/pipeline/quantiles.py``). MIN and MAX are the quantiles 0 and 1: the released value is a
grid value whose rank is close to the first (last) one, which is not the same as the
smallest (largest) value when few rows are at the ends.

VARIANCE and STDDEV are post-processing of a noisy COUNT, a noisy SUM and a noisy sum of
squares of the clamped column (``sum_squares``); see ``gateway/pipeline/quantiles.py``.
"""

from __future__ import annotations

import math
from fractions import Fraction

from sqlglot import exp

from gateway.core.config import TableConfig
from gateway.core.errors import UnsupportedQuery
from gateway.core.plan import Measure, OutputKind, QuantileGrid
from gateway.sql.analyze.aggregates import (
    bounded_column,
    contribution_bounds,
    measures_for,
    summed_measure,
    uniform_sensitivity,
)

QUANTILE_AGGREGATES = (exp.WithinGroup, exp.Median, exp.Min, exp.Max)
SPREAD_AGGREGATES = (exp.Stddev, exp.StddevPop, exp.StddevSamp, exp.Variance, exp.VariancePop)

#: A quantile's grid has at most this many buckets: an integer column with at most this
#: many values gets one bucket per value, anything else buckets of a power-of-two width.
#: The statement returns only the buckets near the target rank (a number bounded by the
#: ε, not by the grid: ``mechanisms.choose_bucket_in_window``), so the grid can be fine;
#: what it bounds is the database's work, one group per non-empty bucket (per group of
#: the query), and the error from the grid, a quarter of a bucket on average.
MAX_BUCKETS = 1 << 20

_SPREAD_KINDS: dict[type[exp.Expr], OutputKind] = {
    exp.Stddev: "stddev_samp",
    exp.StddevSamp: "stddev_samp",
    exp.StddevPop: "stddev_pop",
    exp.Variance: "var_samp",
    exp.VariancePop: "var_pop",
}


def quantile_measures(
    node: exp.Expr, table: TableConfig, alias: str, grouped: bool
) -> tuple[list[Measure], QuantileGrid]:
    """The measure of one quantile call (the count of values; the statement brings its
    fine histogram beside it) and the grid."""
    name, p, arg = _quantile_call(node)
    column = bounded_column(arg, table, alias, name)
    col = table.columns[column.name]
    rows, _ = contribution_bounds(table, grouped)
    grid = quantile_grid(col.type, float(col.lower or 0.0), float(col.upper or 0.0), p, rows)
    sensitivity = uniform_sensitivity(rows)  # of the count; it is never noised
    return [Measure("histogram", sensitivity, expression=column)], grid


def quantile_grid(ctype: str, lower: float, upper: float, p: Fraction, rows: int) -> QuantileGrid:
    """The public grid of a column declared [lower, upper] (a function of the schema only).

    An integer column with at most ``MAX_BUCKETS`` values: one bucket per value, released
    as itself. Otherwise buckets of width w = 2^k from the lower bound (the smallest power
    of two with at most ``MAX_BUCKETS`` buckets in the range, at least 1 for integers),
    each released as the middle of its part of [lower, upper]. Widths and bounds are
    exact as SQL literals on every backend.
    """
    lo, hi = Fraction(lower), Fraction(upper)
    span = hi - lo
    if ctype == "integer" and span + 1 <= MAX_BUCKETS:
        return QuantileGrid(p, lo, hi, Fraction(1), int(span) + 1, rows)
    k = math.ceil(math.log2(span / MAX_BUCKETS)) if span > 0 else 0
    width = Fraction(2) ** k
    while span / width > MAX_BUCKETS:  # guard the float log against rounding
        width *= 2
    while span / (width / 2) <= MAX_BUCKETS and span > 0:
        width /= 2
    if ctype == "integer":
        width = max(width, Fraction(1))
    buckets = max(1, math.ceil(span / width))
    return QuantileGrid(p, lo, hi, width, buckets, rows)


def _quantile_call(node: exp.Expr) -> tuple[str, Fraction, exp.Expr]:
    """(name, p, argument) of a quantile call; refuses the forms with no bounded meaning."""
    if isinstance(node, exp.WithinGroup):
        inner = node.this
        if not isinstance(inner, exp.PercentileCont):
            raise UnsupportedQuery(
                f"{_name(inner)} … WITHIN GROUP is not supported: use PERCENTILE_CONT(p) "
                "WITHIN GROUP (ORDER BY col)",
                construct=f"{_name(inner)} WITHIN GROUP",
            )
        p = _fraction_literal(inner.this)
        order = node.expression
        ordered = order.expressions if isinstance(order, exp.Order) else []
        if len(ordered) != 1:
            raise UnsupportedQuery(
                "PERCENTILE_CONT needs WITHIN GROUP (ORDER BY one column)",
                construct="PERCENTILE_CONT ordering",
            )
        key = ordered[0]
        if isinstance(key, exp.Ordered) and key.args.get("desc"):
            p = 1 - p  # the p-quantile of a descending order is the (1−p)-quantile
        return "PERCENTILE_CONT", p, key.this if isinstance(key, exp.Ordered) else key
    if node.args.get("expressions"):
        raise UnsupportedQuery(
            f"{_name(node)} takes one column", construct=f"{_name(node)} arguments"
        )
    extremes: dict[type[exp.Expr], Fraction] = {
        exp.Median: Fraction(1, 2),
        exp.Min: Fraction(0),
        exp.Max: Fraction(1),
    }
    p = extremes[type(node)]
    arg = node.this
    if isinstance(arg, exp.Distinct):
        raise UnsupportedQuery(
            f"{_name(node)}(DISTINCT …) is not supported",
            construct=f"{_name(node)}(DISTINCT)",
        )
    return _name(node), p, arg


def _name(node: exp.Expr) -> str:
    """The SQL name of an aggregate call, as the analyst would write it."""
    return node.sql_name() if isinstance(node, exp.Func) else node.key.upper()


def _fraction_literal(node: exp.Expr | None) -> Fraction:
    if not isinstance(node, exp.Literal) or node.is_string:
        raise UnsupportedQuery(
            "PERCENTILE_CONT(p) needs p as a number literal between 0 and 1",
            construct="PERCENTILE_CONT fraction",
        )
    try:
        p = Fraction(node.this)
    except (ValueError, ZeroDivisionError):
        p = Fraction(-1)
    if not 0 <= p <= 1:
        raise UnsupportedQuery(
            f"PERCENTILE_CONT({node.this}): p must be between 0 and 1",
            construct="PERCENTILE_CONT fraction",
        )
    return p


def spread_measures(
    node: exp.Expr, table: TableConfig, alias: str, grouped: bool
) -> tuple[OutputKind, list[Measure]]:
    """The output kind of VARIANCE / STDDEV and its measures: (sum, sum of squares, count)
    of the column clamped to its declared bounds."""
    kind = _SPREAD_KINDS[type(node)]
    name = _name(node)
    if isinstance(node.this, exp.Distinct):
        raise UnsupportedQuery(
            f"{name}(DISTINCT …) is not supported", construct=f"{name}(DISTINCT)"
        )
    column = bounded_column(node.this, table, alias, name)
    total, count = measures_for(exp.Avg(this=node.this.copy()), table, alias, grouped)
    col = table.columns[column.name]
    lower, upper = float(col.lower or 0.0), float(col.upper or 0.0)
    square_hi = max(lower * lower, upper * upper)
    square_lo = 0.0 if lower <= 0 <= upper else min(lower * lower, upper * upper)
    rows, _ = contribution_bounds(table, grouped)
    squares = summed_measure(
        "sum_squares", column, col.type, (lower, upper), (square_lo, square_hi), rows
    )
    return kind, [total, squares, count]
