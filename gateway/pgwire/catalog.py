"""The emulated PostgreSQL catalogue: what BI tools ask on connect, answered from the config.

Clients learn what a database holds from ``pg_catalog`` and ``information_schema``.
dpgate never asks the protected database: its catalogue carries row estimates
(``pg_class.reltuples``, ``relpages``, ``pg_stats``) computed from the protected rows.
Instead an in-memory DuckDB database holds tables named and shaped like PostgreSQL's
catalogue, filled from the declared tables and columns only — public by declaration
(docs/design.md, invariant 5: only what is declared public is published). Row estimates
are PostgreSQL's "never analysed" values (``reltuples = -1``, ``relpages = 0``).

Client SQL reaches it only through ``gateway.pgwire.rewrite``, which maps catalogue
names onto these tables and refuses anything else. The DuckDB connection cannot read
files or the network (``enable_external_access = false``, locked), runs one thread,
has a memory cap, and each statement is interrupted after ``STATEMENT_TIMEOUT_S``.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import duckdb

import gateway
from gateway.core.config import Config
from gateway.pgwire.catalog_settings import (
    DATABASE,
    FIRST_USER_OID,
    INFORMATION_SCHEMA_OID,
    OWNER,
    PG_CATALOG_OID,
    PG_TYPES,
    PUBLIC_OID,
    SETTINGS,
    TYPE_OF_VALUE,
)
from gateway.pgwire.catalog_tables import CATALOG_TABLES, DEFAULTS, INFORMATION_SCHEMA_TABLES

VERSION_TEXT = gateway.VERSION_TEXT
STATEMENT_TIMEOUT_S = 2.0
MAX_ROWS = 100_000

CATALOG_SCHEMA = "pgc"  # pg_catalog's emulation
INFO_SCHEMA = "isc"  # information_schema's emulation


@dataclass(frozen=True)
class CatalogResult:
    """A catalogue answer: column names with DuckDB type names, and the rows."""

    columns: tuple[tuple[str, str], ...]
    rows: list[tuple[Any, ...]]


class CatalogError(Exception):
    """The catalogue query failed (a missing emulated column, a timeout, …)."""


class Catalog:
    """The emulated catalogue of one config, shared by every connection of a server."""

    def __init__(self, config: Config) -> None:
        self._db = duckdb.connect(":memory:", config={"threads": 1, "memory_limit": "64MB"})
        self._closed = False
        self._lock = threading.Lock()
        self.table_oids: dict[str, int] = {}
        # declared column name → type over this catalogue's tables only, for parameters a
        # client leaves untyped (a name declared with two types is left out: its
        # parameters stay untyped); a table the analyst may not read adds nothing
        kinds: dict[str, set[str]] = {}
        for table in config.tables.values():
            for column in table.columns.values():
                kinds.setdefault(column.name, set()).add(column.type)
        self.column_types = {n: next(iter(k)) for n, k in kinds.items() if len(k) == 1}
        self._build(config)
        for setting in (
            "SET enable_external_access = false",
            "SET autoinstall_known_extensions = false",
            "SET autoload_known_extensions = false",
            "SET lock_configuration = true",
        ):
            self._db.execute(setting)

    def _build(self, config: Config) -> None:
        db = self._db
        for schema_name, tables in (
            (CATALOG_SCHEMA, CATALOG_TABLES),
            (INFO_SCHEMA, INFORMATION_SCHEMA_TABLES),
        ):
            db.execute(f"CREATE SCHEMA {schema_name}")
            for name, columns in tables.items():
                cols = ", ".join(f'"{c}" {t}' for c, t in columns)
                db.execute(f'CREATE TABLE {schema_name}."{name}" ({cols})')
        namespaces = {
            "pg_catalog": PG_CATALOG_OID,
            "public": PUBLIC_OID,
            "information_schema": INFORMATION_SCHEMA_OID,
        }
        next_oid = FIRST_USER_OID
        for t in config.tables.values():
            schema = t.schema or "public"
            if schema not in namespaces:
                namespaces[schema] = next_oid
                next_oid += 1
        for name, oid in namespaces.items():
            self._insert(CATALOG_SCHEMA, "pg_namespace", {"oid": oid, "nspname": name})
            self._insert(
                INFO_SCHEMA,
                "schemata",
                {"catalog_name": DATABASE, "schema_name": name, "schema_owner": OWNER},
            )
        for oid, name, size, category, array, elem, display in PG_TYPES:
            self._insert(
                CATALOG_SCHEMA,
                "pg_type",
                {
                    "oid": oid,
                    "typname": name,
                    "typnamespace": PG_CATALOG_OID,
                    "typlen": size,
                    "typbyval": 0 < size <= 8,
                    "typcategory": category,
                    "typarray": array,
                    "typelem": elem,
                    "typinput": "array_in" if category == "A" else f"{name}in",
                    "typoutput": f"{name}out",
                    "typreceive": f"{name}recv",
                    "typsend": f"{name}send",
                    "typcollation": 100 if category == "S" else 0,
                },
            )
            self._insert(CATALOG_SCHEMA, "dpg_type_display", {"oid": oid, "display": display})
        for t in config.tables.values():
            schema = t.schema or "public"
            table_oid, row_type = next_oid, next_oid + 1
            next_oid += 2
            self.table_oids[t.name] = table_oid
            self._insert(
                CATALOG_SCHEMA,
                "pg_class",
                {
                    "oid": table_oid,
                    "relname": t.name,
                    "relnamespace": namespaces[schema],
                    "reltype": row_type,
                    "relfilenode": table_oid,
                    "relkind": "r",
                    "relnatts": len(t.columns),
                },
            )
            self._insert(
                CATALOG_SCHEMA,
                "pg_type",
                {
                    "oid": row_type,
                    "typname": t.name,
                    "typnamespace": namespaces[schema],
                    "typlen": -1,
                    "typbyval": False,
                    "typtype": "c",
                    "typcategory": "C",
                    "typrelid": table_oid,
                    "typarray": 0,
                    "typelem": 0,
                },
            )
            self._insert(
                CATALOG_SCHEMA,
                "pg_tables",
                {
                    "schemaname": schema,
                    "tablename": t.name,
                    "tableowner": OWNER,
                    "hasindexes": False,
                    "hasrules": False,
                    "hastriggers": False,
                    "rowsecurity": False,
                },
            )
            self._insert(
                INFO_SCHEMA,
                "tables",
                {
                    "table_catalog": DATABASE,
                    "table_schema": schema,
                    "table_name": t.name,
                    "table_type": "BASE TABLE",
                    "is_insertable_into": "NO",
                    "is_typed": "NO",
                },
            )
            for position, column in enumerate(t.columns.values(), start=1):
                type_oid, size = TYPE_OF_VALUE[column.type]
                typname = next(p[1] for p in PG_TYPES if p[0] == type_oid)
                display = next(p[6] for p in PG_TYPES if p[0] == type_oid)
                self._insert(
                    CATALOG_SCHEMA,
                    "pg_attribute",
                    {
                        "attrelid": table_oid,
                        "attname": column.name,
                        "atttypid": type_oid,
                        "attlen": size,
                        "attnum": position,
                        "attbyval": 0 < size <= 8,
                        "attnotnull": not column.may_be_null,
                        "attcollation": 100 if column.type == "text" else 0,
                    },
                )
                numeric = column.type in ("integer", "real")
                self._insert(
                    INFO_SCHEMA,
                    "columns",
                    {
                        "table_catalog": DATABASE,
                        "table_schema": schema,
                        "table_name": t.name,
                        "column_name": column.name,
                        "ordinal_position": position,
                        "is_nullable": "YES" if column.may_be_null else "NO",
                        "data_type": display,
                        "udt_catalog": DATABASE,
                        "udt_schema": "pg_catalog",
                        "udt_name": typname,
                        "numeric_precision": (64 if column.type == "integer" else 53)
                        if numeric
                        else None,
                        "numeric_precision_radix": 2 if numeric else None,
                        "numeric_scale": 0 if column.type == "integer" else None,
                        "dtd_identifier": str(position),
                        "is_self_referencing": "NO",
                        "is_identity": "NO",
                        "is_generated": "NEVER",
                        "is_updatable": "NO",
                    },
                )
        self._insert(
            CATALOG_SCHEMA,
            "pg_database",
            {
                "oid": 16_383,
                "datname": DATABASE,
                "datdba": 10,
                "encoding": 6,
                "datlocprovider": "c",
                "datistemplate": False,
                "datallowconn": True,
                "datconnlimit": -1,
                "dattablespace": 1663,
                "datcollate": "C.UTF-8",
                "datctype": "C.UTF-8",
            },
        )
        self._insert(
            CATALOG_SCHEMA,
            "pg_am",
            {"oid": 2, "amname": "heap", "amhandler": "heap_tableam_handler", "amtype": "t"},
        )
        self._insert(
            CATALOG_SCHEMA,
            "pg_roles",
            {
                "oid": 10,
                "rolname": OWNER,
                "rolsuper": False,
                "rolinherit": True,
                "rolcreaterole": False,
                "rolcreatedb": False,
                "rolcanlogin": True,
                "rolreplication": False,
                "rolconnlimit": -1,
                "rolbypassrls": False,
            },
        )
        self._insert(
            CATALOG_SCHEMA, "pg_tablespace", {"oid": 1663, "spcname": "pg_default", "spcowner": 10}
        )
        self._insert(
            CATALOG_SCHEMA,
            "pg_collation",
            {
                "oid": 100,
                "collname": "default",
                "collnamespace": PG_CATALOG_OID,
                "collowner": 10,
                "collprovider": "d",
                "collisdeterministic": True,
                "collencoding": -1,
            },
        )
        for name, value in SETTINGS.items():
            self._insert(
                CATALOG_SCHEMA,
                "pg_settings",
                {
                    "name": name,
                    "setting": value,
                    "context": "user",
                    "vartype": "string",
                    "source": "default",
                    "boot_val": value,
                    "reset_val": value,
                    "pending_restart": False,
                },
            )
        c, i = CATALOG_SCHEMA, INFO_SCHEMA
        for macro in (
            f"CREATE MACRO dpg_format_type(t, m) AS "
            f"(SELECT display FROM {c}.dpg_type_display d WHERE d.oid = t)",
            f"CREATE MACRO dpg_table_is_visible(r) AS COALESCE((SELECT n.nspname IN "
            f"('public', 'pg_catalog') FROM {c}.pg_class k JOIN {c}.pg_namespace n "
            f"ON n.oid = k.relnamespace WHERE k.oid = r), false)",
            f"CREATE MACRO dpg_regclass(x) AS (SELECT k.oid FROM {c}.pg_class k JOIN "
            f"{c}.pg_namespace n ON n.oid = k.relnamespace WHERE k.relname = "
            f"trim(x, '\"') OR n.nspname || '.' || k.relname = replace(x, '\"', '') LIMIT 1)",
            f"CREATE MACRO dpg_regclass_name(o) AS COALESCE((SELECT k.relname FROM "
            f"{c}.pg_class k WHERE k.oid = o), CAST(o AS VARCHAR))",
            f"CREATE MACRO dpg_regtype_name(o) AS COALESCE((SELECT display FROM "
            f"{c}.dpg_type_display d WHERE d.oid = o), CAST(o AS VARCHAR))",
            f"CREATE MACRO dpg_regtype(x) AS (SELECT t.oid FROM {c}.pg_type t WHERE t.typname "
            f"= x OR t.oid IN (SELECT d.oid FROM {c}.dpg_type_display d WHERE d.display = x) "
            f"LIMIT 1)",
            f"CREATE MACRO dpg_regnamespace_name(o) AS (SELECT nspname FROM "
            f"{c}.pg_namespace WHERE oid = o)",
        ):
            self._db.execute(macro)
        del i

    def _insert(self, schema: str, table: str, values: dict[str, Any]) -> None:
        columns = (CATALOG_TABLES if schema == CATALOG_SCHEMA else INFORMATION_SCHEMA_TABLES)[table]
        row = [values.get(c, DEFAULTS.get(c)) for c, _ in columns]
        marks = ", ".join("?" for _ in row)
        self._db.execute(f'INSERT INTO {schema}."{table}" VALUES ({marks})', row)

    def close(self) -> None:
        """Close the catalogue's database and let go of it: a DuckDB connection object
        still referenced when the interpreter exits (by a session thread, say) is
        reported by its bindings (nanobind) as a leak, closed or not."""
        with self._lock:
            db, self._closed = self._db, True
            db.close()
            del self._db

    def run(self, sql: str, parameters: Sequence[Any] = ()) -> CatalogResult:
        """Run rewritten catalogue SQL (``gateway.pgwire.rewrite``) with a timeout."""
        if self._closed:
            raise CatalogError("the server is shutting down")
        try:
            cursor = self._db.cursor()
        except (AttributeError, duckdb.Error):  # closed meanwhile
            raise CatalogError("the server is shutting down") from None
        timer = threading.Timer(STATEMENT_TIMEOUT_S, cursor.interrupt)
        timer.start()
        try:
            cursor.execute(sql, list(parameters))
            description = cursor.description or []
            rows = cursor.fetchmany(MAX_ROWS + 1)
        except duckdb.Error as e:
            raise CatalogError(_first_line(str(e))) from None
        finally:
            timer.cancel()
            cursor.close()
        if len(rows) > MAX_ROWS:
            raise CatalogError(f"a catalogue answer has at most {MAX_ROWS} rows")
        return CatalogResult(tuple((d[0], str(d[1])) for d in description), rows)


def _first_line(message: str) -> str:
    return message.strip().splitlines()[0] if message.strip() else "catalogue query failed"
