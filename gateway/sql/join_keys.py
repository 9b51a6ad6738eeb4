"""What the catalogue proves about a declared join's equality, engine by engine.

A join keeps each row of its anchor at most once only if no anchor row's join value is
*equal*, under the join's own ``=``, to two rows of a lookup. The compiled SQL makes that
so with a cut (``ROW_NUMBER() OVER (PARTITION BY key) = 1`` on the lookup), or skips the
cut where the database keeps the key unique. Both take the key's *grouping* equality (what
PARTITION BY and a UNIQUE index call equal) for the join's equality, and the two differ
wherever the engine converts or collates before comparing (issue 31):

- SQLite compares a column of INTEGER affinity with one of TEXT or no affinity after
  converting the latter to a number: ``'5'``, ``'05'`` and ``'005'`` are three values to a
  UNIQUE index and to PARTITION BY, and all equal to ``5`` in a join. A column's collation
  (NOCASE) decides ``=`` by the left operand's, PARTITION BY by the column's own.
- PostgreSQL resolves ``a = b`` of two types through implicit casts (a NUMERIC cast to
  DOUBLE PRECISION merges distinct values), and a nondeterministic collation on one side
  makes ``'a' = 'A'`` true where the other side's UNIQUE index holds both.
- ClickHouse's PRIMARY KEY is a sort key, Spark's constraints are informational: neither
  promises uniqueness (``units_unique_by_schema`` reads none there).

So the compiled SQL uses a catalogue fact only where this module proves it sound for the
engine and the two columns' storage (``JoinKeys``); everywhere else the relation may hold
an anchor row more than once, and the compiled SQL bounds each unit's rows after the
join whatever the catalogue says (``gateway/sql/compile_joins.py``). Read once, at start-up,
from the catalogue (column and index metadata, never rows). docs/privacy.md, "What the
catalogue may replace", lists every such fact and the condition under which it holds.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import sqlalchemy as sa

from gateway.core.config import TableConfig
from gateway.sql.engines.catalogue import engine_kind, read_schema

log = logging.getLogger("dpgate.join_keys")

#: A declared reference, by the referencing side: (table, column), lower case.
RefKey = tuple[str, str]


@dataclass(frozen=True)
class JoinKeys:
    """Per declared reference, what its compiled ``=`` provably is on this engine.

    ``unique``: the referenced key is unique under the join's own equality (the database
    enforces a UNIQUE or PRIMARY KEY on it, and the join compares as that constraint
    does): the lookup needs no cut. ``consistent``: the join's ``=`` is the referenced
    key's grouping equality (the same storage type and collation on both sides, on an
    engine that compares them without conversion): a cut by the key keeps one row per
    anchor row. A reference in neither is *unproven*: the relation may repeat an anchor
    row, and the compiled SQL bounds every unit's rows after the join. The empty default
    proves nothing (on SQLite the compiler still proves its own canonical keys).

    ``mismatched``: privacy-unit paths (references to a protected table's unit) between
    columns of different storage. Bounding after the join does not help there: the join
    may attach one person's lookup row to the anchor rows of several others (a DOUBLE
    0.1 equals the DECIMAL 0.1 and 0.1000000000000000000000001, two persons to the
    anchor), so removing that one person moves several anchor units' rows. A query
    joining through one is refused, free (``gateway/sql/compile_joins.py``).
    """

    unique: frozenset[RefKey] = frozenset()
    consistent: frozenset[RefKey] = frozenset()
    #: Privacy-unit paths whose two columns the catalogue shows stored differently (type
    #: or collation): a query joining through one is refused.
    mismatched: frozenset[RefKey] = frozenset()
    #: References the engine cannot join at all (ClickHouse: two types with no common
    #: type, e.g. Int64 and Float64 — NO_COMMON_TYPE): every query joining through one
    #: would fail at the database and be charged, so it is refused, free, instead.
    uncomparable: frozenset[RefKey] = frozenset()


@dataclass(frozen=True)
class StoredColumn:
    """One column's storage as the catalogue gives it.

    ``type``: the declared storage type, normalised (SQLite: the declared type text, ''
    for none; PostgreSQL: the type's schema-qualified name; DuckDB: ``data_type``).
    ``collation``: a non-default collation, or None. ``rowid``: SQLite only, the column is
    its table's rowid (an ``INTEGER PRIMARY KEY`` of a rowid table: always a distinct
    integer)."""

    type: str
    collation: str | None = None
    rowid: bool = False

    @property
    def sqlite_affinity(self) -> str:
        """The column's SQLite affinity (https://sqlite.org/datatype3.html, 3.1)."""
        t = self.type.upper()
        if "INT" in t:
            return "INTEGER"
        if any(s in t for s in ("CHAR", "CLOB", "TEXT")):
            return "TEXT"
        if t == "" or "BLOB" in t:
            return "BLOB"
        if any(s in t for s in ("REAL", "FLOA", "DOUB")):
            return "REAL"
        return "NUMERIC"


