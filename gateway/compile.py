"""Compilation: a QueryPlan → one aggregate SQL statement in the target dialect.

The analyst's text is never sent to the database: the statement is rebuilt from the plan
with sqlglot. It enforces, inside the SQL,

- the domain model (``gateway/domain.py``): only rows inside every column's declared
  domain are read, and bounded numbers are clamped wherever they are read;
- clamping of every summed value to its declared [lower, upper], then rounding to the
  measure's grid (``resolution``), summed as integers;
- per-unit contribution bounding: at most ``max_rows_per_unit`` rows per privacy unit
  (``ROW_NUMBER() OVER (PARTITION BY unit …)``) and, with GROUP BY, at most
  ``max_groups_per_unit`` groups (``DENSE_RANK``), so the sensitivities in the plan hold
  whatever the data is (docs/design.md, invariant 6: influence is bounded in the
  executed SQL);
- for keys that are not public, the number of distinct units per group, which partition
  selection thresholds.

The statement returns one row per group: the key values, then one exact integer per
measure, then (with partition selection) the unit count.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from sqlglot import exp

from gateway.config import TableConfig
from gateway.domain import row_filter
from gateway.plan import GroupKey, Measure, QueryPlan
from gateway.portable import portable

UNIT = "dp_unit"
ROW_RANK = "dp_row_rank"
READ_RANK = "dp_read_rank"
GROUP_RANK = "dp_group_rank"


@dataclass(frozen=True)
class CompiledQuery:
    """The SQL text to run, and how to read its result rows."""

    sql: str
    n_keys: int
    n_measures: int
    has_unit_count: bool


def compile_plan(
    plan: QueryPlan, table: TableConfig, dialect: str, *, unit_unique: bool = False
) -> CompiledQuery:
    """Build the one statement that computes ``plan``'s exact measures in ``dialect``.

    ``unit_unique``: the database itself keeps the privacy unit column unique (primary key
    or unique constraint) and the bound is one row per unit, so no window is needed.
    """
    keys = [_group_key(k, table, dialect) for k in plan.group_keys]
    where = portable(plan.where, table, dialect) if plan.where is not None else None
    domain = row_filter(table)
    if domain is not None:
        # the rows inside the declared domain are the table (gateway/domain.py)
        where = domain if where is None else exp.and_(domain, exp.Paren(this=where))
    inputs = [_measure_input(m, table, dialect) for m in plan.measures]
    rows_bound = table.max_rows_per_unit if table.privacy_unit else None
    if unit_unique and rows_bound == 1:
        rows_bound = None  # one row per unit, enforced by the database's own constraint
    groups_bound = None
    if table.privacy_unit and keys and table.max_groups_per_unit is not None:
        groups_bound = min(table.max_groups_per_unit, table.max_rows_per_unit)
        if groups_bound >= table.max_rows_per_unit:
            groups_bound = None  # already implied by the row bound
    selection = plan.needs_partition_selection
    source: exp.Expr = exp.Table(
        this=exp.to_identifier(table.sql_name, quoted=True),
        db=exp.to_identifier(table.schema, quoted=True) if table.schema else None,
    )
    needs_units = any(m.kind == "count_units" for m in plan.measures) or selection

    if rows_bound is None:
        # Each row is its own unit (row-level privacy, or a unique unit column).
        unit_column = exp.column(table.privacy_unit, quoted=True) if table.privacy_unit else None
        aggregates = [
            _aggregate(m, inp, unit=unit_column)
            for m, inp in zip(plan.measures, inputs, strict=True)
        ]
        if selection:
            aggregates.append(exp.Count(this=exp.Star()))
        query = exp.select(*_aliased(keys, "k"), *_aliased(aggregates, "m")).from_(source)
        if where is not None:
            query = query.where(where)
    else:
        unit = exp.column(table.privacy_unit or "", quoted=True)
        source, where = _read_bounded(source, where, table, unit)
        inner_cols: list[exp.Expr] = [exp.alias_(unit, UNIT, quoted=True)]
        inner_cols += _aliased(keys, "k")
        inner_cols += _aliased([i for i in inputs if i is not None], "v")
        # Which rows a unit keeps must be a deterministic function of that unit's rows
        # (the same on every backend, and for the cache): order by every kept column.
        order = [k.copy() for k in keys] + [i.copy() for i in inputs if i is not None]
        order = order or [unit.copy()]
        inner_cols.append(
            exp.alias_(
                exp.Window(
                    this=exp.RowNumber(),
                    partition_by=[unit.copy()],
                    order=exp.Order(expressions=[exp.Ordered(this=o) for o in order]),
                ),
                ROW_RANK,
                quoted=True,
            )
        )
        if groups_bound is not None:
            inner_cols.append(
                exp.alias_(
                    exp.Window(
                        this=exp.func("DENSE_RANK"),
                        partition_by=[unit.copy()],
                        order=exp.Order(expressions=[exp.Ordered(this=k.copy()) for k in keys]),
                    ),
                    GROUP_RANK,
                    quoted=True,
                )
            )
        inner = exp.select(*inner_cols).from_(source)
        if where is not None:
            inner = inner.where(where)
        bounded: exp.Expr = exp.column(ROW_RANK, quoted=True) <= exp.Literal.number(rows_bound)
        if groups_bound is not None:
            bounded = exp.and_(
                bounded, exp.column(GROUP_RANK, quoted=True) <= exp.Literal.number(groups_bound)
            )
        outer_keys: list[exp.Expr] = [exp.column(f"k{i}", quoted=True) for i in range(len(keys))]
        aggregates = []
        v = 0
        for m, inp in zip(plan.measures, inputs, strict=True):
            ref = None
            if inp is not None:
                ref = exp.column(f"v{v}", quoted=True)
                v += 1
            aggregates.append(_aggregate(m, ref, unit=exp.column(UNIT, quoted=True)))
        if selection:
            aggregates.append(
                exp.Count(this=exp.Distinct(expressions=[exp.column(UNIT, quoted=True)]))
            )
        query = (
            exp.select(*_aliased(outer_keys, "k"), *_aliased(aggregates, "m"))
            .from_(exp.Subquery(this=inner, alias=exp.TableAlias(this=exp.to_identifier("b"))))
            .where(bounded)
        )
        keys = outer_keys
        del needs_units
    if keys:
        query = query.group_by(*[exp.column(f"k{i}", quoted=True) for i in range(len(keys))])
    return CompiledQuery(
        sql=query.sql(dialect=dialect),
        n_keys=len(plan.group_keys),
        n_measures=len(plan.measures),
        has_unit_count=selection,
    )


def _read_bounded(
    source: exp.Expr, where: exp.Expr | None, table: TableConfig, unit: exp.Expr
) -> tuple[exp.Expr, exp.Expr]:
    """Read at most ``table.rows_read_bound`` of each unit's stored rows, chosen by their
    declared values alone, before any of the analyst's expressions is evaluated.

    The WHERE clause, the group keys and the measure inputs are evaluated only on those
    rows (the CASE fixes the order: the rank is tested first), so one person adds at most
    that many rows' worth of work to the statement, however many rows they have stored —
    otherwise a costly expression selected by a secret would make the statement time
    out exactly when that person has many rows. The contribution bound
    (``max_rows_per_unit``) then applies among the rows read."""
    columns = [c for c in table.columns if c != table.privacy_unit]
    order = [exp.Ordered(this=exp.column(c, quoted=True)) for c in columns] or [
        exp.Ordered(this=unit.copy())
    ]
    ranked = exp.select(
        exp.Star(),
        exp.alias_(
            exp.Window(
                this=exp.RowNumber(),
                partition_by=[unit.copy()],
                order=exp.Order(expressions=order),
            ),
            READ_RANK,
            quoted=True,
        ),
    ).from_(source)
    read = exp.column(READ_RANK, quoted=True) <= exp.Literal.number(table.rows_read_bound)
    guarded = (
        read
        if where is None
        else exp.Case(ifs=[exp.If(this=read, true=exp.Paren(this=where))], default=exp.false())
    )
    return exp.Subquery(this=ranked, alias=exp.TableAlias(this=exp.to_identifier("r"))), guarded


def _aliased(nodes: Sequence[exp.Expr], prefix: str) -> list[exp.Expr]:
    return [exp.alias_(n, f"{prefix}{i}", quoted=True) for i, n in enumerate(nodes)]


def _group_key(key: GroupKey, table: TableConfig, dialect: str) -> exp.Expr:
    """A group key's SQL. Dates are read as text: a date outside Python's range
    (PostgreSQL's 'infinity', year 0) would otherwise fail in the driver after the
    statement ran."""
    value = portable(key.expression, table, dialect)
    if key.type == "date":
        return exp.Cast(this=value, to=exp.DataType.build("TEXT"))
    return value


def _measure_input(m: Measure, table: TableConfig, dialect: str) -> exp.Expr | None:
    """The per-row value a measure aggregates (None for COUNT(*) and unit counts)."""
    if m.expression is None:
        return None
    value = portable(m.expression, table, dialect)
    if m.kind != "sum":
        return value
    assert m.lower is not None and m.upper is not None
    lower, upper = _number(m.lower), _number(m.upper)
    ifs = [
        exp.If(this=exp.LT(this=value.copy(), expression=lower), true=lower.copy()),
        exp.If(this=exp.GT(this=value.copy(), expression=upper), true=upper.copy()),
    ]
    steps = 1 / m.resolution
    if steps != 1:
        # Values under a quarter step round to 0 anyway; sending them to 0 first keeps
        # value × steps from underflowing, which PostgreSQL's doubles report as an error
        # (a subnormal value times 2^-k).
        quarter = _fraction(m.resolution / 4)
        ifs.append(
            exp.If(
                this=exp.and_(
                    exp.GT(this=value.copy(), expression=exp.Neg(this=quarter.copy())),
                    exp.LT(this=value.copy(), expression=quarter.copy()),
                ),
                true=exp.Literal.number(0),
            )
        )
    clamped = exp.Case(ifs=ifs, default=value)
    scaled: exp.Expr = clamped
    if steps != 1:
        scaled = exp.Mul(this=exp.Paren(this=clamped), expression=_fraction(steps))
    elif table.columns[m.expression.name].type == "integer":
        return clamped  # whole numbers clamped to whole bounds: nothing to round
    return exp.Cast(this=exp.Round(this=scaled), to=exp.DataType.build("BIGINT"))


def _aggregate(m: Measure, value: exp.Expr | None, unit: exp.Expr | None) -> exp.Expr:
    if m.kind == "count_rows":
        return exp.Count(this=exp.Star())
    if m.kind == "count_units":
        if unit is None:
            return exp.Count(this=exp.Star())
        return exp.Count(this=exp.Distinct(expressions=[unit.copy()]))
    assert value is not None
    if m.kind == "count_values":
        return exp.Count(this=value)
    return exp.Coalesce(this=exp.Sum(this=value), expressions=[exp.Literal.number(0)])


def _number(x: float) -> exp.Expr:
    if float(x).is_integer():
        literal = exp.Literal.number(int(x))
    else:
        literal = exp.Literal.number(repr(float(x)))
    return exp.Neg(this=exp.Literal.number(str(literal.this).lstrip("-"))) if x < 0 else literal


def _fraction(f: Fraction) -> exp.Expr:
    if f.denominator == 1:
        return exp.Literal.number(f.numerator)
    return exp.Literal.number(repr(float(f)))  # powers of two are exact in binary floating point
