"""ClickHouse as the protected database: opening it read-only, the per-statement
settings, and the catalogue (which columns may hold NULL).

Two ways in, one dialect (sqlglot's ``clickhouse``):

- a server, through clickhouse-connect's SQLAlchemy dialect:
  ``clickhousedb://user:password@host:8123/database`` (HTTP; ``?secure=true`` for
  HTTPS);
- chDB, ClickHouse embedded in the gateway's process: ``chdb:///data/dir``
  (``gateway/sql/engines/chdb_dbapi.py``). The tests run on it.

Read-only: every connection runs with ``readonly = 2`` — reads, and changes of settings
only. (``readonly = 1`` would also forbid the per-statement ``max_execution_time``
below; a server user whose profile pins ``readonly = 2`` is the belt to these braces.)

Before each statement, one ``SET`` fixes what the answer and its cost may depend on,
whatever the server's or the user's profile says:

- ``max_execution_time`` (the statement's deadline, in seconds) with
  ``timeout_overflow_mode = 'throw'``: a profile's ``'break'`` would return the partial
  aggregate of the rows read so far as if it were the answer;
- ``count_distinct_implementation = 'uniqExact'``: COUNT(DISTINCT unit) is exact — an
  approximate count (``uniq``, HyperLogLog) has no sensitivity of one;
- ``aggregate_functions_null_for_empty = 0``, ``transform_null_in = 0``,
  ``join_use_nulls = 1``: NULL handling as in the SQL standard, which the compiled SQL
  assumes (a LEFT JOIN's unmatched columns are NULL, not the type's default).

A PRIMARY KEY here is a sort key: it promises no uniqueness, so no unit or join key is
ever taken as unique on ClickHouse (``gateway/sql/join_keys.py``).
"""

from __future__ import annotations

from collections.abc import Mapping

import sqlalchemy as sa
from sqlalchemy.engine import URL
from sqlglot import exp

from gateway.core.config import TableConfig

#: SQLAlchemy dialect names that reach ClickHouse.
DIALECT_NAMES = ("clickhouse", "clickhousedb")
#: URL schemes (``URL.get_backend_name()``) this module opens.
BACKENDS = ("chdb", "clickhousedb")

_SERVER_READONLY = {"readonly": "2"}


def open_engine(url: URL) -> sa.Engine:
    """A SQLAlchemy engine on ClickHouse that can only read (see the module doc)."""
    if url.get_backend_name() == "chdb":
        sa.dialects.registry.register("chdb", "gateway.sql.engines.chdb_dbapi", "ChdbDialect")
        return sa.create_engine(
            url,
            poolclass=sa.pool.QueuePool,
            pool_size=4,
            max_overflow=12,
            pool_pre_ping=False,
        )
    # clickhouse-connect sends keyword arguments it does not know as settings of every
    # request: the server then refuses any write on these connections.
    return sa.create_engine(url, connect_args=dict(_SERVER_READONLY), pool_pre_ping=True)


def statement_settings(timeout_ms: int) -> str:
    """The ``SET`` run before each protected statement (see the module doc). Every value
    in it is dpgate's own (the deadline is a number), none an analyst's."""
    seconds = max(1, int(timeout_ms)) / 1000
    settings = [
        exp.EQ(this=exp.var("max_execution_time"), expression=exp.Literal.number(seconds)),
        exp.EQ(this=exp.var("timeout_overflow_mode"), expression=exp.Literal.string("throw")),
        exp.EQ(
            this=exp.var("count_distinct_implementation"),
            expression=exp.Literal.string("uniqExact"),
        ),
        exp.EQ(
            this=exp.var("aggregate_functions_null_for_empty"), expression=exp.Literal.number(0)
        ),
        exp.EQ(this=exp.var("transform_null_in"), expression=exp.Literal.number(0)),
        # A LEFT JOIN's unmatched columns are NULL, as elsewhere and as the auditor
        # models them, not the type's default ('' or 0: docs/privacy.md, "What the
        # catalogue may replace").
        exp.EQ(this=exp.var("join_use_nulls"), expression=exp.Literal.number(1)),
    ]
    return exp.Set(expressions=[exp.SetItem(this=s) for s in settings]).sql(dialect="clickhouse")


def prepare_statement(conn: sa.Connection, timeout_ms: int) -> None:
    """Apply ``statement_settings`` on the connection the statement will run on."""
    conn.exec_driver_sql(statement_settings(timeout_ms))


def nullability(engine: sa.Engine, tables: Mapping[str, TableConfig]) -> dict[str, dict[str, bool]]:
    """Per table, per column: whether ClickHouse's catalogue lets it hold NULL (a column
    holds NULL only if its type is ``Nullable(…)``, or ``LowCardinality(Nullable(…))``).
    Read from ``system.columns``: schema metadata, never rows."""
    out: dict[str, dict[str, bool]] = {}
    with engine.connect() as conn:
        for key, t in tables.items():
            database: exp.Expr = (
                exp.Literal.string(t.schema) if t.schema else exp.func("currentDatabase")
            )
            query = (
                exp.select("name", "type")
                .from_(exp.table_("columns", db="system"))
                .where(exp.column("database").eq(database))
                .where(exp.column("table").eq(exp.Literal.string(t.sql_name)))
            )
            rows = conn.exec_driver_sql(query.sql(dialect="clickhouse")).fetchall()
            if rows:
                out[key] = {str(name).lower(): "Nullable(" in str(ctype) for name, ctype in rows}
    return out
