"""SQLAlchemy dialect for dpgate: ``dpgate://KEY@host:port`` and ``dpgate+https://…``.

Reflection answers from ``GET /v1/schema`` (the metadata the admin declared public) and
never from the data: tables and columns with their types, no views, keys, indexes or
constraints. Table and column comments carry the declared bounds, value domains and
privacy unit, so a BI tool shows them next to the column.

The SQL it compiles is ANSI/SQLite-like — double-quoted identifiers, ``LIMIT n OFFSET
m``, ``TRUE``/``FALSE`` — which is what the gateway's analyzer reads. Bound parameters
use the driver's ``named`` paramstyle and are rendered as quoted literals by the driver.

Works with SQLAlchemy 1.4 (which Apache Superset pins) and 2.x.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Any

import sqlalchemy
from sqlalchemy import types as sqltypes
from sqlalchemy.engine import default
from sqlalchemy.sql import compiler

from dpgate_client import dbapi as dpgate_dbapi
from dpgate_client.errors import ConnectionFailedError
from dpgate_client.results import ColumnSchema, Schema, TableSchema

if TYPE_CHECKING:  # SQLAlchemy 2 names; 1.4 has none of them at runtime
    from sqlalchemy.engine.interfaces import (
        ReflectedCheckConstraint,
        ReflectedColumn,
        ReflectedForeignKeyConstraint,
        ReflectedIndex,
        ReflectedPrimaryKeyConstraint,
        ReflectedTableComment,
        ReflectedUniqueConstraint,
    )

__all__ = [
    "DEFAULT_SCHEMA",
    "DpgateCompiler",
    "DpgateDialect",
    "DpgateHttpsDialect",
    "DpgateIdentifierPreparer",
    "sqlalchemy_type",
]

DEFAULT_SCHEMA = "main"
_SCHEMA_CACHE_KEY = ("dpgate", "public_schema")
_SQLALCHEMY_1 = sqlalchemy.__version__.startswith("1.")

_TYPES: dict[str, type[sqltypes.TypeEngine[Any]]] = {
    "integer": sqltypes.Integer,
    "bigint": sqltypes.BigInteger,
    "real": sqltypes.Float,
    "float": sqltypes.Float,
    "numeric": sqltypes.Numeric,
    "text": sqltypes.String,
    "string": sqltypes.String,
    "boolean": sqltypes.Boolean,
    "date": sqltypes.Date,
    "timestamp": sqltypes.DateTime,
    "datetime": sqltypes.DateTime,
}


def sqlalchemy_type(gateway_type: str) -> sqltypes.TypeEngine[Any]:
    """The SQLAlchemy type for one of the gateway's type names (unknown → NullType)."""
    cls = _TYPES.get(gateway_type.lower())
    return cls() if cls is not None else sqltypes.NullType()


# SQLite's keyword list plus SQLAlchemy's ANSI list: quoting a little too often is
# harmless, quoting too rarely is a syntax error.
_RESERVED = set(compiler.RESERVED_WORDS) | {
    "abort", "action", "add", "after", "all", "alter", "analyze", "and", "as", "asc",
    "attach", "autoincrement", "before", "begin", "between", "by", "cascade", "case",
    "cast", "check", "collate", "column", "commit", "conflict", "constraint", "create",
    "cross", "current_date", "current_time", "current_timestamp", "database", "default",
    "deferrable", "deferred", "delete", "desc", "detach", "distinct", "drop", "each",
    "else", "end", "escape", "except", "exclusive", "exists", "explain", "fail", "filter",
    "for", "foreign", "from", "full", "glob", "group", "having", "if", "ignore",
    "immediate", "in", "index", "indexed", "initially", "inner", "insert", "instead",
    "intersect", "into", "is", "isnull", "join", "key", "left", "like", "limit", "match",
    "natural", "no", "not", "notnull", "null", "of", "offset", "on", "or", "order",
    "outer", "over", "partition", "plan", "pragma", "primary", "query", "raise", "range",
    "recursive", "references", "regexp", "reindex", "release", "rename", "replace",
    "restrict", "right", "rollback", "row", "rows", "savepoint", "select", "set",
    "table", "temp", "temporary", "then", "to", "transaction", "trigger", "union",
    "unique", "update", "using", "vacuum", "values", "view", "virtual", "when", "where",
    "window", "with", "without",
}  # fmt: skip


class DpgateIdentifierPreparer(compiler.IdentifierPreparer):
    """Double-quoted identifiers, quoted when reserved, mixed-case or unusual."""

    reserved_words = _RESERVED


class DpgateCompiler(compiler.SQLCompiler):
    """ANSI/SQLite-style SELECT text for the gateway's analyzer (``LIMIT n OFFSET m``)."""

    def limit_clause(self, select: Any, **kw: Any) -> str:
        text = ""
        if select._limit_clause is not None:
            text += "\n LIMIT " + self.process(select._limit_clause, **kw)
        if select._offset_clause is not None:
            # OFFSET alone, not SQLite's "LIMIT -1 OFFSET n": the gateway refuses
            # negative limits.
            text += "\n OFFSET " + self.process(select._offset_clause, **kw)
        return text


