"""The part of ``dpgate config check`` that compares the config with the protected
database's catalogue (``gateway/sql/engines/catalogue.py``) and says what the catalogue means
for analysts: which declared tables and columns are missing (problems), and, per table,
which columns may hold NULL (and which are declared NULL exactly when a condition holds),
whether the privacy unit is kept unique, which keys and constraints were found, and what
the engine could not tell.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from gateway.core.config import Config, TableConfig

if TYPE_CHECKING:  # the catalogue reader imports SQLAlchemy: only when a check runs
    from gateway.sql.engines.catalogue import SchemaReading, TableFacts

#: Engines by the name ``read_schema`` gives them, as an operator would write them.
ENGINE_NAMES = {
    "sqlite": "SQLite",
    "postgresql": "PostgreSQL",
    "duckdb": "DuckDB",
    "clickhouse": "ClickHouse",
    "spark": "Spark SQL",
}


@dataclass(frozen=True)
class SchemaReport:
    """What config check prints after the config's own checks: ``problems`` make it
    fail (exit 2); ``notes`` are the readable report of a schema that matches."""

    problems: tuple[str, ...]
    notes: tuple[str, ...]


#: What a note means for analysts, said once after the tables that have it.
MEANINGS = {
    "nullable": (
        "may hold NULL: `nullable` is not declared, so dpgate takes the catalogue's word and "
        "the auditor keeps a NULL cell for each (what declaring it would change: below); a "
        "table made by CREATE TABLE AS, or written by Spark, has every column nullable"
    ),
    "unknown": "nullability unknown: taken as nullable (as above); declare `nullable:`",
    "null_when": (
        "NULL exactly when (`null_when`): a row whose column is NULL where its condition "
        "does not hold, or holds a value where it does, is left out of every query (a test "
        "per row in the compiled SQL, like undeclared values); the auditor knows the groups "
        "such rows would form are empty, so they are never refused as small"
    ),
    "unique": (
        "kept unique: one row per unit holds by the database's own enforcement, so the "
        "compiled SQL needs no per-unit bound (faster; answers are the same)"
    ),
    "bounded": (
        "bounded in SQL: the compiled statement keeps at most max_rows_per_unit rows per "
        "unit (a window), which costs the engine a sort; a primary key or unique NOT NULL "
        "unit column with max_rows_per_unit 1 spares it"
    ),
    "index": (
        "no index leads with the unit: PostgreSQL then sorts the whole table for each "
        "per-unit bound; with the index it reads the table in unit order and sorts each "
        "unit's few rows only (incremental sort; bench/README.md, 'Tables without a unit "
        "key'). It changes no answer"
    ),
    "read bound": (
        "read bound: a query with a WHERE evaluates it on each unit's first "
        "max_rows_read_per_unit rows (default 10 × max_rows_per_unit), then keeps the first "
        "max_rows_per_unit that pass — a second window. Set max_rows_read_per_unit to "
        "max_rows_per_unit and the rows read and passing are the rows kept: one window "
        "fewer (on SQLite 30–40% less CPU at 258K rows, and a shorter deadline), at the "
        "price of reading fewer of a person's rows when they have more than that"
    ),
    "sqlite windows": (
        "per-unit windows on SQLite: each bounded statement costs several times a scan of "
        "the table, with or without an index (measured: bench/README.md, 'Tables without a "
        "unit key'). An index on the unit spares a query that only counts its sort, but "
        "SQLite then reads a windowed query's rows through it, which was slower at 1M rows; "
        "declare `rows` so that the cost model sizes its deadlines, set the read bound as "
        "above, or keep the unit unique (a key, max_rows_per_unit 1) where the data allows"
    ),
    "checks": (
        "CHECK constraints: a column they keep inside its declared values or bounds needs "
        "no domain filter or clamp in the compiled SQL"
    ),
    "sorting": "sorting key (ClickHouse): orders rows, keeps nothing unique",
}


def schema_report(cfg: Config, reading: SchemaReading) -> SchemaReport:
    """Compare the declared tables with what ``reading`` found (see the module doc)."""
    engine = ENGINE_NAMES.get(reading.engine, reading.engine)
    if reading.failure is not None:
        return SchemaReport(
            (f"database.url: cannot read the schema of the {engine} database ({reading.failure})",),
            (),
        )
    problems: list[str] = []
    notes = [f"database: {engine}; schema read from its catalogue (metadata only, no rows)"]
    seen: set[str] = set()
    for key, t in cfg.tables.items():
        facts = reading.tables.get(key)
        if facts is None or not facts.found:
            problems.append(f"tables.{t.name}: no such table in the protected database")
            continue
        missing = [c.name for c in t.columns.values() if facts.column(c.name) is None]
        problems += [f"tables.{t.name}.columns.{name}: no such column" for name in missing]
        notes += _table_notes(t, facts, seen, reading.engine)
    if seen:
        notes.append("what this means for analysts:")
        notes += [f"  - {MEANINGS[k]}" for k in MEANINGS if k in seen]
    return SchemaReport(tuple(problems), tuple(notes))


def _table_notes(t: TableConfig, facts: TableFacts, seen: set[str], engine: str) -> list[str]:
    where = f"{t.schema}.{t.sql_name}" if t.schema else t.sql_name
    lines = [f"tables.{t.name} ({where}): {len(facts.columns)} column(s) in the database"]
    for kind, line in (
        *_nullability_notes(t, facts),
        *_null_when_notes(t, facts),
        *_unit_notes(t, facts),
        *_unit_index_notes(t, facts, engine, where),
        *_constraint_notes(facts),
    ):
        seen.add(kind)
        lines.append(f"    {line}")
    lines += [f"    not read: {what}" for what in facts.unread]
    return lines


def _nullability_notes(t: TableConfig, facts: TableFacts) -> list[tuple[str, str]]:
    """Columns left to the catalogue's nullability that it lets hold NULL."""
    nullable, unknown = [], []
    for c in t.columns.values():
        found = facts.column(c.name)
        if c.nullable is not None or found is None:
            continue
        if found.nullable is None:
            unknown.append(c.name)
        elif found.nullable:
            nullable.append(c.name)
    lines = []
    if nullable:
        lines.append(("nullable", f"may hold NULL: {', '.join(nullable)}"))
    if unknown:
        lines.append(("unknown", f"nullability unknown: {', '.join(unknown)}"))
    return lines


