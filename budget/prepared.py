"""The ledger's hot statements, run on the driver's own cursor.

A request's ledger traffic is a handful of small statements (find a release, lock the
analyst, sum the spend, append the charge, append the outcome). Through SQLAlchemy's
``Connection.execute`` each costs ~0.1 ms of Python before the database sees it — more
than the database spends on it. ``Prepared`` compiles a statement once per dialect to its
SQL text, the order or names of its parameters and their bind processors (so values
are stored exactly as SQLAlchemy stores them: a SQLite ``DateTime`` as its ISO text),
then runs it on the DBAPI cursor of the caller's connection, inside the caller's
transaction. Rows come back as named tuples (attribute access, as SQLAlchemy rows).

Only statements whose result columns need no result processing belong here (numbers,
text, booleans read with ``bool()``); a ``DateTime`` column read back goes through
SQLAlchemy.
"""

from __future__ import annotations

import threading
from collections import namedtuple
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Dialect


@dataclass(frozen=True)
class _Compiled:
    sql: str
    names: tuple[str, ...]  # positional parameter order ('' for a named paramstyle)
    named: bool
    defaults: Mapping[str, Any]  # the values of literals SQLAlchemy bound itself
    processors: Mapping[str, Callable[[Any], Any]]


@contextmanager
def driver_errors(dialect: Dialect, sql: str) -> Iterator[None]:
    """Raise the driver's errors as SQLAlchemy's (``sa.exc.IntegrityError``,
    ``OperationalError``…), as ``Connection.execute`` would: the ledger's callers map
    those, whichever path ran the statement."""
    base = dialect.loaded_dbapi.Error
    try:
        yield
    except base as exc:
        raise sa.exc.DBAPIError.instance(sql, None, exc, base, dialect=dialect) from exc


class Prepared:
    """One statement, compiled once per dialect, executed on the raw DBAPI cursor."""

    def __init__(self, statement: sa.ClauseElement) -> None:
        self.statement = statement
        self._by_dialect: dict[str, _Compiled] = {}
        self._row_types: dict[tuple[str, ...], Any] = {}
        self._lock = threading.Lock()

    def _compiled(self, dialect: Dialect) -> _Compiled:
        key = f"{dialect.name}:{dialect.paramstyle}"
        found = self._by_dialect.get(key)
        if found is not None:
            return found
        c = self.statement.compile(dialect=dialect)
        if "POSTCOMPILE" in str(c):
            raise ValueError("a Prepared statement cannot hold an expanding IN (...)")
        processors = getattr(c, "_bind_processors", {}) or {}
        named = dialect.paramstyle in ("named", "pyformat")
        positions = tuple(getattr(c, "positiontup", None) or ()) if not named else ()
        compiled = _Compiled(
            sql=str(c),
            names=positions,
            named=named,
            defaults=dict(c.params),
            processors=dict(processors),
        )
        with self._lock:
            self._by_dialect[key] = compiled
        return compiled

    def _bind(self, c: _Compiled, params: Mapping[str, Any]) -> Sequence[Any] | dict[str, Any]:
        values = {**c.defaults, **params}
        for name, process in c.processors.items():
            if name in values and values[name] is not None:
                values[name] = process(values[name])
        if c.named:
            return values
        return tuple(values[n] for n in c.names)

    def _cursor(self, conn: Connection, params: Mapping[str, Any]) -> tuple[Any, str]:
        """A cursor that executed the statement, and the SQL it ran (for errors)."""
        c = self._compiled(conn.dialect)
        bound = self._bind(c, params)
        cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        with driver_errors(conn.dialect, c.sql):
            cursor.execute(c.sql, bound)
        return cursor, c.sql

    def rows(self, conn: Connection, params: Mapping[str, Any] | None = None) -> list[Any]:
        """Every row, as named tuples."""
        cursor, sql = self._cursor(conn, params or {})
        try:
            with driver_errors(conn.dialect, sql):
                raw = cursor.fetchall()
            names = tuple(d[0] for d in cursor.description)
        finally:
            cursor.close()
        row_type: Any = self._row_types.get(names)
        if row_type is None:
            row_type = namedtuple("Row", names, rename=True)  # type: ignore[misc,no-redef]
            self._row_types[names] = row_type
        return [row_type(*r) for r in raw]

    def first(self, conn: Connection, params: Mapping[str, Any] | None = None) -> Any:
        """The first row, or ``None``."""
        rows = self.rows(conn, params)
        return rows[0] if rows else None

    def scalar(self, conn: Connection, params: Mapping[str, Any] | None = None) -> Any:
        """The first column of the first row, or ``None``."""
        row = self.first(conn, params)
        return None if row is None else row[0]

    def run(self, conn: Connection, params: Mapping[str, Any] | None = None) -> int:
        """Execute (an INSERT, UPDATE or DELETE); the number of rows it changed."""
        cursor, _ = self._cursor(conn, params or {})
        try:
            return int(cursor.rowcount)
        finally:
            cursor.close()
