"""What the protected database's catalogue says of the declared tables, on every engine:
their columns (type, whether they may hold NULL), keys and constraints.

``read_schema`` is what ``dpgate config check`` reports from; the gateway's start-up
reads its guarantees through ``gateway/sql/execute.py``. Each engine is read the way it can
be: SQLAlchemy's reflection (SQLite, PostgreSQL and other dialects), DuckDB's
``duckdb_columns()``/``duckdb_constraints()`` (its SQLAlchemy reflection goes through
``pg_catalog`` views that DuckDB 2 no longer has), ClickHouse's ``system.columns``
(chDB and clickhouse-connect reflect nothing), and Spark's catalogue through the
session (``spark+local://`` and ``spark+connect://``). What an engine cannot tell is
named in ``TableFacts.unread`` with the reason, never guessed.

Only schema metadata is read, never a row.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlglot import exp

from gateway.core.config import TableConfig
from gateway.sql.engines import SQLGLOT_DIALECTS


@dataclass(frozen=True)
class ColumnFacts:
    """One column as the catalogue describes it (``nullable`` None: not known)."""

    name: str
    type: str
    nullable: bool | None


@dataclass(frozen=True)
class TableFacts:
    """One declared table as found in the catalogue.

    ``unique``: column lists the database keeps unique (primary key, unique constraints
    and indexes); ``indexed``: the column lists of every index, unique or not (SQLite and
    PostgreSQL; empty where not read); ``sorting_key``: ClickHouse's primary/sorting key,
    which orders rows but keeps nothing unique; ``checks``: CHECK constraint texts;
    ``unread``: what the engine could not tell, each with its reason.
    """

    found: bool
    columns: tuple[ColumnFacts, ...] = ()
    unique: tuple[tuple[str, ...], ...] = ()
    indexed: tuple[tuple[str, ...], ...] = ()
    sorting_key: tuple[str, ...] = ()
    checks: tuple[str, ...] = ()
    unread: tuple[str, ...] = ()

    def column(self, name: str) -> ColumnFacts | None:
        wanted = name.lower()
        return next((c for c in self.columns if c.name.lower() == wanted), None)


@dataclass(frozen=True)
class SchemaReading:
    """The catalogue's facts per declared table key, or why none could be read."""

    engine: str
    tables: Mapping[str, TableFacts] = field(default_factory=dict)
    failure: str | None = None


def engine_kind(engine: sa.Engine) -> str:
    """The engine's name as an operator knows it (``chdb`` and ``clickhousedb`` are both
    ClickHouse; ``spark`` is local or Connect)."""
    name = engine.dialect.name
    if SQLGLOT_DIALECTS.get(name) == "clickhouse":
        return "clickhouse"
    return name


def read_schema(engine: sa.Engine, tables: Mapping[str, TableConfig]) -> SchemaReading:
    """The catalogue's facts about every declared table (see the module doc). A failure
    to read the catalogue at all is returned as ``failure`` (its exception's class and,
    where the driver gives one, the engine's error code), never raised."""
    kind = engine_kind(engine)
    reader = _READERS.get(kind, _read_reflected)
    try:
        return SchemaReading(kind, {key: reader(engine, t) for key, t in tables.items()})
    except (sa.exc.SQLAlchemyError, NotImplementedError, OSError, RuntimeError) as e:
        return SchemaReading(kind, failure=_why(e))
    except Exception as e:  # a driver's own error (Py4J, gRPC): named, not raised
        return SchemaReading(kind, failure=_why(e))


def _why(e: BaseException) -> str:
    orig = getattr(e, "orig", None)
    code = getattr(orig, "sqlstate", None) or getattr(e, "sqlstate", None)
    name = type(orig).__name__ if orig is not None else type(e).__name__
    return f"{name} {code}" if code else name


# -- SQLAlchemy's reflection: SQLite, PostgreSQL, any other dialect ----------------------