def _null_when_notes(t: TableConfig, facts: TableFacts) -> list[tuple[str, str]]:
    """The columns declared NULL exactly when a condition holds, with the condition; and
    where the catalogue keeps such a column NOT NULL, that no row where it holds is read."""
    lines = []
    for c in t.columns.values():
        if c.null_when is None:
            continue
        line = f"NULL exactly when: {c.name} ({c.null_when})"
        found = facts.column(c.name)
        if found is not None and found.nullable is False:
            line += (
                " — but the database keeps it NOT NULL: every row where the condition "
                "holds is left out of every query"
            )
        lines.append(("null_when", line))
    return lines


def _unit_notes(t: TableConfig, facts: TableFacts) -> list[tuple[str, str]]:
    """Whether the database keeps the privacy unit unique, and so how the bound is kept."""
    if t.public or t.privacy_unit is None:
        return []
    unit = t.privacy_unit.lower()
    unique = any([c.lower() for c in cols] == [unit] for cols in facts.unique)
    declared = t.columns[t.privacy_unit]
    found = facts.column(t.privacy_unit)
    not_null = declared.nullable is False or (
        declared.nullable is None and found is not None and found.nullable is False
    )
    name = f"privacy unit {t.privacy_unit}"
    if unique and not_null and t.max_rows_per_unit == 1:
        return [("unique", f"{name}: kept unique and NOT NULL by the database")]
    why = "unique but may hold NULL" if unique else "not kept unique by the database"
    return [("bounded", f"{name}: {why}; bounded in SQL to {t.max_rows_per_unit} row(s)")]


def _unit_index_notes(
    t: TableConfig, facts: TableFacts, engine: str, where: str
) -> list[tuple[str, str]]:
    """For a table without a unit key (its unit bounded by windows): the read bound that
    spares a query with a WHERE its second window; on PostgreSQL, the index to create
    when none leads with the unit; on SQLite, what the windows cost whatever the index."""
    if t.public or t.privacy_unit is None:
        return []
    unit = t.privacy_unit
    if any([c.lower() for c in cols] == [unit.lower()] for cols in facts.unique):
        return []
    notes: list[tuple[str, str]] = []
    if t.rows_read_bound > t.max_rows_per_unit:
        notes.append(
            (
                "read bound",
                f"privacy unit {unit}: a query with a WHERE reads up to {t.rows_read_bound} "
                f"rows per unit and keeps {t.max_rows_per_unit} (two windows); "
                f"max_rows_read_per_unit: {t.max_rows_per_unit} keeps the rows read (one)",
            )
        )
    if engine == "sqlite":
        notes.append(("sqlite windows", f"privacy unit {unit}: bounded by per-unit windows"))
    if engine != "postgresql":
        return notes
    if any(cols and cols[0].lower() == unit.lower() for cols in facts.indexed):
        notes.append(
            ("", f"privacy unit {unit}: an index leads with it (per-unit sorts are small)")
        )
        return notes
    index = f"{t.sql_name}_{unit}_dpgate".lower()
    notes.append(("index", f"no index leads with {unit}: CREATE INDEX {index} ON {where} ({unit})"))
    return notes


def _constraint_notes(facts: TableFacts) -> list[tuple[str, str]]:
    lines = []
    if facts.unique:
        keys = "; ".join(f"({', '.join(cols)})" for cols in facts.unique)
        lines.append(("", f"unique keys: {keys}"))
    if facts.sorting_key:
        lines.append(("sorting", f"sorting key: ({', '.join(facts.sorting_key)})"))
    if facts.checks:
        lines.append(("checks", f"CHECK constraints: {len(facts.checks)}"))
    return lines
