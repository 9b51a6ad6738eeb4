"""QueryPlan: what an analyst's SQL asks for, in the terms dpgate releases.

A plan is made from the SQL text and the public schema only (never from the data), so
everything derived from it — the compiled SQL, the auditor's regions, the cache key — is
a function of public information.

Expressions inside a plan are sqlglot expressions whose column references are resolved
to canonical lower-case names of the plan's table (``exp.Column`` with no table
qualifier). They are shared, never mutated: copy one before transforming it.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Literal

from sqlglot import exp

from gateway.core.config import TableConfig
from mechanisms.types import MechanismName, Sensitivity

MeasureKind = Literal[
    "count_rows", "count_values", "count_units", "sum", "sum_squares", "histogram"
]
OutputKind = Literal[
    "group_key",
    "count",
    "sum",
    "avg",
    "literal",
    # quantiles and spread (gateway/sql/analyze/quantiles.py)
    "quantile",
    "var_pop",
    "var_samp",
    "stddev_pop",
    "stddev_samp",
]
ValueType = Literal["integer", "real", "text", "boolean", "date"]


@dataclass(frozen=True)
class Measure:
    """One exact integer aggregate the database computes and dpgate noises.

    - ``count_rows``: COUNT(*) of the bounded rows;
    - ``count_values``: COUNT(expr) — rows where ``expr`` is not NULL;
    - ``count_units``: COUNT(DISTINCT privacy unit);
    - ``sum``: SUM of ``expr`` clamped to [lower, upper], rounded to multiples of
      ``resolution`` and summed as integers (the released value is noisy sum × resolution);
    - ``sum_squares``: SUM of the square of ``expr`` clamped to [lower, upper], on the
      grid ``resolution`` of the squares (for VARIANCE and STDDEV);
    - ``histogram``: the *exact* number of rows whose ``expr`` (a quantile's column) is
      not NULL. It is never noised nor released; the statement also returns that
      column's fine histogram over the quantile's grid (``gateway/sql/compile.py``), from
      which the exponential mechanism chooses a bucket (``gateway/pipeline/quantiles.py``). A plan
      lists these measures last.

    ``center`` (grid units, a ``sum`` of an AVG only): the measure is Σ(round(v/g) − c),
    computed from the exact SUM and the AVG's own count of the same rows
    (``gateway/pipeline/noising.py``), with ``sensitivity`` for the centred values — about half the
    uncentred one when the bounds do not straddle 0 (``mechanisms.grid_center``).
    """

    kind: MeasureKind
    sensitivity: Sensitivity
    expression: exp.Expr | None = None
    lower: float | None = None
    upper: float | None = None
    resolution: Fraction = Fraction(1)
    center: int = 0

    @property
    def noised(self) -> bool:
        return self.kind != "histogram"


@dataclass(frozen=True)
class GroupKey:
    """A GROUP BY key and how its values may be released.

    ``domain`` is the tuple of values declared public (config ``values:``, a CASE whose
    results are literals, a bounded integer bucket…): every one of them is released,
    zeros included, in this order. ``domain is None`` means the keys are not public and
    groups are released only through DP partition selection.
    """

    expression: exp.Expr
    name: str
    type: ValueType
    domain: tuple[Any, ...] | None


@dataclass(frozen=True)
class OutputColumn:
    """One column of the released result.

    ``measures`` indexes into ``QueryPlan.measures``: one for count and sum, (sum, count)
    for avg, none for a group key (``group_index`` says which) or a literal.
    ``hidden`` columns are computed for HAVING / ORDER BY but not returned.
    ``quantile``: (sum, sum of squares, count) for the variance kinds; for a quantile, its
    ``histogram`` measure (the count of values) and the grid its bucket is chosen on.
    """

    name: str
    kind: OutputKind
    type: ValueType
    measures: tuple[int, ...] = ()
    group_index: int | None = None
    value: Any = None
    hidden: bool = False
    quantile: QuantileGrid | None = None


@dataclass(frozen=True)
class QuantileGrid:
    """The public grid a quantile's bucket is chosen on (from the declared bounds only).

    ``p`` is the quantile (0 for MIN, 1/2 for MEDIAN, 1 for MAX). Bucket j of the
    ``buckets`` covers [lower + j·width, lower + (j+1)·width), the last one up to ``upper``
    included; the database computes each row's bucket (``gateway/sql/compile_values.py``) and
    returns the exact count of each non-empty one. ``rows_per_unit`` is the enforced
    contribution bound.
    """

    p: Fraction
    lower: Fraction
    upper: Fraction
    width: Fraction
    buckets: int
    rows_per_unit: int

    @property
    def integral(self) -> bool:
        """Each bucket is one whole number (an integer column with width 1)."""
        return (
            self.width == 1
            and self.lower.denominator == 1
            and (self.upper - self.lower + 1 == self.buckets)
        )

    def value(self, j: int) -> Fraction:
        """The released value of bucket j: the number itself for a whole-number bucket,
        otherwise the middle of the bucket's part of [lower, upper]."""
        start = self.lower + j * self.width
        if self.integral:
            return start
        return (start + min(start + self.width, self.upper)) / 2


@dataclass(frozen=True)
class OrderKey:
    """ORDER BY one output column (by index into ``QueryPlan.outputs``)."""

    output: int
    descending: bool = False


JoinKind = Literal["inner", "left"]


@dataclass(frozen=True)
class JoinStep:
    """One JOIN of a query, in the analyst's order: ``table`` joined (``kind``) on
    ``table.column = other.other_column``, where ``other`` is already in the FROM and one
    of the two columns references the other (a declared ``Reference``)."""

    table: str
    kind: JoinKind
    column: str
    other: str
    other_column: str


@dataclass(frozen=True)
class JoinPlan:
    """How a join query reads its tables (docs/design.md, "Joins"; ``gateway/core/joins.py``).

    The relation is one row per row of the anchor table (the plan's ``table``): every
    other table is a *lookup* joined on a column that names at most one of its rows (a
    privacy unit with one row per unit, or a public table's key), enforced in the SQL.
    ``relation`` declares its columns: the anchor's under their own names, a lookup's as
    ``table.column``; plan expressions use those names. ``tables`` are the declared
    tables of the FROM, in the query's order (``first`` and then each step's).
    ``keys`` names, for each of ``tables``, the column a lookup is joined on (None for the
    anchor). ``matched`` is the condition, over the relation, that its rows meet besides
    the WHERE (each lookup an inner join requires is matched): the auditor adds it to each
    region.
    """

    first: str
    steps: tuple[JoinStep, ...]
    relation: TableConfig
    tables: tuple[TableConfig, ...]
    keys: tuple[str | None, ...]
    matched: exp.Expr | None


@dataclass(frozen=True)
class QueryPlan:
    """Everything dpgate needs to answer one supported query.

    ``where`` filters rows before contribution bounding; ``having`` is evaluated on the
    released (noisy) values and refers to outputs by ``exp.Column`` named after the
    output column; ``canonical_sql`` is the sqlglot-normalised text used as the cache key
    and in the ledger.
    """

    table: str
    measures: tuple[Measure, ...]
    outputs: tuple[OutputColumn, ...]
    where: exp.Expr | None
    group_keys: tuple[GroupKey, ...]
    having: exp.Expr | None
    order_by: tuple[OrderKey, ...]
    limit: int | None
    offset: int
    canonical_sql: str
    # Nested aggregation: an outer query run on this plan's released rows (see PostQuery).
    post_query: PostQuery | None = None
    join: JoinPlan | None = None
    # ``canonical_sql`` without the statement's own LIMIT and OFFSET: the cache key's
    # text, so that requests differing only in their cut share one release (None: as
    # ``canonical_sql``).
    uncut_sql: str | None = None

    @property
    def needs_partition_selection(self) -> bool:
        return any(g.domain is None for g in self.group_keys)

    @property
    def selecting_count(self) -> int | None:
        """The count measure whose own noisy value selects the groups, if any.

        Partition selection then spends no budget of its own (``mechanisms.calibrate_query``
        with a ``selector``). Only a count to which one unit adds at most 1 per group
        qualifies (COUNT(DISTINCT unit), or any count with one row per unit), COUNT(*)
        first since it is the largest; with more rows per unit a separate count of units
        selects, whose threshold does not grow with the rows a unit may add.
        """
        for kind in ("count_rows", "count_units", "count_values"):
            for j, m in enumerate(self.measures):
                if m.kind == kind and m.sensitivity.linf == 1:
                    return j
        return None

    @property
    def visible_outputs(self) -> tuple[OutputColumn, ...]:
        return tuple(o for o in self.outputs if not o.hidden)

    @property
    def result_columns(self) -> tuple[tuple[str, ValueType], ...]:
        """(name, type) of what the analyst receives: the outer query's columns for a
        nested aggregation, else the visible outputs."""
        if self.post_query is not None:
            return self.post_query.columns
        return tuple((o.name, o.type) for o in self.visible_outputs)

    def named_cell(self, values: tuple[Any, ...]) -> dict[str, Any]:
        """A cell's group-key values by the keys' names (how responses name a row)."""
        return dict(zip((g.name for g in self.group_keys), values, strict=True))


# -- nested aggregation ----------------------------------------------------------------

PostAccuracyKind = Literal["exact", "inherit", "sum", "avg", "rows", "unknown"]


@dataclass(frozen=True)
class PostAccuracy:
    """How accurate one column of a post-query's result is, from the inner noise alone.

    - ``exact``: computed from group keys and literals only (no noise; no entry);
    - ``inherit``: a count or sum column of the inner query passed through unchanged;
    - ``sum`` / ``avg``: SUM / AVG of the inner noisy column ``inner`` over the rows
      counted by the hidden result column ``rows_column`` (independent noises add);
    - ``rows``: COUNT of released inner rows, exact when which rows exist is public;
    - ``unknown``: anything else over noisy values (MIN, MAX, expressions…): reported
      as null rather than guessed.
    """

    kind: PostAccuracyKind
    inner: int | None = None  # index into the inner plan's outputs
    rows_column: int | None = None  # index into the post-query's result row


@dataclass(frozen=True)
class PostQuery:
    """The outer query of ``SELECT … FROM (<aggregate query>) AS t …`` (nested
    aggregation): post-processing run on the inner query's released (noisy) rows only,
    never on the protected database, so it costs nothing more.

    ``sql`` is DuckDB SQL over one table, ``released``, whose columns are
    ``inner_columns`` (the inner plan's visible outputs, in order); its result has the
    ``columns`` the analyst sees, then ``hidden`` helper columns (row counts for the
    accuracy of SUM and AVG). ``accuracy`` has one entry per visible column.
    """

    sql: str
    inner_columns: tuple[tuple[str, ValueType], ...]
    columns: tuple[tuple[str, ValueType], ...]
    accuracy: tuple[PostAccuracy, ...]
    hidden: int
    rows_exact: bool  # which inner rows exist is public (declared keys, no HAVING/LIMIT)


@dataclass(frozen=True)
class ProbePlan:
    """A query answered from public information alone, free, without touching protected
    data: a BI tool's connection probe (``SELECT 1``, ``SELECT version()``), or the list
    of a column's declared values (``SELECT DISTINCT sex FROM patients``)."""

    columns: tuple[tuple[str, ValueType], ...]
    rows: tuple[tuple[Any, ...], ...]


@dataclass(frozen=True)
class QueryRequest:
    """An analyst's request, validated: the SQL and the privacy parameters it asks for.

    ``accuracy`` is a target 95% half-width asked for instead of ε: the pipeline then
    replaces ``epsilon`` with the smallest ε that meets it (``gateway.pipeline.accuracy_target``).
    """

    sql: str
    epsilon: float
    delta: float
    mechanism: MechanismName
    dry_run: bool = False
    accuracy: float | None = None
    # The noisy values as drawn, not clamped into public bounds (``gateway.pipeline.postprocess``):
    # a view of the same release, so never part of the cache key.
    raw: bool = False
