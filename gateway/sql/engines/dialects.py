"""The rewrites one engine needs for a compiled statement to compute what every other
engine computes (a part of compilation: ``gateway/sql/compile.py`` calls ``for_engine`` last).

ClickHouse differs from SQLite, PostgreSQL, DuckDB and Spark in two ways that reach a
released number or an error:

- NaN: every comparison with NaN is false there, so the clamp ``CASE WHEN x < lower …
  WHEN x > upper …`` lets NaN through, and ``CAST(nan AS Int64)`` then raises — an error
  that says a person's row holds NaN. PostgreSQL, DuckDB and Spark order NaN above every
  number. Each stored table is read through a projection that turns NaN into +∞ in every
  real column it declares (each table of a join with its own columns), so comparisons,
  clamps and orderings see what those engines see (SQLite stores NaN as NULL: no NaN is
  ever read there).
- ROUND rounds halves to even on floats (``round(2.5) = 2``); SQLite, DuckDB and Spark
  round them away from zero, and the SUM of a measure with a ``resolution`` rounds each
  value to its grid. ROUND becomes ``trunc(x) + (|x − trunc(x)| ≥ ½ ? sign(x) : 0)``,
  exact for every finite double (``x − trunc(x)`` is computed without rounding).
- Integer division: sqlglot writes it as a float division cast back to an integer, which
  loses precision past 2⁵³; ``intDiv`` truncates towards zero as SQLite does, exactly
  (its divisor is already ``NULLIF(…, 0)``, its operands proven in range by the analyzer).

Spark SQL refuses ``ROW_NUMBER()`` over a window without ORDER BY (``_windows_ordered``),
and an integer literal of more than 38 digits (``_big_literals_as_doubles``). Trino
divides integers exactly with ``/`` (sqlglot's integer division goes through DOUBLE).
Every other engine's statement is returned untouched.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlglot import exp

from gateway.core.config import TableConfig


def for_engine(
    query: exp.Query,
    table: TableConfig,
    dialect: str,
    stored: Sequence[TableConfig] | None = None,
) -> exp.Query:
    """``query`` (compiled for ``table``) as ``dialect``'s engine must run it. ``stored``:
    the tables it reads (a join's: each with its own columns), ``table`` alone if None."""
    if dialect in ("spark", "databricks"):
        return _big_literals_as_doubles(_windows_ordered(query))
    if dialect == "trino":
        # BIGINT / BIGINT truncates towards zero in Trino, exactly; sqlglot's IntDiv
        # would go through DOUBLE, which loses precision past 2^53.
        for div in list(query.find_all(exp.IntDiv)):
            div.replace(exp.Div(this=div.this.copy(), expression=div.expression.copy(), typed=True))
        return query
    if dialect != "clickhouse":
        return query
    sources = list(query.find_all(exp.Table))
    for read in stored if stored is not None else (table,):
        reals = [name for name, c in read.columns.items() if c.type == "real"]
        if not reals:
            continue
        for source in sources:
            if source.name == read.sql_name and (source.db or None) == (read.schema or None):
                source.replace(_without_nan(source, read, reals))
    for node in list(query.find_all(exp.Round)):
        node.replace(_half_away_from_zero(node))
    for div in list(query.find_all(exp.IntDiv)):
        div.replace(exp.func("intDiv", div.this.copy(), div.expression.copy()))
    return query


def _windows_ordered(query: exp.Query) -> exp.Query:
    """Spark refuses ROW_NUMBER() without an ORDER BY. A window that picks any of a
    unit's rows is ordered by the unit itself — the same value on every row of its
    partition, so still any row (``gateway/sql/compile.py``, ``counts_only``)."""
    for window in query.find_all(exp.Window):
        partition = window.args.get("partition_by") or []
        if window.args.get("order") is None and partition:
            window.set(
                "order", exp.Order(expressions=[exp.Ordered(this=p.copy()) for p in partition])
            )
    return query


#: Spark reads an integer literal past BIGINT as DECIMAL, whose precision stops at 38
#: digits: a grid of 2^-1019 (a measure bounded at 1e-300) would fail to compile.
_DECIMAL_DIGITS = 38


def _big_literals_as_doubles(query: exp.Query) -> exp.Query:
    """Integer literals too long for Spark's DECIMAL, written as doubles. They are powers
    of two (the grid of a SUM, ``gateway/sql/compile.py``) or bounds the config holds as
    floats: the double literal is the same number, exactly."""
    for literal in list(query.find_all(exp.Literal)):
        text = str(literal.this)
        if literal.is_string or not text.lstrip("-").isdigit():
            continue
        if len(text.lstrip("-")) > _DECIMAL_DIGITS:
            literal.replace(exp.Literal.number(repr(float(int(text)))))
    return query


def _without_nan(source: exp.Table, table: TableConfig, reals: list[str]) -> exp.Expr:
    columns: list[exp.Expr] = []
    for name in table.columns:
        column: exp.Expr = exp.column(name, quoted=True)
        if name in reals:
            nan = exp.func("isNaN", column.copy())
            column = exp.alias_(
                exp.If(this=nan, true=exp.var("inf"), false=column), name, quoted=True
            )
        columns.append(column)
    projection = exp.select(*columns).from_(source.copy())
    return exp.Subquery(
        this=projection, alias=exp.TableAlias(this=exp.to_identifier(table.sql_name, quoted=True))
    )


def _half_away_from_zero(node: exp.Round) -> exp.Expr:
    decimals = node.args.get("decimals")
    scale = (
        exp.func("pow", exp.Literal.number(10), decimals.copy()) if decimals is not None else None
    )
    value = exp.Paren(this=node.this.copy())
    scaled: exp.Expr = value if scale is None else exp.Mul(this=value, expression=scale)
    whole = exp.func("trunc", scaled.copy())
    half_or_more = exp.GTE(
        this=exp.Abs(this=exp.Sub(this=scaled.copy(), expression=whole.copy())),
        expression=exp.Literal.number(0.5),
    )
    step = exp.If(
        this=half_or_more, true=exp.func("sign", scaled.copy()), false=exp.Literal.number(0)
    )
    rounded: exp.Expr = exp.Paren(this=exp.Add(this=whole, expression=step))
    if scale is not None:
        rounded = exp.Paren(this=exp.Div(this=rounded, expression=scale.copy()))
    return rounded
