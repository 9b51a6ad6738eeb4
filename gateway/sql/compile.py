"""Compilation: a QueryPlan → one aggregate SQL statement in the target dialect.

The analyst's text is never sent to the database: the statement is rebuilt from the plan
with sqlglot. It enforces, inside the SQL,

- the domain model (``gateway/core/domain.py``): only rows inside every column's declared
  domain are read, and bounded numbers are clamped wherever they are read;
- clamping of every summed value to its declared [lower, upper], then rounding to the
  measure's grid (``resolution``), summed as integers;
- per-unit read bounding: with an analyst's WHERE, it is evaluated on at most
  ``rows_read_bound`` of each unit's rows, chosen by their declared values
  (``_read_bounded``); where that bound is ``max_rows_per_unit`` itself, the rows read
  and passing are the rows kept, with no second window;
- per-unit contribution bounding: at most ``max_rows_per_unit`` rows per privacy unit
  (``ROW_NUMBER() OVER (PARTITION BY unit …)``, or per-unit counts capped at the bound
  when the query only counts) and, with GROUP BY, at most ``max_groups_per_unit``
  groups (``DENSE_RANK``), so the sensitivities in the plan hold whatever the data is
  (docs/design.md, invariant 6: influence is bounded in the executed SQL);
- for keys that are not public, the number of distinct units per group, which partition
  selection thresholds.

The statement returns one row per group: the key values, then one exact integer per
measure, then (with partition selection) the unit count.

Which of a unit's rows are read and kept is a deterministic function of that unit's
declared values (the same on every backend, and for the answer cache): windows order by
the declared columns the query reads, and by nothing when it reads none — rows that agree
on every column a query reads give it the same answer whichever of them is kept.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import NamedTuple

from sqlglot import exp

from gateway.core.config import TableConfig
from gateway.core.domain import row_filter
from gateway.core.plan import GroupKey, Measure, QuantileGrid, QueryPlan
from gateway.sql import dialects
from gateway.sql.compile_joins import joined, multiplies, with_row_unit
from gateway.sql.compile_values import (
    bucket_index,
    clamped_value,
    fraction_literal,
    histogram_input,
    near_rank,
    number_literal,
    squares_input,
)
from gateway.sql.engines.dialects import for_engine
from gateway.sql.join_keys import JoinKeys
from gateway.sql.portable import data_type, portable
from gateway.sql.row_work import row_operations
from mechanisms import quantile_sensitivity
from mechanisms.histogram_quantile import MAX_LEVELS, window_ranks_at_cap

UNIT = "dp_unit"
ROW_RANK = "dp_row_rank"
READ_RANK = "dp_read_rank"
GROUP_RANK = "dp_group_rank"
UNIT_ROWS = "dp_unit_rows"

#: Counting measures: they read no value of the rows they count.
_COUNTS = ("count_rows", "count_units")
#: A catalogue that proves nothing about any join (the safe default).
NO_JOIN_FACTS = JoinKeys()


@dataclass(frozen=True)
class CompiledQuery:
    """The SQL text to run, and how to read its result rows."""

    sql: str
    n_keys: int
    n_measures: int
    has_unit_count: bool
    #: With quantiles, every row ends with ``HISTOGRAM_COLUMNS`` more columns (quantile,
    #: bucket, count, values below the bucket, values in the cell): NULL on the aggregate
    #: rows, set on the rows of each quantile's fine histogram near its target rank.
    n_histograms: int = 0
    #: The operations the statement evaluates per row it reads (``gateway/sql/row_work.py``):
    #: the cost model's measure of its expressions.
    row_ops: float = 0.0


def compile_plan(
    plan: QueryPlan,
    table: TableConfig,
    dialect: str,
    *,
    unit_unique: bool = False,
    join_keys: JoinKeys = NO_JOIN_FACTS,
    rank_windows: Sequence[Fraction] | None = None,
) -> CompiledQuery:
    """Build the one statement that computes ``plan``'s exact measures in ``dialect``.

    ``rank_windows``: per quantile output, in order, the ranks W either side of its
    target rank outside which every bucket is at its mechanism's level cap
    (``mechanisms.window_ranks``, from the quantile's ε); the statement returns the
    buckets that meet that window only. Without them, the widest window any ε needs
    (``mechanisms.window_ranks`` at the largest level cap), which is correct, only larger.

    ``unit_unique``: the database itself keeps the privacy unit column unique (primary key
    or unique constraint, on a column whose domain excludes NULL) and the bound is one row
    per unit, so no window is needed. ``join_keys``: what the catalogue proves about the
    declared references' equality on this engine (``gateway/sql/join_keys.py``); the default
    proves nothing, and every join that could repeat a row is bounded after it.
    """
    row_unit = False
    if plan.join is not None:
        # Each table's domain applied before the join (gateway/sql/compile_joins.py);
        # bounding, on the anchor's unit, comes after it. Where the relation provably
        # holds each anchor row at most once, a unique unit stays unique; where it may
        # not, every unit's rows are bounded after the join, whatever the catalogue says
        # (issue 31), and a row-level anchor's rows are numbered to be bounded as units.
        table = plan.join.relation
        if multiplies(plan, join_keys, dialect):
            unit_unique = False
            if table.privacy_unit is None:
                row_unit = True
                table = with_row_unit(table)
    keys = [_group_key(k, table, dialect) for k in plan.group_keys]
    where = portable(plan.where, table, dialect) if plan.where is not None else None
    domain = _domain_placeholder(table, dialect) if plan.join is None else None
    inputs = [_measure_input(m, table, dialect) for m in plan.measures]
    rows_bound = table.max_rows_per_unit if table.privacy_unit else None
    if unit_unique and rows_bound == 1:
        rows_bound = None  # one row per unit, enforced by the database's own constraint
    selection = plan.needs_partition_selection
    source = (
        _stored(table) if plan.join is None else joined(plan, join_keys, dialect, row_unit=row_unit)
    )
    if rows_bound is None:
        query = _unbounded(plan, table, keys, where, domain, inputs, source, unit_unique)
    else:
        query = _Bounded(plan, table, dialect, rows_bound).query(
            keys, where, domain, inputs, source
        )
    if keys:
        query = query.group_by(*[exp.column(f"k{i}", quoted=True) for i in range(len(keys))])
    histograms = [o.quantile for o in plan.outputs if o.quantile is not None]
    statement: exp.Query = (
        _with_histograms(query, plan, len(keys), rank_windows) if histograms else query
    )
    statement = for_engine(statement, table, dialect, plan.join.tables if plan.join else None)
    # The tree is this call's own (no node of the plan is in it), so the generator may
    # work on it in place: copying it cost a third of compiling.
    row_ops = row_operations(statement)
    sql = statement.sql(dialect=dialects.dialect(dialect), copy=False)
    if isinstance(domain, exp.Column) and domain.name == _DOMAIN_MARK:
        placed = _placed(statement)
        sql = _with_domain_filter(sql, table, dialect, statement, placed)
        row_ops += _domain_sql[(id(table), dialect)].row_ops * placed
    return CompiledQuery(
        sql=sql,
        n_keys=len(plan.group_keys),
        n_measures=len(plan.measures),
        has_unit_count=selection,
        n_histograms=len(histograms),
        row_ops=row_ops,
    )


# The domain filter (gateway/core/domain.py) depends on the table only, yet generating its
# SQL — an IN list per declared column — was a third of compiling a query. Each
# statement carries this placeholder column where the filter goes; the filter's own
# SQL, generated once per table and dialect, then replaces it. The placeholder holds a
# quote character, which the generator escapes inside any string literal or identifier,
# so its rendering can appear in a statement only where it was put.
_DOMAIN_MARK = "dp'domain_filter"
# The dialects whose statements ``for_engine`` leaves as they are (gateway/sql/engines/).
_PLACEHOLDER_DIALECTS = ("sqlite", "postgres", "duckdb")


class _DomainFilter(NamedTuple):
    """A table's domain filter in one dialect, generated once."""

    table: TableConfig  # the config it was made for (a key's id may be reused)
    mark: str  # the placeholder's SQL
    sql: str  # the filter's SQL
    row_ops: float  # the operations it evaluates per row (``gateway/sql/row_work.py``)


# (table id, dialect) → its domain filter
_domain_sql: dict[tuple[int, str], _DomainFilter] = {}


def _domain_placeholder(table: TableConfig, dialect: str) -> exp.Expr | None:
    """The placeholder of ``table``'s domain filter (None: every row is in the domain)."""
    if dialect not in _PLACEHOLDER_DIALECTS:  # engine rewrites must see the filter
        return row_filter(table)
    key = (id(table), dialect)
    cached = _domain_sql.get(key)
    if cached is None or cached.table is not table:
        condition = row_filter(table)
        if condition is None:
            return None
        sqlglot_dialect = dialects.dialect(dialect)
        mark = exp.column(_DOMAIN_MARK, quoted=True).sql(dialect=sqlglot_dialect)
        cached = _DomainFilter(
            table,
            mark,
            exp.Paren(this=condition).sql(dialect=sqlglot_dialect),
            row_operations(condition),
        )
        _domain_sql[key] = cached
    return exp.column(_DOMAIN_MARK, quoted=True)


def _with_domain_filter(
    sql: str, table: TableConfig, dialect: str, query: exp.Expr, placed: int
) -> str:
    """``sql`` with the domain filter's SQL in place of its ``placed`` placeholders."""
    cached = _domain_sql[(id(table), dialect)]
    mark, filter_sql = cached.mark, cached.sql
    if sql.count(mark) != placed:  # e.g. a comment quoting it: generate the filter in place
        for node in list(query.find_all(exp.Column)):
            if node.name == _DOMAIN_MARK:
                node.replace(exp.Paren(this=row_filter(table)))
        return query.sql(dialect=dialects.dialect(dialect), copy=False)
    return sql.replace(mark, filter_sql)


def _placed(query: exp.Expr) -> int:
    """How many domain filter placeholders ``query`` holds."""
    return sum(1 for c in query.find_all(exp.Column) if c.name == _DOMAIN_MARK)


def _stored(table: TableConfig) -> exp.Table:
    """A declared table as the database names it."""
    return exp.Table(
        this=exp.to_identifier(table.sql_name, quoted=True),
        db=exp.to_identifier(table.schema, quoted=True) if table.schema else None,
    )


def _unbounded(
    plan: QueryPlan,
    table: TableConfig,
    keys: list[exp.Expr],
    where: exp.Expr | None,
    domain: exp.Expr | None,
    inputs: list[exp.Expr | None],
    source: exp.Expr,
    unit_unique: bool,
) -> exp.Select:
    """Each row is its own unit (row-level privacy, or a unique unit column): one
    aggregate over the rows inside the domain that pass the WHERE."""
    if domain is not None:
        # the rows inside the declared domain are the table (gateway/core/domain.py)
        where = domain if where is None else exp.and_(domain, exp.Paren(this=where), copy=False)
    unit: exp.Expr | None = None
    if table.privacy_unit and not unit_unique:
        unit = exp.column(table.privacy_unit, quoted=True)
    # With a unique unit column (whose domain excludes NULL), every row is a distinct
    # unit: COUNT(DISTINCT unit) is COUNT(*), without the hash of every unit.
    aggregates = [
        _aggregate(m, inp, unit=unit) for m, inp in zip(plan.measures, inputs, strict=True)
    ]
    if plan.needs_partition_selection:
        aggregates.append(exp.Count(this=exp.Star()))
    query = exp.select(*_aliased(keys, "k"), *_aliased(aggregates, "m")).from_(source, copy=False)
    return query.where(where, copy=False) if where is not None else query


class _Bounded:
    """The statement for a table whose rows per unit are bounded in the SQL."""

    def __init__(self, plan: QueryPlan, table: TableConfig, dialect: str, rows_bound: int):
        self.plan = plan
        self.table = table
        self.dialect = dialect
        self.rows_bound = rows_bound
        self.unit = exp.column(table.privacy_unit or "", quoted=True)
        groups_bound = None
        if plan.group_keys and table.max_groups_per_unit is not None:
            groups_bound = min(table.max_groups_per_unit, table.max_rows_per_unit)
            if groups_bound >= rows_bound:
                groups_bound = None  # already implied by the row bound
        self.groups_bound = groups_bound

    def query(
        self,
        keys: list[exp.Expr],
        where: exp.Expr | None,
        domain: exp.Expr | None,
        inputs: list[exp.Expr | None],
        source: exp.Expr,
    ) -> exp.Select:
        # The rows inside the declared domain are the table (gateway/core/domain.py): the
        # filter reads declared columns against declared values only, so it runs first.
        # Only the unit and the columns the query reads are carried through the windows
        # (SQLite and DuckDB materialise every column a window's input has).
        read = self.columns_read()
        rows = exp.select(self.unit.copy(), *[exp.column(c, quoted=True) for c in read]).from_(
            source
        )
        if domain is not None:
            rows = rows.where(domain)
        # The order that picks a unit's rows: its declared values, on the columns the
        # query reads (see the module doc).
        order: list[exp.Expr] = [exp.column(c, quoted=True) for c in read]
        if where is not None:
            rows = _read_bounded(rows, where, self.table, self.unit, order)
            order = [exp.column(READ_RANK, quoted=True)]
        if not keys and all(m.kind in _COUNTS for m in self.plan.measures):
            return self.counts_only(rows)
        if where is not None and self.table.rows_read_bound <= self.rows_bound:
            # At most ``rows_bound`` of a unit's rows were read, so at most that many
            # pass the WHERE: the row bound holds already, and its window would keep
            # every one of them (on SQLite a window costs ten scans: bench/README.md).
            return self.aggregate(rows, keys, inputs)
        kept = self.first_rows(rows, order)
        return self.aggregate(kept, keys, inputs)

    def columns_read(self) -> list[str]:
        """The declared columns (the unit aside) that the WHERE, the group keys or the
        measures read, in declared order."""
        nodes = [self.plan.where] if self.plan.where is not None else []
        nodes += [k.expression for k in self.plan.group_keys]
        nodes += [m.expression for m in self.plan.measures if m.expression is not None]
        names = {c.name for n in nodes for c in n.find_all(exp.Column)}
        return [c for c in self.table.columns if c in names and c != self.table.privacy_unit]

    def counts_only(self, rows: exp.Select) -> exp.Select:
        """An ungrouped query that only counts rows and units reads no value of the rows
        it keeps, so any of a unit's rows will do: each unit counts min(its rows,
        ``max_rows_per_unit``). The NULL unit, if any, is one unit's rows (like a window
        partition), and not a unit for COUNT(DISTINCT). The form is the fastest measured
        on each backend at 10M rows (bench/README.md, "Scale"):

        - one row per unit, SQLite and PostgreSQL: COUNT(DISTINCT unit), plus one when
          some rows have no unit;
        - DuckDB, and PostgreSQL past one row: ROW_NUMBER() with no ORDER BY, capped;
        - SQLite past one row: per-unit counts capped at the bound (its windows are slow).
        """
        unit_count = exp.Count(this=exp.Distinct(expressions=[self.unit.copy()]))
        if self.rows_bound == 1 and self.dialect in ("sqlite", "postgres"):
            rows_count: exp.Expr = unit_count.copy()
            if self.table.columns[self.table.privacy_unit or ""].may_be_null:
                no_unit = exp.Case(
                    ifs=[
                        exp.If(
                            this=exp.Is(this=self.unit.copy(), expression=exp.Null()),
                            true=exp.Literal.number(1),
                        )
                    ],
                    default=exp.Literal.number(0),
                )
                rows_count = exp.Add(
                    this=rows_count,
                    expression=exp.Coalesce(
                        this=exp.Max(this=no_unit), expressions=[exp.Literal.number(0)]
                    ),
                )
            return self._counted(rows, rows_count, unit_count)
        if self.dialect != "sqlite":
            kept = self.first_rows(rows, [], qualify=False)
            return self._counted(kept, exp.Count(this=exp.Star()), unit_count)
        bound = exp.Literal.number(self.rows_bound)
        per_unit = (
            exp.select(
                exp.alias_(self.unit.copy(), UNIT, quoted=True),
                exp.alias_(exp.Count(this=exp.Star()), UNIT_ROWS, quoted=True),
            )
            .from_(exp.Subquery(this=rows, alias=exp.TableAlias(this=exp.to_identifier("b"))))
            .group_by(self.unit.copy())
        )
        n = exp.column(UNIT_ROWS, quoted=True)
        capped = exp.Case(
            ifs=[exp.If(this=exp.GT(this=n.copy(), expression=bound), true=bound.copy())],
            default=n.copy(),
        )
        return self._counted(
            per_unit,
            exp.Coalesce(this=exp.Sum(this=capped), expressions=[exp.Literal.number(0)]),
            exp.Count(this=exp.column(UNIT, quoted=True)),
        )

    def _counted(self, rows: exp.Select, rows_count: exp.Expr, unit_count: exp.Expr) -> exp.Select:
        aggregates = [
            (unit_count if m.kind == "count_units" else rows_count).copy()
            for m in self.plan.measures
        ]
        return exp.select(*_aliased(aggregates, "m")).from_(
            exp.Subquery(this=rows, alias=exp.TableAlias(this=exp.to_identifier("u")))
        )

    def first_rows(
        self, rows: exp.Select, order: list[exp.Expr], *, qualify: bool = True
    ) -> exp.Select:
        """Each unit's first ``max_rows_per_unit`` rows of ``rows`` in ``order`` (QUALIFY
        on DuckDB unless ``qualify`` is false; elsewhere a rank column and a filter one
        level up)."""
        rank = exp.Window(
            this=exp.RowNumber(),
            partition_by=[self.unit.copy()],
            order=exp.Order(expressions=[exp.Ordered(this=o.copy()) for o in order])
            if order
            else None,
        )
        bound = exp.Literal.number(self.rows_bound)
        if qualify and self.dialect == "duckdb":
            return rows.qualify(exp.LTE(this=rank, expression=bound))
        ranked = rows.select(exp.alias_(rank, ROW_RANK, quoted=True))
        return (
            exp.select(exp.Star())
            .from_(exp.Subquery(this=ranked, alias=exp.TableAlias(this=exp.to_identifier("w"))))
            .where(exp.LTE(this=exp.column(ROW_RANK, quoted=True), expression=bound))
        )

    def aggregate(
        self, kept: exp.Select, keys: list[exp.Expr], inputs: list[exp.Expr | None]
    ) -> exp.Select:
        """Group keys and measure inputs evaluated on the kept rows only, then the
        aggregates (over at most ``max_groups_per_unit`` groups of each unit)."""
        cols: list[exp.Expr] = [exp.alias_(self.unit.copy(), UNIT, quoted=True)]
        cols += _aliased(keys, "k")
        cols += _aliased([i for i in inputs if i is not None], "v")
        if self.groups_bound is not None:
            cols.append(
                exp.alias_(
                    exp.Window(
                        this=exp.func("DENSE_RANK"),
                        partition_by=[self.unit.copy()],
                        order=exp.Order(expressions=[exp.Ordered(this=k.copy()) for k in keys]),
                    ),
                    GROUP_RANK,
                    quoted=True,
                )
            )
        inner = exp.select(*cols).from_(
            exp.Subquery(this=kept, alias=exp.TableAlias(this=exp.to_identifier("r")))
        )
        unit = exp.column(UNIT, quoted=True)
        aggregates: list[exp.Expr] = []
        v = 0
        for m, inp in zip(self.plan.measures, inputs, strict=True):
            ref = None
            if inp is not None:
                ref = exp.column(f"v{v}", quoted=True)
                v += 1
            aggregates.append(_aggregate(m, ref, unit=unit))
        if self.plan.needs_partition_selection:
            aggregates.append(exp.Count(this=exp.Distinct(expressions=[unit.copy()])))
        outer_keys = [exp.column(f"k{i}", quoted=True) for i in range(len(keys))]
        query = exp.select(*_aliased(outer_keys, "k"), *_aliased(aggregates, "m")).from_(
            exp.Subquery(this=inner, alias=exp.TableAlias(this=exp.to_identifier("b")))
        )
        if self.groups_bound is not None:
            query = query.where(
                exp.LTE(
                    this=exp.column(GROUP_RANK, quoted=True),
                    expression=exp.Literal.number(self.groups_bound),
                )
            )
        return query


#: The bounded rows a statement with quantiles aggregates twice (CTE name).
BOUNDED_ROWS = "dp_bounded"
#: The columns every row of a statement with quantiles ends with (``CompiledQuery``).
HISTOGRAM_COLUMNS = 5
#: Window functions per quantile branch: over its histogram's non-empty buckets, never
#: over the table's rows (``gateway/pipeline/cost_model.py`` counts them apart).
HISTOGRAM_WINDOWS = 2
#: Ranks added to a quantile's window in SQL: the database compares positions with
#: p·(n − 1) in doubles (within 2^-12 of it for n < 2^40), so the window it keeps holds
#: the exact one.
WINDOW_MARGIN = 2


def _with_histograms(
    query: exp.Select, plan: QueryPlan, n_keys: int, rank_windows: Sequence[Fraction] | None
) -> exp.Query:
    """``query`` followed (UNION ALL) by one branch per quantile output: over the same
    rows, kept by the same bounding, the exact count of each (group, bucket) of the
    quantile's grid that holds a value, of which only the buckets near the target rank
    come back (``_near_target``). Rows of the first branch end with ``HISTOGRAM_COLUMNS``
    NULLs, of the others with the quantile's number, the bucket, its count, the values
    below it and the cell's values. One statement: the database scans once where it can
    (the bounded rows are a CTE both branches read)."""
    source = query.args["from_"].this
    if isinstance(source, exp.Subquery) and isinstance(source.this, exp.Select):
        shared: exp.Select | None = source.this
        query.set(
            "from_",
            exp.From(
                this=exp.Table(this=exp.to_identifier(BOUNDED_ROWS), alias=source.args["alias"])
            ),
        )
    else:
        shared = None
    n_values = len(query.expressions) - n_keys
    nothing = exp.Null()  # typed by the other branch (a CAST would make ClickHouse's
    # supertype of its UInt64 counts and Int64 sums a String)
    branches = [
        query.select(*_aliased([nothing.copy() for _ in range(HISTOGRAM_COLUMNS)], "h"), copy=False)
    ]
    quantiles = [o for o in plan.outputs if o.quantile is not None]
    for q, o in enumerate(quantiles):
        assert o.quantile is not None
        count = query.expressions[n_keys + o.measures[-1]].this  # COUNT(value) of the measure
        bucket = bucket_index(count.this, o.quantile)
        group = [e.this.copy() for e in query.expressions[:n_keys]]
        branch = exp.select(
            *_aliased(group, "k"),
            exp.alias_(bucket, "b", quoted=True),
            exp.alias_(count.copy(), "c", quoted=True),
        ).from_(query.args["from_"].copy(), copy=False)
        for join in query.args.get("joins") or []:
            branch = branch.join(join.copy(), copy=False)
        where = query.args.get("where")
        if where is not None:
            branch.set("where", where.copy())
        histogram = branch.group_by(*[g.copy() for g in group], bucket.copy(), copy=False)
        window = rank_windows[q] if rank_windows is not None else widest_window(o.quantile)
        branches.append(_near_target(histogram, q, n_keys, n_values, o.quantile.p, window))
    union: exp.Query = branches[0]
    for branch in branches[1:]:
        union = exp.union(union, branch, distinct=False, copy=False)
    if shared is not None:
        union = union.with_(BOUNDED_ROWS, as_=shared, copy=False)
    return union


def widest_window(grid: QuantileGrid) -> Fraction:
    """The rank window the smallest ε needs (its level cap is the largest)."""
    return window_ranks_at_cap(MAX_LEVELS, quantile_sensitivity(grid.p, grid.rows_per_unit))


def _near_target(
    histogram: exp.Select, q: int, n_keys: int, n_values: int, p: Fraction, window: Fraction
) -> exp.Select:
    """The rows of ``histogram`` (k0 …, b, c: one per group and bucket) whose positions
    [below, below + c] meet [t − W, t + W], t = p·(n − 1), each with its quantile number
    ``q``, below and n (window sums over the group's buckets in bucket order). How many
    come back is at most 2·(W + margin) + 2 per group, whatever the grid and the data
    (``mechanisms.choose_bucket_in_window``)."""
    keys = [exp.column(f"k{i}", quoted=True) for i in range(n_keys)]
    b, c = exp.column("b", quoted=True), exp.column("c", quoted=True)

    def over(ordered: bool) -> exp.Window:
        spec = exp.WindowSpec(
            kind="ROWS", start="UNBOUNDED", start_side="PRECEDING", end="CURRENT ROW"
        )
        return exp.Window(
            this=exp.Sum(this=c.copy()),
            partition_by=[k.copy() for k in keys] or None,
            order=exp.Order(expressions=[exp.Ordered(this=b.copy())]) if ordered else None,
            spec=spec if ordered else None,
        )

    ranked = exp.select(
        *[k.copy() for k in keys],
        b.copy(),
        c.copy(),
        exp.alias_(exp.Sub(this=over(True), expression=c.copy()), "below", quoted=True),
        exp.alias_(over(False), "n", quoted=True),
    ).from_(exp.Subquery(this=histogram, alias=exp.TableAlias(this=exp.to_identifier("dp_h"))))
    below, n = exp.column("below", quoted=True), exp.column("n", quoted=True)
    near = near_rank(below, c, n, p, number_literal(float(window) + WINDOW_MARGIN))
    return (
        exp.select(
            *_aliased([k.copy() for k in keys], "k"),
            *_aliased([exp.Null() for _ in range(n_values)], "m"),
            *_aliased([exp.Literal.number(q), b.copy(), c.copy(), below.copy(), n.copy()], "h"),
        )
        .from_(exp.Subquery(this=ranked, alias=exp.TableAlias(this=exp.to_identifier("dp_r"))))
        .where(near, copy=False)
    )


def _read_bounded(
    rows: exp.Select, where: exp.Expr, table: TableConfig, unit: exp.Expr, order: list[exp.Expr]
) -> exp.Select:
    """The rows of ``rows`` that pass the analyst's ``where``, evaluated on at most
    ``table.rows_read_bound`` of each unit's rows, chosen by their declared values alone
    (``order``), before any of the analyst's expressions is evaluated.

    The WHERE clause, and then the group keys and the measure inputs, are evaluated only
    on those rows (the CASE fixes the order: the rank is tested first), so one person adds
    at most that many rows' worth of work to the statement, however many rows they have
    stored — otherwise a costly expression selected by a secret would make the statement
    time out exactly when that person has many rows. The contribution bound
    (``max_rows_per_unit``) then applies among the rows read, in the same order."""
    ranked = rows.select(
        exp.alias_(
            exp.Window(
                this=exp.RowNumber(),
                partition_by=[unit.copy()],
                order=exp.Order(expressions=[exp.Ordered(this=o.copy()) for o in order])
                if order
                else None,
            ),
            READ_RANK,
            quoted=True,
        )
    )
    read = exp.column(READ_RANK, quoted=True) <= exp.Literal.number(table.rows_read_bound)
    guarded = exp.Case(ifs=[exp.If(this=read, true=exp.Paren(this=where))], default=exp.false())
    return (
        exp.select(exp.Star())
        .from_(exp.Subquery(this=ranked, alias=exp.TableAlias(this=exp.to_identifier("r"))))
        .where(guarded)
    )


def _aliased(nodes: Sequence[exp.Expr], prefix: str) -> list[exp.Expr]:
    return [exp.alias_(n, f"{prefix}{i}", quoted=True) for i, n in enumerate(nodes)]


def _group_key(key: GroupKey, table: TableConfig, dialect: str) -> exp.Expr:
    """A group key's SQL. Dates are read as text: a date outside Python's range
    (PostgreSQL's 'infinity', year 0) would otherwise fail in the driver after the
    statement ran."""
    value = portable(key.expression, table, dialect)
    if key.type == "date":
        return exp.Cast(this=value, to=data_type("TEXT"))
    return value


def _measure_input(m: Measure, table: TableConfig, dialect: str) -> exp.Expr | None:
    """The per-row value a measure aggregates (None for COUNT(*) and unit counts)."""
    if m.expression is None:
        return None
    if isinstance(m.expression, exp.Column) and m.kind == "count_values":
        # COUNT(column) counts the rows where it is not NULL, and clamping (the only
        # rewrite a bare column gets) keeps NULL as NULL and nothing else.
        return exp.column(m.expression.name, quoted=True)
    if m.kind == "histogram":
        return histogram_input(m)
    if m.kind == "sum_squares":
        return squares_input(m, table)
    if m.kind != "sum":
        return portable(m.expression, table, dialect)
    # SUM reads one bare declared column (gateway/sql/analyze/aggregates.py), clamped here,
    # once, to the measure's bounds — the column's own, so the domain's clamp is this one.
    assert isinstance(m.expression, exp.Column)
    steps = 1 / m.resolution
    column = table.columns[m.expression.name]
    if (
        steps == 1
        and column.type == "integer"
        and column.within_bounds
        and (m.lower, m.upper) == (column.lower, column.upper)
    ):
        # The database keeps every value whole and inside [lower, upper] (integral
        # storage and a CHECK admitting that interval only, read from its catalogue at
        # start-up: gateway/sql/constraints.py): the clamp and the CAST below would change
        # no row, so the SUM reads the column as stored — the raw query's own work.
        return exp.column(m.expression.name, quoted=True)
    # Values under a quarter step round to 0 anyway; sending them to 0 first keeps
    # value × steps from underflowing, which PostgreSQL's doubles report as an error
    # (a subnormal value times 2^-k).
    clamped = clamped_value(m, m.resolution / 4 if steps != 1 else None)
    if steps == 1 and column.type == "integer":
        # An integer column with whole bounds (the config refuses fractional ones) on a
        # grid of 1: the clamped value lies in [lower, upper], and needs no ROUND. The
        # CAST makes it a whole number in [lower, upper] whatever the database stores
        # (SQLite keeps 2.5 in an INTEGER column; a NUMERIC or DOUBLE column may be
        # declared integer): it rounds or truncates, and with whole bounds either stays
        # inside them, so one row moves the sum by at most max(|lower|, |upper|) and the
        # sum is exact integer arithmetic on every backend. Where the column is stored as
        # BIGINT, PostgreSQL and DuckDB drop the CAST when planning: it costs nothing.
        return exp.Cast(this=clamped, to=data_type("BIGINT"))
    scaled: exp.Expr = clamped
    if steps != 1:
        scaled = exp.Mul(this=exp.Paren(this=clamped), expression=fraction_literal(steps))
    return exp.Cast(this=exp.Round(this=scaled), to=data_type("BIGINT"))


def _aggregate(m: Measure, value: exp.Expr | None, unit: exp.Expr | None) -> exp.Expr:
    if m.kind == "count_rows":
        return exp.Count(this=exp.Star())
    if m.kind == "count_units":
        if unit is None:
            return exp.Count(this=exp.Star())
        return exp.Count(this=exp.Distinct(expressions=[unit.copy()]))
    assert value is not None
    if m.kind in ("count_values", "histogram"):
        return exp.Count(this=value)
    return exp.Coalesce(this=exp.Sum(this=value), expressions=[exp.Literal.number(0)])
