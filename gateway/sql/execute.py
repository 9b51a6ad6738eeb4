"""Execution: run one compiled aggregate statement on the protected database, read-only.

Connections are opened read-only and with a statement timeout, per backend:

- SQLite: the file is opened with ``mode=ro`` and a timer interrupts a statement past
  its deadline;
- PostgreSQL: ``default_transaction_read_only`` and ``statement_timeout`` are set on
  each connection;
- DuckDB: the database is opened ``read_only``; a timer interrupts a late statement;
- ClickHouse (a server, or chDB embedded) and Spark SQL: see ``gateway/sql/engines/``
  (``readonly=2`` and ``max_execution_time``; a single-query guard and a cancelled job
  group);
- any other engine: ``SET TRANSACTION READ ONLY`` is attempted, and the statement runs
  under a timer that cancels it where the driver allows.

A failure is reported without the database's text: error texts can quote data values (a
failed cast echoes the value), so they never reach the analyst. A failure before the
statement is sent (``DatabaseUnavailable``) is refundable; one after it
(``StatementFailed``) is not — see ``run_aggregate``.
"""

from __future__ import annotations

import contextlib
import logging
import math
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, Protocol

import sqlalchemy as sa
from sqlalchemy.engine import make_url

from gateway.core.config import TableConfig
from gateway.core.domain import declared_values
from gateway.core.errors import DatabaseUnavailable, UnsupportedQuery
from gateway.sql.constraints import bounded_columns, enforced_columns
from gateway.sql.engines import SQLGLOT_DIALECTS
from gateway.sql.engines.catalogue import sqlite_keys_never_null
from gateway.sql.interrupts import WATCHDOG, Armed

log = logging.getLogger("dpgate.execute")

SQLITE_STATEMENT_CACHE = 8
"""Prepared statements each protected SQLite connection keeps (Python's default is 128).
A compiled query's text carries its constants, and a repeated question is served by
the answer cache before it reaches the database, so nearly every statement is new: at
128 each pooled connection filled with ~10 kB per statement it would never run again
(1.3 MB per connection, RSS that grew with the number of distinct queries, issue 36)."""


def sqlglot_dialect(engine: sa.Engine) -> str:
    """The sqlglot dialect name for a SQLAlchemy engine."""
    name = engine.dialect.name
    if name in SQLGLOT_DIALECTS:
        return SQLGLOT_DIALECTS[name]
    return {"postgresql": "postgres", "mssql": "tsql", "mariadb": "mysql"}.get(name, name)


#: What SQLite says of a statement its parser cannot hold: its parser stack has a fixed
#: 100 entries in the builds Python ships, and one level of nesting takes 1 to 7 of them
#: (a parenthesis 1, ``ABS(`` 3, ``x IN (`` 7), so no bound on the analyst's nesting
#: alone matches it; and an expression tree deeper than ``SQLITE_MAX_EXPR_DEPTH``.
_SQLITE_PARSER_LIMITS = ("parser stack overflow", "expression tree is too large")


def check_parses(sql: str, dialect: str) -> None:
    """Refuse — before anything is charged or sent — a compiled statement the backend's
    parser cannot take whatever the rows are; raises ``UnsupportedQuery``.

    The statement is a function of the query text and the public config, so the
    refusal is too. SQLite's is the parser with a small fixed stack: the statement is
    prepared on an empty in-memory database, where parsing is all that can happen (its
    tables do not exist there, so nothing runs). PostgreSQL's and DuckDB's parsers take
    thousands of levels, far past ``gateway.sql.analyze.limits.MAX_NESTING``."""
    if dialect != "sqlite":
        return
    # one empty in-memory database per thread: opening one per query cost ~0.1 ms
    probe = getattr(_probes, "connection", None)
    if probe is None:
        probe = _probes.connection = sqlite3.connect(":memory:")
    try:
        probe.execute(sql)
    except sqlite3.Error as e:
        if any(limit in str(e).lower() for limit in _SQLITE_PARSER_LIMITS):
            raise UnsupportedQuery(
                "the query nests deeper than SQLite can parse once compiled (functions, "
                "CASE, IN and subqueries each take several of its 100 parser levels)",
                construct="limit sqlite_parser_depth",
                limit="sqlite_parser_depth",
            ) from None


