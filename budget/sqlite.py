"""SQLite as a ledger: WAL, a busy timeout, and the BEGIN that dpgate (not pysqlite) emits.

Writes begin with ``BEGIN IMMEDIATE`` (the database write lock, taken before anything is
read, so two charges can never both read the old sum); reads with ``BEGIN DEFERRED``
(WAL readers never block the writer). A write transaction's connection carries the
execution options ``dpgate_write=True`` and ``dpgate_durable``: durable writes (charges,
admin changes) commit with the configured ``synchronous`` level (FULL by default: fsync),
the others (outcomes, the request log) with NORMAL.
"""

from __future__ import annotations

import weakref
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine

from budget.prepared import driver_errors

_hooked_engines: weakref.WeakSet[Engine] = weakref.WeakSet()
# Set in a connection's info while a transaction begun on the driver (not by SQLAlchemy)
# is open: SQLAlchemy's own begin inside it (a statement run through
# ``Connection.execute``) must not BEGIN again.
RAW_TRANSACTION = "dpgate_raw_transaction"

PAGE_CACHE_KIB = 512
"""Each ledger connection's own page cache, in KiB (SQLite's default is 2,000). The
ledger file grows with every release, and a serving worker keeps several connections
(SQLAlchemy's pool for a SQLite file), each caching the pages it has read: at the
default, their caches grew with the ledger to ~2 MB apiece, RSS that a soak counted as
growth (issue 36). Pages beyond it are read again from the operating system's page
cache, which every connection and worker shares; the ledger's statements are index
lookups and appends that touch a few pages each."""


def install_sqlite_hooks(engine: Engine, synchronous: str, busy_timeout_ms: int) -> None:
    """Let dpgate, not pysqlite, emit BEGIN: IMMEDIATE for writes, DEFERRED for reads."""
    if engine in _hooked_engines:
        return
    _hooked_engines.add(engine)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # pysqlite must not BEGIN on its own
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
        cursor.execute("PRAGMA journal_mode = WAL")
        cursor.execute("PRAGMA foreign_keys = ON")
        cursor.execute(f"PRAGMA cache_size = -{PAGE_CACHE_KIB}")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        if conn.info.get(RAW_TRANSACTION):  # begun on the driver already (budget/held.py)
            return
        raw = conn.connection.dbapi_connection
        assert raw is not None
        options = conn.get_execution_options()
        begin(
            conn,
            raw,
            write=options.get("dpgate_write", False),
            durable=options.get("dpgate_durable", True),
            synchronous=synchronous,
        )


def begin(conn: Connection, raw: Any, *, write: bool, durable: bool, synchronous: str) -> None:
    """dpgate's BEGIN, on the driver's connection ``raw`` of ``conn``: these run on every
    ledger transaction, and SQLAlchemy's statement path would cost more than SQLite
    spends on them. Charges and admin changes are fsynced at commit (``synchronous``);
    outcomes and the request log may ride on the next fsync (a crash of the process
    loses nothing either way)."""
    if not write:
        with driver_errors(conn.dialect, "BEGIN DEFERRED"):
            raw.execute("BEGIN DEFERRED")
        return
    level = synchronous if durable else "NORMAL"
    with driver_errors(conn.dialect, "BEGIN IMMEDIATE"):
        if conn.info.get("dpgate_synchronous") != level:
            raw.execute(f"PRAGMA synchronous = {level}")
            conn.info["dpgate_synchronous"] = level
        raw.execute("BEGIN IMMEDIATE")