def stored_columns(engine: sa.Engine, t: TableConfig) -> dict[str, StoredColumn] | None:
    """Column (lower case) → its storage, or None where the catalogue cannot tell (the
    table is missing, or the engine is one whose catalogue this module does not read)."""
    name = engine.dialect.name
    try:
        if name == "sqlite":
            return _sqlite_columns(engine, t)
        if name == "postgresql":
            return _postgres_columns(engine, t)
        if name == "duckdb":
            return _duckdb_columns(engine, t)
        if engine_kind(engine) in ("clickhouse", "spark"):
            return _catalogue_columns(engine, t)
    except (sa.exc.SQLAlchemyError, NotImplementedError):
        log.warning("could not read column types of %s; its joins are bounded in SQL", t.name)
    return None


def _rows(engine: sa.Engine, sql: str, **params: Any) -> list[Any]:
    with engine.connect() as conn:
        return list(conn.execute(sa.text(sql), params).fetchall())


def _sqlite_columns(engine: sa.Engine, t: TableConfig) -> dict[str, StoredColumn] | None:
    schema = t.schema or "main"
    quoted = '"' + schema.replace('"', '""') + '"'
    info = _rows(engine, f"SELECT name, type, pk FROM {quoted}.pragma_table_info(:t)", t=t.sql_name)
    if not info:
        return None
    # An INTEGER PRIMARY KEY is the rowid (a distinct integer on every row) unless the
    # table is WITHOUT ROWID or the key is declared DESC: both give the key an index of
    # its own ("origin" 'pk'), which a rowid alias never has.
    pk_index = _rows(
        engine,
        f"SELECT 1 FROM {quoted}.pragma_index_list(:t) WHERE origin = 'pk'",
        t=t.sql_name,
    )
    keys = [str(n).lower() for n, _type, pk in info if pk]
    rowid = keys[0] if len(keys) == 1 and not pk_index else None
    out: dict[str, StoredColumn] = {}
    for n, declared, _pk in info:
        lower = str(n).lower()
        text = str(declared or "").strip()
        out[lower] = StoredColumn(text, rowid=lower == rowid and text.upper() == "INTEGER")
    return out


def _postgres_columns(engine: sa.Engine, t: TableConfig) -> dict[str, StoredColumn] | None:
    rows = _rows(
        engine,
        "SELECT a.attname, format_type(a.atttypid, NULL), "
        # 100 is the database's default collation (DEFAULT_COLLATION_OID), 0 none
        "CASE WHEN a.attcollation NOT IN (0, 100) THEN a.attcollation::regcollation::text END "
        "FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid "
        "JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE c.relname = :t AND n.nspname = COALESCE(:s, current_schema()) "
        "AND a.attnum > 0 AND NOT a.attisdropped",
        t=t.sql_name,
        s=t.schema,
    )
    if not rows:
        return None
    return {str(n).lower(): StoredColumn(str(ty), collation=coll) for n, ty, coll in rows}


def _duckdb_columns(engine: sa.Engine, t: TableConfig) -> dict[str, StoredColumn] | None:
    rows = _rows(
        engine,
        "SELECT column_name, data_type FROM duckdb_columns() "
        "WHERE table_name = :t AND schema_name = :s",
        t=t.sql_name,
        s=t.schema or "main",
    )
    if not rows:
        return None
    # DuckDB's catalogue lists no collation; a column declared with one (its CREATE
    # TABLE text says COLLATE) is taken as unknown: no shortcut on it.
    sql = _rows(
        engine,
        "SELECT sql FROM duckdb_tables() WHERE table_name = :t AND schema_name = :s",
        t=t.sql_name,
        s=t.schema or "main",
    )
    collated = bool(sql) and "COLLATE" in str(sql[0][0] or "").upper()
    return {
        str(n).lower(): StoredColumn(str(ty).upper(), collation="?" if collated else None)
        for n, ty in rows
    }


def _catalogue_columns(engine: sa.Engine, t: TableConfig) -> dict[str, StoredColumn] | None:
    """ClickHouse and Spark: the type each column is stored as, from the catalogue reader
    of ``dpgate config check``. ClickHouse's ``Nullable(…)`` and ``LowCardinality(…)``
    wrappers are taken off (they change neither the values nor their ``=``); a Spark
    string's collation is part of its type (``string collate UTF8_LCASE``)."""
    reading = read_schema(engine, {t.name: t})
    facts = reading.tables.get(t.name)
    if facts is None or not facts.found:
        return None
    out: dict[str, StoredColumn] = {}
    for c in facts.columns:
        text = c.type
        while text.startswith(("Nullable(", "LowCardinality(")) and text.endswith(")"):
            text = text[text.index("(") + 1 : -1]
        out[c.name.lower()] = StoredColumn(text)
    return out