#: Each thread's empty in-memory SQLite on which ``check_parses`` prepares statements.
_probes = threading.local()


def _is_clickhouse(engine: sa.Engine) -> bool:
    return SQLGLOT_DIALECTS.get(engine.dialect.name) == "clickhouse"


def _is_spark(engine: sa.Engine) -> bool:
    return engine.dialect.name == "spark"


def open_protected_engine(url: str, *, statement_timeout_ms: int) -> sa.Engine:
    """A SQLAlchemy engine on the protected database that can only read."""
    parsed = make_url(url)
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        database = parsed.database or ""
        if database in ("", ":memory:"):
            raise ValueError("the protected database cannot be an in-memory SQLite database")

        def connect() -> sqlite3.Connection:
            uri = database if database.startswith("file:") else f"file:{database}?mode=ro"
            conn = sqlite3.connect(
                uri, uri=True, check_same_thread=False, cached_statements=SQLITE_STATEMENT_CACHE
            )
            conn.execute("PRAGMA query_only = ON")
            # A BLOB in a text column must not fail the fetch after the statement ran.
            conn.text_factory = lambda raw: raw.decode("utf-8", "replace")
            return conn

        # A queue of connections, not SQLAlchemy's default for a "sqlite://" URL
        # (SingletonThreadPool), which closes the connections of older threads once more
        # than five threads have used it — under threaded workers, while they run.
        engine = sa.create_engine(
            "sqlite://",
            creator=connect,
            poolclass=sa.pool.QueuePool,
            pool_size=8,
            max_overflow=24,
            pool_pre_ping=False,
        )
        # SQLAlchemy registers Python's math.floor as SQLite's floor(), which raises on
        # NULL, infinities and text; replace it (after the dialect's own hook) with
        # functions that are total, as the analyzer assumes.
        sa.event.listen(engine, "connect", _total_sqlite_functions)
        return engine
    if backend == "postgresql":
        options = (
            f"-c default_transaction_read_only=on -c statement_timeout={int(statement_timeout_ms)}"
        )
        # The URL's own options (a search_path, say) are kept: connect_args would replace
        # them, so they go first and dpgate's after them (a later -c wins).
        own = parsed.query.get("options")
        if own:
            own_text = own if isinstance(own, str) else " ".join(own)
            options = f"{own_text} {options}"
            parsed = parsed.difference_update_query(["options"])
        return sa.create_engine(
            parsed, connect_args={"options": options}, pool_pre_ping=True, pool_size=4
        )
    if backend == "duckdb":
        return sa.create_engine(parsed, connect_args={"read_only": True})
    if backend in ("chdb", "clickhousedb"):
        from gateway.sql.engines import clickhouse

        return clickhouse.open_engine(parsed)
    if backend == "spark":
        from gateway.sql.engines import spark

        return spark.open_engine(parsed)
    return sa.create_engine(parsed, pool_pre_ping=True)


class StatementFailed(Exception):
    """The statement reached the protected database and produced no answer: a runtime
    error, a timeout or a cancellation. Whether that happens can depend on the rows, so
    the query stays charged and the analyst is told only that it failed (invariant
    "failures after the database was reached stay charged", docs/design.md).
    ``timed_out`` is for the operator's log and metrics, never for the analyst."""

    def __init__(self, timed_out: bool) -> None:
        super().__init__("timeout" if timed_out else "error")
        self.timed_out = timed_out