def _dbapi_connection(connection: Any) -> dpgate_dbapi.Connection:
    """The driver connection under a SQLAlchemy ``Connection`` (1.4 and 2.x)."""
    fairy = connection.connection
    raw = getattr(fairy, "dbapi_connection", None) or getattr(fairy, "connection", None)
    if not isinstance(raw, dpgate_dbapi.Connection):
        raw = fairy
    assert isinstance(raw, dpgate_dbapi.Connection)
    return raw


class DpgateDialect(default.DefaultDialect):
    """``dpgate://KEY@host:port[/prefix][?epsilon=…&delta=…&mechanism=…]`` over HTTP.

    The key may also be the URL's password (``dpgate://analyst:KEY@host:port``), which
    BI tools mask in their UI.
    """

    name = "dpgate"
    driver = "http"
    scheme = "http"

    supports_statement_cache = True
    supports_alter = False
    supports_comments = True
    inline_comments = False
    supports_sequences = False
    sequences_optional = False
    supports_native_boolean = True
    supports_native_decimal = False
    supports_native_enum = False
    supports_default_values = False
    supports_default_metavalue = False
    supports_empty_insert = False
    supports_multivalues_insert = False
    supports_is_distinct_from = True
    supports_server_side_cursors = False
    supports_sane_rowcount = False
    supports_sane_multi_rowcount = False
    supports_simple_order_by_label = True
    postfetch_lastrowid = False
    implicit_returning = False
    full_returning = False
    requires_name_normalize = False
    description_encoding = None
    max_identifier_length = 128
    default_paramstyle = "named"

    preparer = DpgateIdentifierPreparer
    statement_compiler = DpgateCompiler

    @classmethod
    def import_dbapi(cls) -> ModuleType:
        return dpgate_dbapi

    # -- connecting

    def create_connect_args(self, url: Any) -> tuple[list[Any], dict[str, Any]]:
        if not url.host:
            raise ConnectionFailedError(
                "a dpgate URL needs a host: dpgate://KEY@host:port", code="invalid_url"
            )
        key = url.password if url.password else url.username
        host = url.host if ":" not in url.host else f"[{url.host}]"
        netloc = host + (f":{url.port}" if url.port else "")
        prefix = f"/{url.database.strip('/')}" if url.database else ""
        kwargs: dict[str, Any] = {"url": f"{self.scheme}://{netloc}{prefix}"}
        if key:
            kwargs["key"] = str(key)
        for option in ("epsilon", "delta", "mechanism", "timeout", "verify", "ca_file"):
            value = url.query.get(option)
            if isinstance(value, tuple):
                value = value[-1]
            if value is not None:
                kwargs[option] = value
        return [], kwargs

    def do_ping(self, dbapi_connection: Any) -> bool:
        """Ask the gateway for the analyst's budget: proves it is up and the key works."""
        conn: dpgate_dbapi.Connection = dbapi_connection
        return conn.ping()

    def is_disconnect(self, e: Any, connection: Any, cursor: Any) -> bool:
        return isinstance(e, ConnectionFailedError)

    def do_rollback(self, dbapi_connection: Any) -> None:
        pass

    def do_commit(self, dbapi_connection: Any) -> None:
        pass

    def get_isolation_level(self, dbapi_connection: Any) -> Any:
        return "AUTOCOMMIT"

    def get_default_isolation_level(self, dbapi_conn: Any) -> Any:
        return "AUTOCOMMIT"

    def set_isolation_level(self, dbapi_connection: Any, level: Any) -> None:
        pass

    def _get_server_version_info(self, connection: Any) -> tuple[int, ...] | None:
        return None

    def _get_default_schema_name(self, connection: Any) -> str:
        return DEFAULT_SCHEMA

    def _check_max_identifier_length(self, connection: Any) -> int | None:
        return None

    # -- reflection (from GET /v1/schema, cached per Inspector)

    def _public_schema(
        self, connection: Any, info_cache: dict[Any, Any] | None = None, **kw: Any
    ) -> Schema:
        # Cached in the Inspector's info_cache (what @reflection.cache does; that
        # decorator cannot wrap annotated functions on SQLAlchemy 1.4).
        if info_cache is None:
            return _dbapi_connection(connection).client.schema()
        if _SCHEMA_CACHE_KEY not in info_cache:
            info_cache[_SCHEMA_CACHE_KEY] = _dbapi_connection(connection).client.schema()
        schema: Schema = info_cache[_SCHEMA_CACHE_KEY]
        return schema

    def _tables(self, connection: Any, schema: str | None, **kw: Any) -> list[TableSchema]:
        wanted = schema or self.default_schema_name or DEFAULT_SCHEMA
        return [
            t
            for t in self._public_schema(connection, **kw).tables
            if (t.schema or DEFAULT_SCHEMA) == wanted
        ]

    def _table(
        self, connection: Any, table_name: str, schema: str | None, **kw: Any
    ) -> TableSchema:
        for table in self._tables(connection, schema, **kw):
            if table.name == table_name:
                return table
        for table in self._tables(connection, schema, **kw):
            if table.name.lower() == table_name.lower():
                return table
        raise sqlalchemy.exc.NoSuchTableError(f"{schema}.{table_name}" if schema else table_name)

    def get_schema_names(self, connection: Any, **kw: Any) -> list[str]:
        schemas = {t.schema or DEFAULT_SCHEMA for t in self._public_schema(connection, **kw).tables}
        return sorted(schemas or {DEFAULT_SCHEMA})

    def get_table_names(self, connection: Any, schema: str | None = None, **kw: Any) -> list[str]:
        return sorted(t.name for t in self._tables(connection, schema, **kw))

    def has_table(
        self, connection: Any, table_name: str, schema: str | None = None, **kw: Any
    ) -> bool:
        try:
            self._table(connection, table_name, schema, **kw)
        except sqlalchemy.exc.NoSuchTableError:
            return False
        return True

    def has_schema(self, connection: Any, schema_name: str, **kw: Any) -> bool:
        return schema_name in self.get_schema_names(connection, **kw)

    def get_view_names(self, connection: Any, schema: str | None = None, **kw: Any) -> list[str]:
        return []

    def get_materialized_view_names(
        self, connection: Any, schema: str | None = None, **kw: Any
    ) -> list[str]:
        return []

    def get_temp_table_names(
        self, connection: Any, schema: str | None = None, **kw: Any
    ) -> list[str]:
        return []

    def get_temp_view_names(
        self, connection: Any, schema: str | None = None, **kw: Any
    ) -> list[str]:
        return []

    def get_sequence_names(
        self, connection: Any, schema: str | None = None, **kw: Any
    ) -> list[str]:
        return []

    def get_view_definition(
        self, connection: Any, view_name: str, schema: str | None = None, **kw: Any
    ) -> str:
        raise sqlalchemy.exc.NoSuchTableError(view_name)

    def get_columns(
        self, connection: Any, table_name: str, schema: str | None = None, **kw: Any
    ) -> list[ReflectedColumn]:
        table = self._table(connection, table_name, schema, **kw)
        return [_reflected_column(c, table) for c in table.columns]

    def get_pk_constraint(
        self, connection: Any, table_name: str, schema: str | None = None, **kw: Any
    ) -> ReflectedPrimaryKeyConstraint:
        self._table(connection, table_name, schema, **kw)
        return {"constrained_columns": [], "name": None}

    def get_foreign_keys(
        self, connection: Any, table_name: str, schema: str | None = None, **kw: Any
    ) -> list[ReflectedForeignKeyConstraint]:
        self._table(connection, table_name, schema, **kw)
        return []

    def get_indexes(
        self, connection: Any, table_name: str, schema: str | None = None, **kw: Any
    ) -> list[ReflectedIndex]:
        self._table(connection, table_name, schema, **kw)
        return []

    def get_unique_constraints(
        self, connection: Any, table_name: str, schema: str | None = None, **kw: Any
    ) -> list[ReflectedUniqueConstraint]:
        self._table(connection, table_name, schema, **kw)
        return []

    def get_check_constraints(
        self, connection: Any, table_name: str, schema: str | None = None, **kw: Any
    ) -> list[ReflectedCheckConstraint]:
        self._table(connection, table_name, schema, **kw)
        return []

    def get_table_options(
        self, connection: Any, table_name: str, schema: str | None = None, **kw: Any
    ) -> dict[str, Any]:
        return {}

    def get_table_comment(
        self, connection: Any, table_name: str, schema: str | None = None, **kw: Any
    ) -> ReflectedTableComment:
        table = self._table(connection, table_name, schema, **kw)
        text = "Protected by dpgate: answers are differentially private aggregates"
        if table.privacy_unit:
            text += f" (privacy unit: {table.privacy_unit})"
        return {"text": text + "."}


def _reflected_column(column: ColumnSchema, table: TableSchema) -> ReflectedColumn:
    comment = column.describe()
    if table.privacy_unit and column.name == table.privacy_unit:
        comment = "privacy unit" + (f"; {comment}" if comment else "")
    return {
        "name": column.name,
        "type": sqlalchemy_type(column.type),
        "nullable": column.nullable,
        "default": None,
        "autoincrement": False,
        "comment": comment,
    }


class DpgateHttpsDialect(DpgateDialect):
    """``dpgate+https://KEY@host[:port][/prefix]``: the same dialect over TLS."""

    driver = "https"
    scheme = "https"
    supports_statement_cache = True


if _SQLALCHEMY_1:
    # SQLAlchemy 1.4 loads the driver through a ``dbapi()`` classmethod; 2.x warns
    # when one exists, so it is only added for 1.4.
    def _dbapi(cls: type[DpgateDialect]) -> ModuleType:
        return dpgate_dbapi

    DpgateDialect.dbapi = classmethod(_dbapi)  # type: ignore[assignment]