def _read_reflected(engine: sa.Engine, t: TableConfig) -> TableFacts:
    inspector = sa.inspect(engine)
    if not inspector.has_table(t.sql_name, schema=t.schema):
        return TableFacts(found=False)
    sqlite = engine.dialect.name == "sqlite"
    unread: list[str] = []

    def optional(what: str, read: Callable[[], list[Any]]) -> list[Any]:
        try:
            return read()
        except NotImplementedError:
            unread.append(f"{what}: the {engine.dialect.name} dialect does not reflect them")
            return []

    pk = inspector.get_pk_constraint(t.sql_name, schema=t.schema)
    keys = tuple(str(c) for c in pk.get("constrained_columns") or [])
    # A primary key holds no NULL, except in SQLite (see ``sqlite_keys_never_null``).
    not_null_keys = sqlite_keys_never_null(engine, t.sql_name, t.schema, keys) if sqlite else keys
    columns = tuple(
        ColumnFacts(
            str(c["name"]),
            str(c["type"]),
            bool(c.get("nullable", True)) and str(c["name"]) not in not_null_keys,
        )
        for c in inspector.get_columns(t.sql_name, schema=t.schema)
    )
    unique = [keys] if keys else []
    unique += [
        tuple(str(c) for c in u.get("column_names") or [])
        for u in optional(
            "unique constraints",
            lambda: inspector.get_unique_constraints(t.sql_name, schema=t.schema),
        )
    ]
    indexes = optional("indexes", lambda: inspector.get_indexes(t.sql_name, schema=t.schema))
    indexed = [tuple(str(c) for c in i.get("column_names") or [] if c is not None) for i in indexes]
    unique += [
        tuple(str(c) for c in i.get("column_names") or []) for i in indexes if i.get("unique")
    ]
    checks = [
        str(c["sqltext"])
        for c in optional(
            "CHECK constraints",
            lambda: inspector.get_check_constraints(t.sql_name, schema=t.schema),
        )
        if not (c.get("dialect_options") or {}).get("not_valid")
    ]
    return TableFacts(
        found=True,
        columns=columns,
        unique=tuple(dict.fromkeys(u for u in unique if u)),
        indexed=tuple(dict.fromkeys(i for i in [*unique, *indexed] if i)),
        checks=tuple(checks),
        unread=tuple(unread),
    )


def sqlite_keys_never_null(
    engine: sa.Engine, table: str, schema: str | None, keys: tuple[str, ...]
) -> tuple[str, ...]:
    """The primary-key columns (``keys``) of a SQLite table that can never hold NULL.

    SQLite lets a PRIMARY KEY column hold NULL (a bug kept for compatibility), except
    the rowid alias — a single-column ``INTEGER PRIMARY KEY`` of a rowid table, which
    *is* the row's id — and the key of a ``WITHOUT ROWID`` table. The declaration has
    quirks (``INT PRIMARY KEY`` is no alias, nor is ``INTEGER PRIMARY KEY DESC`` written
    on the column), so the alias is recognised as SQLite itself compiles a read of the
    column: ``EXPLAIN`` (a statement prepared, no row read) reads it with ``Rowid``, not
    ``Column``. A NOT NULL constraint is the catalogue's own, read elsewhere."""
    if not keys:
        return ()
    with engine.connect() as conn:
        try:
            without_rowid = conn.execute(
                sa.text("SELECT wr FROM pragma_table_list WHERE name = :t AND schema = :s"),
                {"t": table, "s": schema or "main"},
            ).scalar()
        except sa.exc.SQLAlchemyError:  # SQLite before 3.37: no table list; no claim
            without_rowid = None
        if without_rowid:
            return keys
        if len(keys) != 1:
            return ()
        read = exp.select(exp.column(keys[0], quoted=True)).from_(
            exp.table_(table, db=schema, quoted=True)
        )
        plan = conn.exec_driver_sql("EXPLAIN " + read.sql("sqlite")).fetchall()
    opcodes = {str(row[1]) for row in plan}
    return keys if "Rowid" in opcodes and "Column" not in opcodes else ()


