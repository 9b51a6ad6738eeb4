"""A DB-API 2.0 driver and SQLAlchemy dialect for chDB, ClickHouse embedded in-process.

The URL ``chdb:///data/dir`` (``chdb:////abs/dir`` for an absolute path, as for SQLite)
opens the ClickHouse data directory ``data/dir`` read-only: chDB's ``mode=ro`` starts
its session with ``readonly=2`` — no INSERT, DDL or other write, while the per-statement
settings dpgate sets (``gateway/sql/engines/clickhouse.py``) stay allowed. One process can
hold one chDB data directory (chDB's embedded server is a process-wide singleton); any
number of connections to it.

Statements are sent as they are: this driver binds no parameters (dpgate's statements
carry their literals, built by sqlglot), so neither ``?`` nor ``%`` in a string literal
is ever read as a placeholder. A failure is raised as ``OperationalError`` whose
``sqlstate`` is ClickHouse's numeric error code (159 is TIMEOUT_EXCEEDED) and whose text
is only that code: ClickHouse's own message can quote a value of the rows.
"""

from __future__ import annotations

import re
from typing import Any

from sqlalchemy.engine import URL

from gateway.sql.engines.dbapi import (  # PEP 249 wants them on the driver's module
    DatabaseError,
    DataError,
    Error,
    IntegrityError,
    InterfaceError,
    InternalError,
    NoTransactionDialect,
    NotSupportedError,
    OperationalError,
    ProgrammingError,
    ResultCursor,
    Warning,
)

__all__ = [
    "ChdbDialect",
    "Connection",
    "Cursor",
    "DataError",
    "DatabaseError",
    "Error",
    "IntegrityError",
    "InterfaceError",
    "InternalError",
    "NotSupportedError",
    "OperationalError",
    "ProgrammingError",
    "Warning",
    "connect",
]

apilevel = "2.0"
threadsafety = 1  # connections may not be shared between threads; the pool gives each its own
paramstyle = "qmark"  # declared for SQLAlchemy; no parameter is ever bound

_CODE = re.compile(r"Code: (\d+)\.")
_ENGINE = "ClickHouse"


def connect(path: str, readonly: bool = True) -> Connection:
    """A connection to the chDB data directory ``path`` (read-only unless told)."""
    return Connection(path, readonly)


class Connection:
    """One chDB session on the data directory."""

    def __init__(self, path: str, readonly: bool) -> None:
        import chdb

        if not path or path == ":memory:":
            raise InterfaceError("a chDB data directory is required")
        try:
            self._conn = chdb.connect(f"file:{path}" + ("?mode=ro" if readonly else ""))
        except Exception as e:  # chDB raises its own and RuntimeError
            raise OperationalError(_ENGINE, _code(e)) from None

    def cursor(self) -> Cursor:
        return Cursor(self._conn.cursor())

    def commit(self) -> None:
        """ClickHouse has no transactions: nothing to commit."""

    def rollback(self) -> None:
        """ClickHouse has no transactions: nothing to roll back."""

    def close(self) -> None:
        self._conn.close()


class Cursor(ResultCursor):
    """Runs one statement at a time and holds its (small, aggregated) result."""

    def __init__(self, cursor: Any) -> None:
        super().__init__()
        self._cursor = cursor

    def run(self, operation: str) -> tuple[list[str], list[tuple[Any, ...]]]:
        try:
            self._cursor.execute(operation)
            names = list(self._cursor.column_names())
            rows = self._cursor.fetchall() if names else ()
        except Exception as e:  # chDB's ChdbError, RuntimeError from the engine
            raise OperationalError(_ENGINE, _code(e)) from None
        return names, [tuple(r) for r in rows]


def _code(e: BaseException) -> str | None:
    """ClickHouse's error code in an exception's text, and nothing else of it."""
    found = _CODE.search(str(e))
    return found.group(1) if found else None


class ChdbDialect(NoTransactionDialect):
    """SQLAlchemy's view of chDB: the ClickHouse dialect name (so sqlglot compiles for
    ClickHouse), this module as its DB-API."""

    name = "clickhouse"
    driver = "chdb"
    # SQLAlchemy looks for this on the dialect's own class, not on a base
    supports_statement_cache = True

    @classmethod
    def import_dbapi(cls) -> Any:
        import sys

        return sys.modules[__name__]

    def create_connect_args(self, url: URL) -> tuple[list[Any], dict[str, Any]]:
        return [], {"path": url.database or ""}