def join_keys_by_schema(
    engine: sa.Engine, tables: Mapping[str, TableConfig], unique_keys: frozenset[str]
) -> JoinKeys:
    """What the catalogue proves of every declared reference on ``engine``.

    ``unique_keys``: the tables whose join key (privacy unit, or a public table's key) the
    database keeps unique (``units_unique_by_schema``, which reads nothing on engines that
    enforce no key). A reference is

    - on SQLite, *unique* when its key is the referenced table's rowid and the referencing
      column has INTEGER affinity: the stored values on both sides are then compared
      without conversion, and an integer equals one rowid at most (the other references
      are compared on canonical keys by the compiler, which needs no fact);
    - on PostgreSQL and DuckDB, *consistent* when both columns have the same storage type
      and collation (``=`` is then the type's own equality, the one PARTITION BY and a
      UNIQUE index use), and *unique* when, besides, the key is in ``unique_keys``;
    - on any other engine, unproven.

    On every engine whose catalogue is read but SQLite (whose canonical keys compare one
    storage class by identity), a privacy-unit path is *mismatched* when its two columns'
    storage types or collations differ (see ``JoinKeys``).
    """
    name = engine.dialect.name
    proving = name in ("sqlite", "postgresql", "duckdb")
    if not proving and engine_kind(engine) not in ("clickhouse", "spark"):
        return JoinKeys()
    storage: dict[str, dict[str, StoredColumn] | None] = {}

    def columns(table: str) -> dict[str, StoredColumn] | None:
        if table not in storage:
            storage[table] = stored_columns(engine, tables[table])
        return storage[table]

    unique: set[RefKey] = set()
    consistent: set[RefKey] = set()
    mismatched: set[RefKey] = set()
    uncomparable: set[RefKey] = set()
    clickhouse = engine_kind(engine) == "clickhouse"
    for key, t in tables.items():
        for r in t.references:
            mine, theirs = columns(key), columns(r.table)
            if mine is None or theirs is None:
                continue
            a, b = mine.get(r.column.lower()), theirs.get(r.target.lower())
            if a is None or b is None:
                continue
            ref = (key.lower(), r.column.lower())
            alike = a.type == b.type and a.collation == b.collation and a.collation != "?"
            if name != "sqlite" and not tables[r.table].public and _differ(a, b, t, r.column):
                mismatched.add(ref)
            if clickhouse and not clickhouse_joinable(a.type, b.type):
                uncomparable.add(ref)
            if not proving:
                continue  # ClickHouse, Spark: no key is unique, no join proven
            if name == "sqlite":
                if (
                    b.rowid
                    and a.sqlite_affinity == "INTEGER"
                    and t.columns[r.column].type == "integer"
                ):
                    unique.add(ref)
                continue
            if alike:
                consistent.add(ref)
                if r.table in unique_keys:
                    unique.add(ref)
    return JoinKeys(
        unique=frozenset(unique),
        consistent=frozenset(consistent),
        mismatched=frozenset(mismatched),
        uncomparable=frozenset(uncomparable),
    )


_CLICKHOUSE_FAMILIES = (
    frozenset({"Int8", "Int16", "Int32", "Int64"}),
    frozenset({"UInt8", "UInt16", "UInt32", "UInt64"}),
    frozenset({"Float32", "Float64"}),
    frozenset({"String", "FixedString"}),
)


def clickhouse_joinable(a: str, b: str) -> bool:
    """Whether ClickHouse joins columns of these two storage types (Nullable and
    LowCardinality already stripped): the same type, or two of one family, whose common
    type is exact. Anything else (Int64 against Float64, a number against a String) has
    no common type and fails at the database; deliberately conservative."""
    if a == b:
        return True
    base = (a.split("(")[0], b.split("(")[0])
    return any(base[0] in f and base[1] in f for f in _CLICKHOUSE_FAMILIES)


def _differ(a: StoredColumn, b: StoredColumn, t: TableConfig, column: str) -> bool:
    """Whether two join columns are stored differently: another type, or (text only)
    another collation. DuckDB's unknown collation ("?", a table with a collated column)
    counts as a difference only against a known one."""
    if a.type != b.type:
        return True
    return t.columns[column].type in ("text", "date") and a.collation != b.collation


def with_public_keys_as_units(tables: Mapping[str, TableConfig]) -> dict[str, TableConfig]:
    """The public tables with their key in the privacy unit's place (to ask
    ``units_unique_by_schema`` which keys the database keeps unique)."""
    return {k: replace(t, privacy_unit=t.key) for k, t in tables.items() if t.public}


