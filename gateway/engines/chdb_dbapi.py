"""A DB-API 2.0 driver and SQLAlchemy dialect for chDB, ClickHouse embedded in-process.

The URL ``chdb:///data/dir`` (``chdb:////abs/dir`` for an absolute path, as for SQLite)
opens the ClickHouse data directory ``data/dir`` read-only: chDB's ``mode=ro`` starts
its session with ``readonly=2`` — no INSERT, DDL or other write, while the per-statement
settings dpgate sets (``gateway/engines/clickhouse.py``) stay allowed. One process can
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
from collections.abc import Sequence
from typing import Any

from sqlalchemy.engine import URL, default

apilevel = "2.0"
threadsafety = 1  # connections may not be shared between threads; the pool gives each its own
paramstyle = "qmark"  # declared for SQLAlchemy; no parameter is ever bound

_CODE = re.compile(r"Code: (\d+)\.")


class Error(Exception):
    """The root of this driver's exceptions (PEP 249)."""


class Warning(Exception):
    """PEP 249's warning class (never raised)."""


class InterfaceError(Error):
    """The driver was misused (parameters given, a closed connection)."""


class DatabaseError(Error):
    """The engine refused or failed a statement."""


class OperationalError(DatabaseError):
    """A statement failed in the engine; ``sqlstate`` holds ClickHouse's error code."""

    def __init__(self, code: str | None) -> None:
        super().__init__(f"ClickHouse error {code}" if code else "ClickHouse error")
        self.sqlstate = code


class ProgrammingError(DatabaseError):
    """PEP 249's class for errors in the statement (raised as OperationalError here)."""


class IntegrityError(DatabaseError):
    """PEP 249's class for constraint violations (never raised: nothing is written)."""


class DataError(DatabaseError):
    """PEP 249's class for errors in the processed data (raised as OperationalError)."""


class InternalError(DatabaseError):
    """PEP 249's class for internal errors of the engine."""


class NotSupportedError(DatabaseError):
    """PEP 249's class for an unsupported API call."""


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
            raise OperationalError(_code(e)) from None

    def cursor(self) -> Cursor:
        return Cursor(self._conn.cursor())

    def commit(self) -> None:
        """ClickHouse has no transactions: nothing to commit."""

    def rollback(self) -> None:
        """ClickHouse has no transactions: nothing to roll back."""

    def close(self) -> None:
        self._conn.close()


class Cursor:
    """Runs one statement at a time and holds its (small, aggregated) result."""

    arraysize = 1

    def __init__(self, cursor: Any) -> None:
        self._cursor = cursor
        self._rows: list[tuple[Any, ...]] = []
        self.description: list[tuple[Any, ...]] | None = None
        self.rowcount = -1

    def execute(self, operation: str, parameters: Sequence[Any] | None = None) -> None:
        if parameters:
            raise InterfaceError("this driver binds no parameters")
        try:
            self._cursor.execute(operation)
            names = list(self._cursor.column_names())
            types = list(self._cursor.column_types())
            rows = self._cursor.fetchall() if names else ()
        except Exception as e:  # chDB's ChdbError, RuntimeError from the engine
            raise OperationalError(_code(e)) from None
        self._rows = [tuple(r) for r in rows]
        self.description = (
            [(n, t, None, None, None, None, None) for n, t in zip(names, types, strict=True)]
            if names
            else None
        )
        self.rowcount = len(self._rows) if names else -1

    def fetchall(self) -> list[tuple[Any, ...]]:
        rows, self._rows = self._rows, []
        return rows

    def fetchone(self) -> tuple[Any, ...] | None:
        return self._rows.pop(0) if self._rows else None

    def fetchmany(self, size: int | None = None) -> list[tuple[Any, ...]]:
        n = self.arraysize if size is None else size
        rows, self._rows = self._rows[:n], self._rows[n:]
        return rows

    def close(self) -> None:
        self._rows = []


def _code(e: BaseException) -> str | None:
    """ClickHouse's error code in an exception's text, and nothing else of it."""
    found = _CODE.search(str(e))
    return found.group(1) if found else None


class ChdbDialect(default.DefaultDialect):
    """SQLAlchemy's view of chDB: the ClickHouse dialect name (so sqlglot compiles for
    ClickHouse), this module as its DB-API, no transactions."""

    name = "clickhouse"
    driver = "chdb"
    supports_statement_cache = True
    supports_native_boolean = True
    default_paramstyle = "qmark"

    @classmethod
    def import_dbapi(cls) -> Any:
        import sys

        return sys.modules[__name__]

    def create_connect_args(self, url: URL) -> tuple[list[Any], dict[str, Any]]:
        return [], {"path": url.database or ""}

    def _get_server_version_info(self, connection: Any) -> tuple[int, ...] | None:
        return None

    def _get_default_schema_name(self, connection: Any) -> str:
        return "default"

    def get_default_isolation_level(self, dbapi_conn: Any) -> Any:
        return "AUTOCOMMIT"

    def get_isolation_level(self, dbapi_connection: Any) -> Any:
        return "AUTOCOMMIT"

    def do_rollback(self, dbapi_connection: Any) -> None:
        """No transactions to roll back."""

    def do_commit(self, dbapi_connection: Any) -> None:
        """No transactions to commit."""