def run_aggregate(engine: sa.Engine, sql: str, *, timeout_ms: int) -> list[tuple[Any, ...]]:
    """Run one aggregate statement and return its (few, aggregated) rows.

    Two failures are told apart, because only one of them may be refunded:

    - ``DatabaseUnavailable``: no connection could be had (refused, pool exhausted,
      the per-statement timeout could not be set). The statement was never sent, the
      failure does not depend on the protected rows, and the caller may refund.
    - ``StatementFailed``: the statement was sent. Anything from here on — an error, the
      timeout, a cancellation — may depend on the rows, so the caller keeps the charge.
    """
    deadline = time.monotonic() + timeout_ms / 1000
    try:
        conn = engine.connect()
    except sa.exc.SQLAlchemyError as e:
        log.warning("protected database unreachable: %s", type(getattr(e, "orig", e)).__name__)
        raise DatabaseUnavailable(
            "the protected database could not be reached; nothing was charged", charged=False
        ) from None
    with conn:
        try:
            raw = conn.connection.dbapi_connection
            _set_statement_timeout(engine, conn, timeout_ms)
        except sa.exc.SQLAlchemyError as e:
            log.warning("could not prepare a connection: %s", type(getattr(e, "orig", e)).__name__)
            raise DatabaseUnavailable(
                "the protected database could not be reached; nothing was charged",
                charged=False,
            ) from None
        timer = _arm_timeout(engine, raw, deadline)
        try:
            rows = _fetch_all(raw, sql)
        except Exception as e:
            # Deliberately broad: whatever the driver raises once the statement is out.
            timed_out = time.monotonic() >= deadline
            log.warning(
                "protected statement failed: %s%s",
                _failure_name(e),
                " (timeout)" if timed_out else "",
            )
            raise StatementFailed(timed_out) from None
        finally:
            _disarm(raw, timer)
            with contextlib.suppress(sa.exc.SQLAlchemyError):
                conn.rollback()
    return rows


class AbandonWatch(Protocol):
    """Told when a statement is abandoned at its deadline, and when it ends that many
    seconds after it (rows, error or cancellation): the pipeline's metrics."""

    def abandoned(self) -> None: ...

    def ended(self, seconds_late: float) -> None: ...


