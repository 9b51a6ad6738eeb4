"""Pass 4: aggregates → measures, with the sensitivity each one has.

Sensitivities are under the add/remove-one-privacy-unit relation, after the compiled SQL
bounds each unit to ``max_rows_per_unit`` rows (and, with GROUP BY,
``max_groups_per_unit`` groups). They are in integer units: a SUM over a real column is
summed as integers on a grid of resolution 2^k, and its sensitivity is counted in grid
steps.
"""

from __future__ import annotations

import math
from dataclasses import replace
from fractions import Fraction

from sqlglot import exp

from gateway.core.config import TableConfig
from gateway.core.errors import UnsupportedQuery
from gateway.core.plan import Measure, MeasureKind
from gateway.sql.analyze.resolve import resolve_row_expression
from mechanisms import grid_center, grid_resolution, grid_sensitivity
from mechanisms.types import Sensitivity

AGGREGATES = (exp.Count, exp.Sum, exp.Avg)


def contribution_bounds(table: TableConfig, grouped: bool) -> tuple[int, int]:
    """(rows per unit, groups per unit) as enforced by the compiled SQL."""
    rows = table.max_rows_per_unit if table.privacy_unit else 1
    groups = rows
    if grouped and table.max_groups_per_unit is not None:
        groups = min(rows, table.max_groups_per_unit)
    return rows, groups


def _sqrt_upper(n: int) -> Fraction:
    """A rational upper bound of √n, exact when n is a perfect square."""
    r = math.isqrt(n)
    if r * r == n:
        return Fraction(r)
    return Fraction(math.ceil(math.sqrt(n) * 10**9) + 1, 10**9)


def measures_for(
    node: exp.Expr, table: TableConfig, alias: str, grouped: bool, *, centred: bool = False
) -> list[Measure]:
    """The measures behind one aggregate call: one for COUNT and SUM, (SUM, COUNT) for AVG.

    ``centred``: an AVG's SUM is of the values minus the grid point nearest the middle of
    their bounds (``Measure.center``), which the released average adds back."""
    rows, groups = contribution_bounds(table, grouped)
    name = node.key.upper()
    if node.args.get("filter") is not None:
        raise UnsupportedQuery(
            f"{name}(…) FILTER (WHERE …) is not supported: move the condition to WHERE",
            construct="FILTER clause",
        )
    if isinstance(node, exp.Count):
        arg = node.this
        if isinstance(arg, exp.Distinct):
            return [_count_distinct(arg, table, alias, groups)]
        if arg is None or isinstance(arg, exp.Star):
            return [Measure("count_rows", uniform_sensitivity(rows))]
        expr = resolve_row_expression(arg, table, alias, where="COUNT")
        return [Measure("count_values", uniform_sensitivity(rows), expression=expr)]
    arg = node.this
    if isinstance(arg, exp.Distinct):
        raise UnsupportedQuery(
            f"{name}(DISTINCT …) is not supported", construct=f"{name}(DISTINCT)"
        )
    column = bounded_column(arg, table, alias, name)
    col = table.columns[column.name]
    lower, upper = float(col.lower or 0.0), float(col.upper or 0.0)
    total = summed_measure("sum", column, col.type, (lower, upper), (lower, upper), rows)
    if isinstance(node, exp.Sum):
        return [total]
    if centred:
        center = grid_center(lower, upper, total.resolution)
        per_unit = grid_sensitivity(lower, upper, total.resolution, rows, center)
        total = replace(total, sensitivity=uniform_sensitivity(per_unit), center=center)
    return [total, Measure("count_values", uniform_sensitivity(rows), expression=column)]


def summed_measure(
    kind: MeasureKind,
    column: exp.Column,
    ctype: str,
    bounds: tuple[float, float],
    values: tuple[float, float],
    rows: int,
) -> Measure:
    """A SUM of a per-row value of ``column`` (clamped to ``bounds``) that lies in
    ``values``, on that range's grid. From the rounding the SQL performs (clamp, then
    ROUND half away from zero or half to even, depending on the backend): ⌈max|value| /
    resolution⌉ steps per row."""
    resolution = value_resolution(ctype, *values)
    return Measure(
        kind,
        uniform_sensitivity(grid_sensitivity(*values, resolution, rows)),
        expression=column,
        lower=bounds[0],
        upper=bounds[1],
        resolution=resolution,
    )


def bounded_column(arg: exp.Expr, table: TableConfig, alias: str, name: str) -> exp.Column:
    """The one declared numeric column with bounds that aggregate ``name`` reads."""
    column = resolve_row_expression(arg, table, alias, where=name)
    if not isinstance(column, exp.Column):
        raise UnsupportedQuery(
            f"{name} takes one declared numeric column with bounds, not an expression",
            construct=f"{name} of an expression",
        )
    col = table.columns[column.name]
    if not col.numeric or not col.bounded:
        raise UnsupportedQuery(
            f"{name}({col.name}) needs a numeric column with declared lower and upper bounds, "
            f"and {col.name} has none (GET /v1/schema lists each column's bounds; only the "
            "administrator can declare them)",
            construct=f"{name} of an unbounded column",
        )
    return column


#: Integer columns whose bounds stay within this magnitude are summed exactly (one step
#: per unit); larger ones are summed on a power-of-two grid like real columns, so that a
#: SUM over billions of rows cannot overflow 64-bit integers on any backend.
EXACT_INTEGER_SUM_BOUND = 2**31


def value_resolution(ctype: str, lower: float, upper: float) -> Fraction:
    """The grid a summed value is rounded to: 1 for integers of moderate size."""
    if ctype == "integer" and max(abs(lower), abs(upper)) <= EXACT_INTEGER_SUM_BOUND:
        return Fraction(1)
    return grid_resolution(lower, upper)


def _count_distinct(arg: exp.Distinct, table: TableConfig, alias: str, groups: int) -> Measure:
    unit = table.privacy_unit
    inner = arg.expressions
    if (
        unit is not None
        and len(inner) == 1
        and isinstance(inner[0], exp.Column)
        and inner[0].name.lower() == unit
        and (not inner[0].table or inner[0].table.lower() in (alias, table.name.lower()))
    ):
        return Measure(
            "count_units",
            Sensitivity(l1=Fraction(groups), l2=_sqrt_upper(groups), linf=Fraction(1)),
        )
    what = f"COUNT(DISTINCT {unit})" if unit else "COUNT(*) (each row is one person here)"
    raise UnsupportedQuery(
        f"COUNT(DISTINCT …) is supported only over the privacy unit: use {what}",
        construct="COUNT(DISTINCT) of a non-unit column",
    )


def uniform_sensitivity(bound: int | Fraction) -> Sensitivity:
    b = Fraction(bound)
    return Sensitivity(l1=b, l2=b, linf=b)