#: Storage that holds a declared type's values as the join compares them: SQLite
#: affinities, and PostgreSQL / DuckDB type names (normalised, lower case).
_SQLITE_AFFINITIES = {
    "integer": ("INTEGER",),
    "boolean": ("INTEGER", "NUMERIC"),
    "real": ("REAL",),
    "text": ("TEXT",),
    "date": ("TEXT", "NUMERIC"),
}
_TYPES = {
    "integer": (
        "smallint",
        "integer",
        "bigint",
        "tinyint",
        "hugeint",
        "int",
        "int2",
        "int4",
        "int8",
    ),
    "boolean": ("boolean", "bool"),
    "real": ("double precision", "real", "double", "float", "float4", "float8"),
    "text": (
        "text",
        "character varying",
        "varchar",
        "character",
        "char",
        "bpchar",
        "citext",
        "string",
    ),
    "date": ("date",),
}


def _agrees(engine: str, declared: str, stored: StoredColumn) -> bool:
    if engine == "sqlite":
        return stored.sqlite_affinity in _SQLITE_AFFINITIES[declared]
    base = stored.type.lower().split("(")[0].strip().split(".")[-1].strip('"')
    return base in _TYPES[declared] or base.startswith(("uint", "utiny", "usmall", "ubig"))


def key_type_problems(engine: sa.Engine, tables: Mapping[str, TableConfig]) -> list[str]:
    """What ``dpgate config check`` reports of the declared join keys (issue 31): a join
    column whose storage disagrees with its declared type (an untyped or TEXT column
    declared ``integer`` on SQLite: its values stored as text never join), and a
    reference between columns of different storage types or collations (its keys are
    compared with conversions, so the join cannot rest on the key's uniqueness: it is
    bounded after the join, and may match other rows than the declared type suggests; a
    privacy-unit path between them is refused, ``JoinKeys.mismatched``). Each names the
    column. Reads the catalogue only; on ClickHouse and Spark only the references are
    compared (their type names are not mapped to declared types here)."""
    name = engine.dialect.name
    proving = name in ("sqlite", "postgresql", "duckdb")
    if not proving and engine_kind(engine) not in ("clickhouse", "spark"):
        return []
    storage = {key: stored_columns(engine, t) for key, t in tables.items()}
    problems: list[str] = []
    seen: set[tuple[str, str]] = set()

    def check(key: str, column: str) -> StoredColumn | None:
        cols = storage.get(key)
        stored = cols.get(column.lower()) if cols else None
        if stored is None or (key, column) in seen:
            return stored
        seen.add((key, column))
        declared = tables[key].columns[column].type
        if proving and not _agrees(name, declared, stored):
            shown = stored.type or "no type"
            problems.append(
                f"tables.{tables[key].name}.columns.{column}: declared {declared} but stored "
                f"as {shown}; a join compares its stored values, so values not held as "
                f"{declared} never match (declare the column's real type, or store it as "
                f"{declared})"
            )
        return stored

    for key, t in tables.items():
        for r in t.references:
            a, b = check(key, r.column), check(r.table, r.target)
            if a is None or b is None:
                continue
            if name == "sqlite":
                differ = a.sqlite_affinity != b.sqlite_affinity
            else:
                differ = (a.type, a.collation) != (b.type, b.collation)
            if differ and not tables[r.table].public and name != "sqlite":
                problems.append(
                    f"tables.{t.name}.references.{r.column}: {t.name}.{r.column} is stored as "
                    f"{_shown(a)} but {tables[r.table].name}.{r.target} as {_shown(b)}; this "
                    "privacy-unit path could join one person's rows to another's, so queries "
                    "joining through it are refused (store both alike)"
                )
            elif (
                differ
                and engine_kind(engine) == "clickhouse"
                and not clickhouse_joinable(a.type, b.type)
            ):
                problems.append(
                    f"tables.{t.name}.references.{r.column}: {t.name}.{r.column} is stored as "
                    f"{_shown(a)} but {tables[r.table].name}.{r.target} as {_shown(b)}; "
                    "ClickHouse has no common type to join them on, so queries joining "
                    "through it are refused (store both alike)"
                )
            elif differ:
                other = tables[r.table].name
                problems.append(
                    f"tables.{t.name}.references.{r.column}: {t.name}.{r.column} is stored as "
                    f"{_shown(a)} but {other}.{r.target} as {_shown(b)}; the join converts "
                    "one to the other, so dpgate bounds each person's rows after it and "
                    "cannot rely on the key being unique (store both alike)"
                )
    return problems


def _shown(c: StoredColumn) -> str:
    text = c.type or "no type"
    return f"{text} COLLATE {c.collation}" if c.collation and c.collation != "?" else text