class _Outcome:
    """What a statement run in the background came to (set once, by its thread)."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.rows: list[tuple[Any, ...]] | None = None
        self.error: BaseException | None = None
        self.abandoned = False
        self.lock = threading.Lock()


def run_aggregate_until(
    engine: sa.Engine,
    sql: str,
    *,
    timeout_ms: int,
    until: float | None,
    query_id: str = "",
    run: Callable[..., list[tuple[Any, ...]]] | None = None,
    watch: AbandonWatch | None = None,
) -> list[tuple[Any, ...]]:
    """``run_aggregate``, abandoned at ``until`` (``time.monotonic()``) whatever the engine
    does: a statement that has not produced its rows by then raises ``StatementFailed``
    (timed out) at that moment, and runs on in the background until its own timeout
    or cancel stops it (a driver may ignore an interrupt, or honour it late: Spark plans
    a statement before any job of it can be cancelled). When it ends, the operator's log
    says how late, and ``watch`` is told (``dpgate_abandoned_statement_overrun_seconds``;
    the caller counts the miss itself in ``dpgate_deadline_misses_total``). Nothing it
    returns late is used. ``until=None``: no release moment, the statement's own timeout
    only. ``run``: what runs the statement (``run_aggregate``)."""
    run = run or run_aggregate
    if until is None:
        return run(engine, sql, timeout_ms=timeout_ms)
    outcome = _Outcome()

    def work() -> None:
        try:
            outcome.rows = run(engine, sql, timeout_ms=timeout_ms)
        except BaseException as e:  # handed to the waiting thread, or logged if abandoned
            outcome.error = e
        with outcome.lock:
            outcome.done.set()
            late = outcome.abandoned
        if late:
            seconds_late = max(0.0, time.monotonic() - until)
            log.warning(
                "deadline miss: abandoned statement of query %s ended %.0f ms after its deadline",
                query_id,
                seconds_late * 1000,
            )
            if watch is not None:
                watch.ended(seconds_late)

    thread = threading.Thread(target=work, name="dpgate-statement", daemon=True)
    thread.start()
    outcome.done.wait(max(0.0, until - time.monotonic()))
    with outcome.lock:
        if not outcome.done.is_set():
            outcome.abandoned = True
            if watch is not None:  # under the lock: before its thread can tell the end
                watch.abandoned()
    if outcome.abandoned:
        log.warning(
            "deadline miss: query %s's statement was still running at its deadline; it is "
            "abandoned (cancelled in the background) and charged",
            query_id,
        )
        raise StatementFailed(timed_out=True)
    if outcome.error is not None:
        raise outcome.error
    assert outcome.rows is not None
    return outcome.rows


def _fetch_all(raw: Any, sql: str) -> list[tuple[Any, ...]]:
    """Run ``sql`` on the driver's own cursor and fetch every row. The statement has no
    bind parameters and its rows are plain aggregates, so SQLAlchemy's statement
    compilation and result processing would only add time (and ``:`` or ``%`` inside a
    string literal stays text: with no parameters, drivers send the text as written)."""
    cursor = raw.cursor()
    try:
        cursor.execute(sql)
        return [tuple(r) for r in cursor.fetchall()]
    finally:
        cursor.close()


def _failure_name(e: BaseException) -> str:
    """The driver's exception class and, where it has one, the database's error code
    (``OperationalError SQLITE_INTERRUPT``, ``… SQLITE_FULL``, ``… 57014``): enough for
    the operator to tell a timeout from a full temp store, and never a data value (the
    message can quote one, so it is left out)."""
    orig = getattr(e, "orig", e)
    code = getattr(orig, "sqlite_errorname", None) or getattr(orig, "sqlstate", None)
    return f"{type(orig).__name__} {code}" if code else type(orig).__name__


def _total_sqlite_functions(dbapi_connection: Any, _record: Any) -> None:
    if isinstance(dbapi_connection, sqlite3.Connection):
        dbapi_connection.create_function("floor", 1, _sqlite_floor, deterministic=True)
        dbapi_connection.create_function("ceil", 1, _sqlite_ceil, deterministic=True)
        dbapi_connection.create_function("ceiling", 1, _sqlite_ceil, deterministic=True)


def _rounded(x: Any, direction: Any) -> int | float | None:
    if isinstance(x, bool) or not isinstance(x, int | float):
        return None
    if isinstance(x, int):
        return x
    if not math.isfinite(x):
        return None
    value = direction(x)
    return value if -(2**63) <= value < 2**63 else float(value)


def _sqlite_floor(x: Any) -> int | float | None:
    return _rounded(x, math.floor)


def _sqlite_ceil(x: Any) -> int | float | None:
    return _rounded(x, math.ceil)


def _set_statement_timeout(engine: sa.Engine, conn: sa.Connection, timeout_ms: int) -> None:
    """A per-statement timeout where the server enforces it (PostgreSQL): the timing
    policy gives each query its own deadline. Runs before the protected statement and
    reads no rows."""
    if engine.dialect.name == "postgresql":
        conn.execute(
            sa.text("SELECT set_config('statement_timeout', :ms, true)"),
            {"ms": str(max(1, int(timeout_ms)))},
        )
    elif _is_clickhouse(engine):
        from gateway.sql.engines import clickhouse

        clickhouse.prepare_statement(conn, timeout_ms)


def _arm_timeout(engine: sa.Engine, raw: Any, deadline: float) -> Armed | None:
    backend = engine.dialect.name
    # SQLite: ``interrupt()`` from another thread, not a progress handler: a handler is
    # Python code that takes the GIL every few thousand steps, and with a dashboard's
    # statements in flight each of those waits for the others (20 concurrent COUNTs took
    # 0.7 s that way, against 0.05 s for one). One watchdog thread for all of them
    # (gateway/sql/interrupts.py): a timer thread per statement cost ~0.2 ms a query.
    if backend == "postgresql" or _is_clickhouse(engine):
        return None  # statement_timeout / max_execution_time is set on the connection
    interrupt = getattr(raw, "interrupt", None) or getattr(raw, "cancel", None)
    if interrupt is None:
        return None
    return WATCHDOG.arm(deadline, interrupt)


def _disarm(raw: Any, armed: Armed | None) -> None:
    if armed is not None:
        armed.cancel()  # an interrupt under way lands before the connection is reused
    if isinstance(raw, sqlite3.Connection):
        raw.set_progress_handler(None, 0)


def units_unique_by_schema(engine: sa.Engine, tables: Mapping[str, TableConfig]) -> set[str]:
    """The tables whose privacy unit column the database itself keeps unique.

    A primary key or unique constraint (or unique index) on exactly the unit column makes
    every unit one row by the database's own enforcement, so a bound of one row per unit
    holds without a window function in the compiled SQL. A unique constraint still lets
    many rows hold NULL, so the unit column's domain must also exclude NULL (declared or
    catalogued ``nullable: false``: the compiled SQL then leaves those rows out). Read
    once, at start-up, from the catalogue (schema metadata, never rows); DuckDB's from
    ``duckdb_constraints()`` and ``duckdb_indexes()``, which its SQLAlchemy dialect does
    not reflect.
    """
    unique: set[str] = set()
    if _is_clickhouse(engine) or _is_spark(engine):
        return unique  # neither engine enforces uniqueness: the bound is kept in SQL
    candidates_of = _duckdb_unique_columns if engine.dialect.name == "duckdb" else _unique_columns
    try:
        inspector = sa.inspect(engine)
        for key, t in tables.items():
            if t.privacy_unit is None or t.max_rows_per_unit != 1:
                continue
            if t.columns[t.privacy_unit].may_be_null:
                continue
            if not inspector.has_table(t.sql_name, schema=t.schema):
                continue
            if not _keys_hold_for_reads(engine, t):
                continue
            unit = t.privacy_unit.lower()
            if any([c.lower() for c in cols] == [unit] for cols in candidates_of(engine, t)):
                unique.add(key)
    except (sa.exc.SQLAlchemyError, NotImplementedError):
        log.warning("could not read the protected database's constraints; bounding in SQL")
    return unique


def _keys_hold_for_reads(engine: sa.Engine, t: TableConfig) -> bool:
    """Whether the table's own keys and constraints bind every row a statement reading
    it sees, as that statement compares them (issue 31):

    - PostgreSQL reads a table with its inheritance children, which its PRIMARY KEY and
      UNIQUE constraints do not span and its ``NO INHERIT`` CHECKs do not bind (a
      partitioned table's keys span its partitions: it counts as whole);
    - DuckDB's unique index on a collated column compares bytes (it keeps 'a' and 'A'
      under NOCASE) while PARTITION BY and COUNT(DISTINCT) use the collation.
    """
    name = engine.dialect.name
    if name == "postgresql":
        with engine.connect() as conn:
            children = conn.execute(
                sa.text(
                    "SELECT EXISTS (SELECT 1 FROM pg_inherits i "
                    "JOIN pg_class c ON c.oid = i.inhparent "
                    "JOIN pg_namespace n ON n.oid = c.relnamespace "
                    "WHERE c.relname = :t AND n.nspname = COALESCE(:s, current_schema()) "
                    "AND c.relkind = 'r')"
                ),
                {"t": t.sql_name, "s": t.schema},
            ).scalar()
        return not children
    if name == "duckdb":
        (rows,) = _duckdb_catalogue(
            engine,
            t,
            "SELECT sql FROM duckdb_tables() WHERE table_name = :t AND schema_name = :s",
        )
        return not any("COLLATE" in str(sql or "").upper() for (sql,) in rows)
    return True


def _unique_columns(engine: sa.Engine, t: TableConfig) -> list[list[str]]:
    """The column lists of the table's primary key, unique constraints and whole unique
    indexes (SQLAlchemy's reflection)."""
    inspector = sa.inspect(engine)
    pk = inspector.get_pk_constraint(t.sql_name, schema=t.schema)
    out = [[str(c) for c in pk.get("constrained_columns") or []]]
    out += [
        [str(c) for c in u.get("column_names") or []]
        for u in inspector.get_unique_constraints(t.sql_name, schema=t.schema)
    ]
    out += [
        [str(c) for c in i.get("column_names") or []]
        for i in inspector.get_indexes(t.sql_name, schema=t.schema)
        if i.get("unique") and _whole(i)
    ]
    return out


def _whole(index: Mapping[str, Any]) -> bool:
    """Whether a unique index holds every row: a partial one (``WHERE …``, SQLite and
    PostgreSQL) is unique among the rows its predicate admits only, and PostgreSQL's
    invalid one (a failed ``CREATE INDEX CONCURRENTLY``) promises nothing (issue 31)."""
    options = index.get("dialect_options") or {}
    return not any(k.endswith("_where") or k.endswith("_invalid") for k in options)


def _duckdb_catalogue(engine: sa.Engine, t: TableConfig, *queries: str) -> list[list[Any]]:
    """The rows of each of DuckDB's catalogue ``queries`` about table ``t`` (bound as
    ``:t`` and ``:s``), read on one connection."""
    params = {"t": t.sql_name, "s": t.schema or "main"}
    with engine.connect() as conn:
        return [list(conn.execute(sa.text(q), params).fetchall()) for q in queries]


def _duckdb_unique_columns(engine: sa.Engine, t: TableConfig) -> list[list[str]]:
    """The same from DuckDB's own catalogue functions. A unique index's key is listed as
    expression text (``[id]``); only a single bare column is recognised."""
    constraints, indexes = _duckdb_catalogue(
        engine,
        t,
        "SELECT constraint_column_names FROM duckdb_constraints() "
        "WHERE constraint_type IN ('PRIMARY KEY', 'UNIQUE') "
        "AND table_name = :t AND schema_name = :s",
        "SELECT expressions FROM duckdb_indexes() "
        "WHERE is_unique AND table_name = :t AND schema_name = :s",
    )
    out = [[str(c) for c in row[0]] for row in constraints]
    for (expressions,) in indexes:
        text = str(expressions).strip()
        if text.startswith("[") and text.endswith("]"):
            text = text[1:-1]
        if text and "," not in text and "(" not in text:
            out.append([text.strip().strip('"')])
    return out


def nullability_by_schema(
    engine: sa.Engine, tables: Mapping[str, TableConfig]
) -> dict[str, dict[str, bool]]:
    """Per table, per declared column: whether the database's catalogue lets it hold NULL
    (``nullable`` in the config defaults to this; docs/privacy.md, "The domain model").

    A column of a primary key is NOT NULL whatever its declaration says — in SQLite only
    where the engine enforces it (``gateway.sql.engines.catalogue.sqlite_keys_never_null``:
    the rowid alias, a ``WITHOUT ROWID`` table's key; any other SQLite key may hold
    NULL). Read once, at start-up, from the catalogue (schema metadata, never rows;
    DuckDB's from ``duckdb_columns()``); a table or column the catalogue does not
    describe is left out (and taken to be nullable).
    """
    out: dict[str, dict[str, bool]] = {}
    try:
        if engine.dialect.name == "duckdb":
            return _duckdb_nullability(engine, tables)
        if _is_clickhouse(engine):
            from gateway.sql.engines import clickhouse

            return clickhouse.nullability(engine, tables)
        if _is_spark(engine):
            return out  # Spark's tables are nullable unless written otherwise: assumed so
        inspector = sa.inspect(engine)
        for key, t in tables.items():
            if not inspector.has_table(t.sql_name, schema=t.schema):
                continue
            pk = inspector.get_pk_constraint(t.sql_name, schema=t.schema)
            primary = tuple(str(c) for c in pk.get("constrained_columns") or [])
            if engine.dialect.name == "sqlite":  # a SQLite key may hold NULL (see there)
                primary = sqlite_keys_never_null(engine, t.sql_name, t.schema, primary)
            keys = {c.lower() for c in primary}
            columns = inspector.get_columns(t.sql_name, schema=t.schema)
            out[key] = {
                str(c["name"]).lower(): bool(c.get("nullable", True))
                and str(c["name"]).lower() not in keys
                for c in columns
            }
    except (sa.exc.SQLAlchemyError, NotImplementedError):
        log.warning("could not read the protected database's catalogue; columns nullable")
    return out


def _duckdb_nullability(
    engine: sa.Engine, tables: Mapping[str, TableConfig]
) -> dict[str, dict[str, bool]]:
    out: dict[str, dict[str, bool]] = {}
    with engine.connect() as conn:
        for key, t in tables.items():
            rows = conn.execute(
                sa.text(
                    "SELECT column_name, is_nullable FROM duckdb_columns() "
                    "WHERE table_name = :t AND schema_name = :s"
                ),
                {"t": t.sql_name, "s": t.schema or "main"},
            ).fetchall()
            if rows:
                out[key] = {str(name).lower(): bool(nullable) for name, nullable in rows}
    return out


class SchemaGuarantees(NamedTuple):
    """Per table, what the database itself guarantees of its declared columns."""

    domains: dict[str, set[str]]  # columns kept inside their declared domain
    within_bounds: dict[str, set[str]]  # integer columns kept whole inside their bounds


def domains_enforced_by_schema(
    engine: sa.Engine, tables: Mapping[str, TableConfig]
) -> SchemaGuarantees:
    """Per table, the declared columns whose domain the database itself enforces: NOT
    NULL in the catalogue where the declared domain has no NULL, and CHECK constraints
    that admit only declared values (``gateway/sql/constraints.py``); the compiled SQL then
    leaves them out of its domain filter. And the bounded integer columns it keeps whole
    inside their bounds (integral storage, CHECKs admitting that interval only): a SUM
    then reads them unclamped. Read once, at start-up, from the catalogue (constraint
    and column metadata, never rows); anything unreadable keeps the filter and the clamp.
    """
    out = SchemaGuarantees({}, {})
    if _is_clickhouse(engine) or _is_spark(engine):
        # Expected, not a warning: neither keeps a constraint dpgate reads (ClickHouse
        # checks its CONSTRAINTs on insert only; Spark enforces none), so every domain
        # filter and clamp stays in the SQL (``dpgate config check`` says so).
        return out
    dialect = sqlglot_dialect(engine)
    try:
        for key, t in tables.items():
            if not _keys_hold_for_reads(engine, t):
                continue
            facts = (
                _duckdb_column_facts(engine, t)
                if engine.dialect.name == "duckdb"
                else _column_facts(engine, t)
            )
            if facts is None:
                continue
            catalogue, checks = facts
            declared = {name: (declared_values(c), c.may_be_null) for name, c in t.columns.items()}
            out.domains[key] = enforced_columns(declared, catalogue, checks, dialect)
            bounds = {
                name: (c.lower, c.upper)
                for name, c in t.columns.items()
                if c.type == "integer" and c.lower is not None and c.upper is not None
            }
            out.within_bounds[key] = bounded_columns(bounds, catalogue, checks, dialect)
    except (sa.exc.SQLAlchemyError, NotImplementedError):
        log.warning("could not read the protected database's constraints; filtering in SQL")
        return SchemaGuarantees({}, {})
    return out


_Facts = tuple[dict[str, tuple[bool, bool, bool]], list[str]]


def _column_facts(engine: sa.Engine, t: TableConfig) -> _Facts | None:
    """(column → (NOT NULL, integral storage, boolean storage), CHECK texts) through
    SQLAlchemy's reflection. SQLite's column types are affinities: 1.5 fits in an
    INTEGER column, so no SQLite column counts as integral."""
    inspector = sa.inspect(engine)
    if not inspector.has_table(t.sql_name, schema=t.schema):
        return None
    pk = inspector.get_pk_constraint(t.sql_name, schema=t.schema)
    keys = {str(c).lower() for c in pk.get("constrained_columns") or []}
    sqlite = engine.dialect.name == "sqlite"
    catalogue = {}
    for c in inspector.get_columns(t.sql_name, schema=t.schema):
        name = str(c["name"]).lower()
        ctype = c["type"]
        not_null = not c.get("nullable", True) or (name in keys and not sqlite)
        integral = isinstance(ctype, sa.Integer) and not sqlite
        boolean = isinstance(ctype, sa.Boolean) and not sqlite
        catalogue[name] = (not_null, integral, boolean)
    # A PostgreSQL constraint added NOT VALID binds new rows only: older ones may break
    # it; one declared NO INHERIT does not bind the rows of the table's children.
    checks = [
        str(c["sqltext"])
        for c in inspector.get_check_constraints(t.sql_name, t.schema)
        if not any((c.get("dialect_options") or {}).get(k) for k in ("not_valid", "no_inherit"))
    ]
    return catalogue, checks


_DUCKDB_INTEGERS = (
    "TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT",
    "UTINYINT", "USMALLINT", "UINTEGER", "UBIGINT", "UHUGEINT",
)  # fmt: skip


def _duckdb_column_facts(engine: sa.Engine, t: TableConfig) -> _Facts | None:
    """The same from DuckDB's catalogue functions (its dialect reflects no CHECKs)."""
    columns, checks = _duckdb_catalogue(
        engine,
        t,
        "SELECT column_name, is_nullable, data_type FROM duckdb_columns() "
        "WHERE table_name = :t AND schema_name = :s",
        "SELECT expression FROM duckdb_constraints() "
        "WHERE table_name = :t AND schema_name = :s AND constraint_type = 'CHECK'",
    )
    if not columns:
        return None
    catalogue = {
        str(name).lower(): (
            not nullable,
            str(dtype).upper() in _DUCKDB_INTEGERS,
            str(dtype).upper() == "BOOLEAN",
        )
        for name, nullable, dtype in columns
    }
    return catalogue, [str(e) for (e,) in checks if e]


def ping(engine: sa.Engine) -> bool:
    """Whether the protected database answers a trivial statement."""
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
        return True
    except sa.exc.SQLAlchemyError:
        return False