# -- DuckDB: its own catalogue functions ----------------------------------------------


def _read_duckdb(engine: sa.Engine, t: TableConfig) -> TableFacts:
    params = {"t": t.sql_name, "s": t.schema or "main"}
    with engine.connect() as conn:
        columns = conn.execute(
            sa.text(
                "SELECT column_name, data_type, is_nullable FROM duckdb_columns() "
                "WHERE table_name = :t AND schema_name = :s ORDER BY column_index"
            ),
            params,
        ).fetchall()
        if not columns:
            return TableFacts(found=False)
        constraints = conn.execute(
            sa.text(
                "SELECT constraint_type, constraint_column_names, expression "
                "FROM duckdb_constraints() WHERE table_name = :t AND schema_name = :s "
                "AND constraint_type IN ('PRIMARY KEY', 'UNIQUE', 'CHECK')"
            ),
            params,
        ).fetchall()
    unique = tuple(
        tuple(str(c) for c in names) for kind, names, _ in constraints if kind != "CHECK"
    )
    checks = tuple(str(e) for kind, _, e in constraints if kind == "CHECK" and e)
    return TableFacts(
        found=True,
        columns=tuple(ColumnFacts(str(n), str(d), bool(nl)) for n, d, nl in columns),
        unique=tuple(dict.fromkeys(unique)),
        checks=checks,
    )


# -- ClickHouse (a server or chDB): system.columns ------------------------------------


def _read_clickhouse(engine: sa.Engine, t: TableConfig) -> TableFacts:
    database: exp.Expr = exp.Literal.string(t.schema) if t.schema else exp.func("currentDatabase")
    query = (
        exp.select("name", "type", "is_in_sorting_key")
        .from_(exp.table_("columns", db="system"))
        .where(exp.column("database").eq(database))
        .where(exp.column("table").eq(exp.Literal.string(t.sql_name)))
        .order_by("position")
    )
    with engine.connect() as conn:
        rows = conn.exec_driver_sql(query.sql(dialect="clickhouse")).fetchall()
    if not rows:
        return TableFacts(found=False)
    return TableFacts(
        found=True,
        # a column holds NULL only if its type is Nullable(…) (or LowCardinality(Nullable(…)))
        columns=tuple(ColumnFacts(str(n), str(ct), "Nullable(" in str(ct)) for n, ct, _ in rows),
        sorting_key=tuple(str(n) for n, _, in_key in rows if in_key),
        unread=(
            "CHECK constraints: not read (ClickHouse checks them on insert only, and "
            "dpgate keeps every domain filter on ClickHouse)",
        ),
    )


# -- Spark SQL (local or Connect): the session's catalogue ------------------------------


def _read_spark(engine: sa.Engine, t: TableConfig) -> TableFacts:
    name = ".".join(exp.to_identifier(p, quoted=True).sql(dialect="spark") for p in _parts(t))
    with engine.connect() as conn:
        spark = conn.connection.dbapi_connection.spark  # type: ignore[union-attr]
        if not spark.catalog.tableExists(name):
            return TableFacts(found=False)
        schema = spark.table(name).schema
    return TableFacts(
        found=True,
        columns=tuple(
            ColumnFacts(f.name, f.dataType.simpleString(), bool(f.nullable)) for f in schema.fields
        ),
        unread=(
            "keys and CHECK constraints: Spark enforces no key, and dpgate reads no "
            "table format's constraints (Delta's CHECKs): every bound is kept in SQL",
        ),
    )


def _parts(t: TableConfig) -> list[str]:
    return [t.schema, t.sql_name] if t.schema else [t.sql_name]


_READERS: dict[str, Callable[[sa.Engine, TableConfig], TableFacts]] = {
    "duckdb": _read_duckdb,
    "clickhouse": _read_clickhouse,
    "spark": _read_spark,
}
