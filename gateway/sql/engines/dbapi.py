"""What dpgate's two DB-API drivers (``chdb_dbapi``, ``spark_dbapi``) share: PEP 249's
exception tree, a cursor over a small materialised result, and a SQLAlchemy dialect for
an engine without transactions.

Both drivers bind no parameters (dpgate's statements carry their literals, built by
sqlglot) and raise ``OperationalError`` with the engine's error code or class only: an
engine's own message can quote a value of the rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy.engine import default


class Error(Exception):
    """The root of the drivers' exceptions (PEP 249)."""


class Warning(Exception):  # the name PEP 249 requires
    """PEP 249's warning class (never raised)."""


class InterfaceError(Error):
    """The driver was misused (parameters given), or a statement is not allowed."""


class DatabaseError(Error):
    """The engine refused or failed a statement."""


class OperationalError(DatabaseError):
    """A statement failed in the engine; ``sqlstate`` holds the engine's error code or
    class (``159``, ``DIVIDE_BY_ZERO``), for the operator's log."""

    def __init__(self, engine: str, code: str | None) -> None:
        super().__init__(f"{engine} error {code}" if code else f"{engine} error")
        self.sqlstate = code


class ProgrammingError(DatabaseError):
    """PEP 249's class for errors in the statement (raised as OperationalError)."""


class IntegrityError(DatabaseError):
    """PEP 249's class for constraint violations (never raised: nothing is written)."""


class DataError(DatabaseError):
    """PEP 249's class for errors in the processed data (raised as OperationalError)."""


class InternalError(DatabaseError):
    """PEP 249's class for internal errors of the engine."""


class NotSupportedError(DatabaseError):
    """PEP 249's class for an unsupported API call."""


class ResultCursor:
    """A cursor whose ``run`` returns a statement's column names and (few, aggregated)
    rows; fetching reads them from memory."""

    arraysize = 1

    def __init__(self) -> None:
        self._rows: list[tuple[Any, ...]] = []
        self.description: list[tuple[Any, ...]] | None = None
        self.rowcount = -1

    def run(self, operation: str) -> tuple[list[str], list[tuple[Any, ...]]]:
        raise NotImplementedError

    def execute(self, operation: str, parameters: Sequence[Any] | None = None) -> None:
        if parameters:
            raise InterfaceError("this driver binds no parameters")
        names, rows = self.run(operation)
        self._rows = rows
        self.description = [(n, None, None, None, None, None, None) for n in names] or None
        self.rowcount = len(rows) if names else -1

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


class NoTransactionDialect(default.DefaultDialect):
    """A SQLAlchemy dialect for an engine that has no transactions: every statement
    stands alone (autocommit), and there is nothing to commit or roll back."""

    supports_statement_cache = True
    supports_native_boolean = True
    default_paramstyle = "qmark"  # declared for SQLAlchemy; no parameter is ever bound

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
