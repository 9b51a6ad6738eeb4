"""Per-thread ledger connections (budget/held.py): a thread's transactions reuse one
connection, threads never share one, a nested transaction and a failed one are safe, and
a thread that ends (or the ledger's close) releases its connection; a process that exits
while its threads use the ledger does not crash."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import sqlalchemy as sa

from budget import Ledger
from budget.held import HeldConnections
from budget.sqlite import install_sqlite_hooks


def _held(tmp_path: Path) -> HeldConnections:
    engine = sa.create_engine(f"sqlite:///{tmp_path}/h.db")
    return HeldConnections(engine, lambda e: install_sqlite_hooks(e, "FULL", 5000))


def _driver_connection(held: HeldConnections) -> object:
    with held.connection() as conn:
        return conn.connection.dbapi_connection


def test_a_thread_reuses_its_connection_and_threads_do_not_share(tmp_path: Path) -> None:
    held = _held(tmp_path)
    mine = _driver_connection(held)
    assert _driver_connection(held) is mine
    theirs: list[object] = []
    t = threading.Thread(target=lambda: theirs.append(_driver_connection(held)))
    t.start()
    t.join()
    assert theirs and theirs[0] is not mine
    held.close()


def test_a_nested_use_gets_a_connection_of_its_own(tmp_path: Path) -> None:
    held = _held(tmp_path)
    with held.connection() as outer, held.connection() as inner:
        assert inner is not outer
        assert inner.connection.dbapi_connection is not outer.connection.dbapi_connection
    held.close()


def test_a_driver_error_drops_the_connection_and_the_next_use_opens_one(
    tmp_path: Path,
) -> None:
    held = _held(tmp_path)
    with held.connection() as conn:
        first = conn
    with pytest.raises(sa.exc.DBAPIError), held.connection() as conn:
        conn.exec_driver_sql("SELECT * FROM no_such_table")
    assert first.closed
    with held.connection() as conn:
        assert conn is not first
        assert conn.exec_driver_sql("SELECT 1").scalar() == 1
    # an error of the caller's own (not the database's) keeps the connection
    with held.connection() as conn:
        kept = conn
    with pytest.raises(ValueError), held.connection():
        raise ValueError("the caller's")
    with held.connection() as conn:
        assert conn is kept
    held.close()


def test_a_thread_that_ends_closes_its_connection(tmp_path: Path) -> None:
    held = _held(tmp_path)
    seen: list[sa.Connection] = []

    def use() -> None:
        with held.connection() as conn:
            seen.append(conn)

    t = threading.Thread(target=use)
    t.start()
    t.join()
    del t
    gc.collect()
    assert seen[0].closed
    held.close()


def test_the_ledger_closes_every_held_connection(tmp_path: Path) -> None:
    ledger = Ledger.from_url(f"sqlite:///{tmp_path}/l.db")
    ledger.migrate()
    ledger.create_analyst("a", 1.0, 1e-6)
    opened: list[sa.Connection] = []
    barrier = threading.Barrier(3)

    def read() -> None:
        with ledger._transaction(write=False) as conn:
            opened.append(conn)
        ledger.budget_status("a")
        barrier.wait()  # still alive when the ledger closes
        barrier.wait()

    threads = [threading.Thread(target=read) for _ in range(2)]
    for t in threads:
        t.start()
    barrier.wait()
    ledger.close()
    assert len(opened) == 2 and all(c.closed for c in opened)
    barrier.wait()
    for t in threads:
        t.join()


EXIT_WHILE_READING = textwrap.dedent(
    """
    import sys, threading, time
    from budget import Ledger
    ledger = Ledger.from_url(f"sqlite:///{sys.argv[1]}")
    ledger.migrate()
    ledger.create_analyst("a", 1.0, 1e-6)
    started = threading.Event()
    def read():
        while True:
            ledger.budget_status("a")
            started.set()
    for _ in range(2):
        threading.Thread(target=read, daemon=True).start()
    started.wait()
    time.sleep(0.05)
    """
)


def test_a_process_that_exits_while_threads_read_the_ledger_does_not_crash(
    tmp_path: Path,
) -> None:
    # A notebook or script that never closes its gateway: at exit, the held connections'
    # finalizers used to close each SQLite connection under the thread still reading on
    # it (SIGSEGV in 15 of 20 runs); an unclosed connection is the OS's to release.
    for run in range(5):
        done = subprocess.run(
            [sys.executable, "-c", EXIT_WHILE_READING, str(tmp_path / f"l{run}.db")],
            capture_output=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr.decode()[-2000:]


def _begin(conn: sa.Connection, raw: object) -> None:
    raw.execute("BEGIN IMMEDIATE")  # type: ignore[attr-defined]


def test_a_transaction_is_begun_and_ended_on_the_driver_with_sqlalchemy_inside(
    tmp_path: Path,
) -> None:
    held = _held(tmp_path)
    with held.transaction(_begin) as conn:
        conn.exec_driver_sql("CREATE TABLE t (v INTEGER NOT NULL)")
    # committed: a raw statement and a SQLAlchemy one share the transaction
    with held.transaction(_begin) as conn:
        conn.connection.dbapi_connection.execute("INSERT INTO t VALUES (1)")  # type: ignore[union-attr]
        conn.execute(sa.text("INSERT INTO t VALUES (2)"))
    # rolled back, both kinds, and the connection stays usable
    with pytest.raises(ValueError), held.transaction(_begin) as conn:
        conn.connection.dbapi_connection.execute("INSERT INTO t VALUES (3)")  # type: ignore[union-attr]
        conn.execute(sa.text("INSERT INTO t VALUES (4)"))
        raise ValueError("after writing")
    with held.transaction(_begin) as conn:
        conn.connection.dbapi_connection.execute("INSERT INTO t VALUES (5)")  # type: ignore[union-attr]
        with pytest.raises(ValueError):
            raise ValueError("caught inside")
    with held.connection() as conn:
        assert not conn.connection.dbapi_connection.in_transaction  # type: ignore[union-attr]
        values = [v for (v,) in conn.exec_driver_sql("SELECT v FROM t ORDER BY v")]
    assert values == [1, 2, 5]
    # what another connection sees is what was committed
    other = sa.create_engine(f"sqlite:///{tmp_path}/h.db")
    with other.connect() as conn:
        assert [v for (v,) in conn.exec_driver_sql("SELECT v FROM t ORDER BY v")] == [1, 2, 5]
    other.dispose()
    held.close()


def test_closing_a_ledger_closes_its_write_lock_file(tmp_path: Path) -> None:
    """The cross-process write lock is a file descriptor of the ledger's own: closing the
    ledger closes it (a process that opens many ledgers must not pile them up)."""
    locks = tmp_path / "ledger.db.locks"

    def lock_fds() -> int:
        fds = Path("/proc/self/fd")
        if not fds.exists():
            pytest.skip("counts descriptors through /proc")
        held = 0
        for fd in fds.iterdir():
            try:
                held += str(locks) in os.readlink(fd)
            except OSError:
                continue
        return held

    ledger = Ledger.from_url(f"sqlite:///{tmp_path}/ledger.db")
    ledger.migrate()
    ledger.create_analyst("a", 1.0, 1e-6)  # a write: the lock file is opened
    assert lock_fds() == 1
    ledger.close()
    assert lock_fds() == 0
