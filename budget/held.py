"""One ledger connection per thread, kept between transactions (SQLite file ledgers).

A request runs three short ledger transactions (the read that identifies the caller, the
reserve, the outcome). Checking a connection out of SQLAlchemy's pool and back in costs
more Python than SQLite spends on such a transaction: measured on the PUMS requests,
``Engine.connect`` and ``Connection.close`` were 11.6% of a request's time in the WSGI
app. Here each thread keeps the connection it opened, and its transactions begin and end
on the driver (``transaction``); inside one, statements run as before (the driver's
cursor, or ``Connection.execute``), and nothing is shared between threads.

A connection is dropped (closed, and opened afresh next time) when the driver failed on
it or it was left inside a transaction, and closed when its thread ends; a nested use in
the same thread gets a pooled connection of its own as before, and a forked child opens
its own. ``close()`` closes every held connection (``Ledger.close``).
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.pool import NullPool

from budget.prepared import driver_errors
from budget.sqlite import RAW_TRANSACTION


class HeldConnections:
    """Per-thread connections to the database of ``engine``, kept open between
    transactions. They come from an engine of their own without a pool (``engine``'s
    pool stays for nested uses): a thread's connection is closed when the thread ends,
    or by ``close()``. ``hook`` prepares that engine as ``engine`` was (dpgate's BEGIN)."""

    def __init__(self, engine: Engine, hook: Callable[[Engine], None]) -> None:
        self._engine = engine
        self._own = sa.create_engine(
            engine.url, poolclass=NullPool, connect_args={"check_same_thread": False}
        )
        hook(self._own)
        self._lock = threading.Lock()
        self._local = threading.local()
        self._closers: list[weakref.finalize] = []
        self._pid = os.getpid()

    @contextmanager
    def connection(self) -> Iterator[Connection]:
        if self._pid != os.getpid():  # a forked child: the parent's connections stay theirs
            with self._lock:
                self._local, self._closers, self._pid = threading.local(), [], os.getpid()
        local = self._local
        held: _Held | None = getattr(local, "held", None)
        if held is not None and held.busy:  # nested: a connection of its own, from the pool
            with self._engine.connect() as conn:
                yield conn
            return
        if held is None or held.conn.closed or held.conn.invalidated:
            held = local.held = self._open()
        held.busy = True
        try:
            yield held.conn
            if held.conn.in_transaction():  # as the pool's reset on return would
                held.conn.rollback()
        except BaseException as exc:
            conn = held.conn
            if isinstance(exc, sa.exc.DBAPIError) or conn.invalidated or conn.in_transaction():
                local.held = None
                _close(conn)
            raise
        finally:
            held.busy = False

    @contextmanager
    def transaction(self, begin: Callable[[Connection, Any], None]) -> Iterator[Connection]:
        """A transaction on this thread's connection, begun by ``begin(conn, driver
        connection)`` and committed or rolled back on the driver: SQLAlchemy's begin and
        commit cost several times what SQLite spends on a short transaction (measured:
        108–148 µs against 21–31 µs for a one-statement read). A statement run through
        ``Connection.execute`` inside joins it (``budget.sqlite.RAW_TRANSACTION``), and
        then SQLAlchemy's commit or rollback is the driver's."""
        with self.connection() as conn:
            raw: Any = conn.connection.dbapi_connection
            begin(conn, raw)
            conn.info[RAW_TRANSACTION] = True
            try:
                yield conn
            except BaseException:
                if conn.in_transaction():
                    conn.rollback()
                elif raw.in_transaction:  # SQLite may have rolled back already (full disk)
                    with driver_errors(conn.dialect, "ROLLBACK"):
                        raw.rollback()
                raise
            else:
                if conn.in_transaction():
                    conn.commit()
                else:
                    with driver_errors(conn.dialect, "COMMIT"):
                        raw.commit()
            finally:
                conn.info.pop(RAW_TRANSACTION, None)

    def _open(self) -> _Held:
        held = _Held(self._own.connect())
        # When the thread ends, its thread-local holder goes, and the connection with it.
        closer = weakref.finalize(held, _close, held.conn)
        # Not at interpreter exit: another thread (the write queue's lingering one) may be
        # inside a transaction on it then, and closing a SQLite connection under a thread
        # that is using it crashes the process (seen: SIGSEGV in ``begin``). Whatever it
        # was writing is rolled back by SQLite when the process ends; nothing committed
        # is lost.
        closer.atexit = False
        with self._lock:
            self._closers = [c for c in self._closers if c.alive]
            self._closers.append(closer)
        return held

    def close(self) -> None:
        """Close every held connection (a thread opens a new one if used again)."""
        with self._lock:
            closers, self._closers = self._closers, []
            self._local = threading.local()
        for closer in closers:
            closer()
        self._own.dispose()


class _Held:
    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.busy = False


def _close(conn: Connection) -> None:
    try:
        conn.close()
    except Exception:  # already broken: nothing more to release
        conn.invalidate()
