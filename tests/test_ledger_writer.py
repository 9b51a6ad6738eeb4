"""Group commit on a SQLite ledger (budget/writer.py): writers queued while a batch
commits share the next transaction, one operation's failure rolls back only its own
writes, and charges stay exact and durable under concurrent reserves."""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Connection

from budget import BudgetExhausted, Ledger
from budget.sqlite import install_sqlite_hooks
from budget.writer import WriteLock, WriteQueue
from mechanisms.types import PrivacyCost


class Counted:
    """A write-transaction factory on a real SQLite file that counts its transactions."""

    def __init__(self, path: Path) -> None:
        self.engine = sa.create_engine(f"sqlite:///{path}")
        install_sqlite_hooks(self.engine, "FULL", 5000)  # BEGIN IMMEDIATE, as the ledger
        with self.engine.begin() as conn:
            conn.exec_driver_sql("CREATE TABLE t (v INTEGER NOT NULL)")
        self.lock = WriteLock(path.with_suffix(".lock"))
        self.transactions = 0

    @contextmanager
    def transaction(self, durable: bool) -> Iterator[Connection]:
        with self.lock.hold(), self.engine.connect() as conn:
            conn.execution_options(dpgate_write=True, dpgate_durable=durable)
            with conn.begin():
                self.transactions += 1
                yield conn

    def values(self) -> list[int]:
        with self.engine.connect() as conn:
            return sorted(v for (v,) in conn.exec_driver_sql("SELECT v FROM t"))


def _insert(v: int, fail: bool = False):  # type: ignore[no-untyped-def]
    def op(conn: Connection) -> int:
        conn.exec_driver_sql(f"INSERT INTO t (v) VALUES ({v})")
        if fail:
            raise ValueError(f"op {v} fails after writing")
        return v

    return op


def test_writers_queued_during_a_commit_share_the_next_one(tmp_path: Path) -> None:
    db = Counted(tmp_path / "w.db")
    queue = WriteQueue(db.transaction)
    inside, release = threading.Event(), threading.Event()

    def slow(conn: Connection) -> int:
        conn.exec_driver_sql("INSERT INTO t (v) VALUES (0)")
        inside.set()
        assert release.wait(10)
        return 0

    results: dict[int, object] = {}

    def write(v: int) -> None:
        try:
            results[v] = queue.run(_insert(v, fail=v == 3), durable=True)
        except ValueError as e:
            results[v] = e

    leader = threading.Thread(target=lambda: results.__setitem__(0, queue.run(slow, durable=True)))
    leader.start()
    assert inside.wait(10)
    followers = [threading.Thread(target=write, args=(v,)) for v in range(1, 6)]
    for t in followers:
        t.start()
    deadline = time.monotonic() + 10
    while len(queue._pending) < 5 and time.monotonic() < deadline:  # all five queued
        time.sleep(0.005)
    release.set()
    for t in [leader, *followers]:
        t.join(10)
    assert db.transactions == 2  # the leader's, then one for the five queued behind it
    assert isinstance(results[3], ValueError)  # its caller gets its own error…
    assert [results[v] for v in (0, 1, 2, 4, 5)] == [0, 1, 2, 4, 5]
    assert db.values() == [0, 1, 2, 4, 5]  # …and only its own write is rolled back


def _one_batch(queue: WriteQueue, ops: list[tuple[object, bool]]) -> list[object]:
    """Run ``ops`` (fn, savepoint) queued behind a leader, so they commit as one batch;
    each one's result or exception, in order."""
    inside, release = threading.Event(), threading.Event()

    def hold(conn: Connection) -> None:
        inside.set()
        assert release.wait(10)

    results: list[object] = [None] * len(ops)

    def write(i: int) -> None:
        fn, savepoint = ops[i]
        try:
            results[i] = queue.run(fn, durable=True, savepoint=savepoint)  # type: ignore[arg-type]
        except Exception as e:
            results[i] = e

    leader = threading.Thread(target=lambda: queue.run(hold, durable=True))
    leader.start()
    assert inside.wait(10)
    followers = []
    for i in range(len(ops)):  # queued in order
        t = threading.Thread(target=write, args=(i,))
        t.start()
        followers.append(t)
        deadline = time.monotonic() + 10
        while len(queue._pending) < i + 1 and time.monotonic() < deadline:
            time.sleep(0.002)
    release.set()
    for t in [leader, *followers]:
        t.join(10)
    return results


def test_a_write_without_savepoint_loses_only_its_failed_statement(tmp_path: Path) -> None:
    db = Counted(tmp_path / "w.db")
    queue = WriteQueue(db.transaction)

    def null(conn: Connection) -> None:
        conn.exec_driver_sql("INSERT INTO t (v) VALUES (NULL)")  # NOT NULL: fails

    results = _one_batch(queue, [(_insert(1), False), (null, False), (_insert(2), False)])
    assert results[0] == 1 and results[2] == 2
    assert isinstance(results[1], sa.exc.IntegrityError)
    assert db.transactions == 2
    assert db.values() == [1, 2]


def test_a_transaction_sqlite_rolled_back_fails_the_whole_batch(tmp_path: Path) -> None:
    """When SQLite rolls a whole transaction back (a full disk, an I/O error), the
    writes before it are gone: none of the batch may be reported written, and nothing
    after it may run outside the transaction."""
    db = Counted(tmp_path / "w.db")
    queue = WriteQueue(db.transaction)

    def rolled_back(conn: Connection) -> None:
        raw = conn.connection.dbapi_connection
        assert raw is not None
        raw.execute("ROLLBACK")  # what SQLite does on SQLITE_FULL or SQLITE_IOERR
        raise sa.exc.OperationalError("INSERT", {}, Exception("database or disk is full"))

    for savepoint in (False, True):
        results = _one_batch(
            queue, [(_insert(1), savepoint), (rolled_back, savepoint), (_insert(2), savepoint)]
        )
        assert all(isinstance(r, Exception) for r in results), results
        assert db.values() == []


def test_a_lone_failing_write_leaves_nothing(tmp_path: Path) -> None:
    db = Counted(tmp_path / "w.db")
    queue = WriteQueue(db.transaction)
    with pytest.raises(ValueError):
        queue.run(_insert(7, fail=True), durable=True)
    assert queue.run(_insert(8), durable=False) == 8
    assert db.values() == [8]


def test_concurrent_reserves_are_exact_under_group_commit(tmp_path: Path) -> None:
    """32 threads charge one analyst whose budget admits exactly 40 of 64 charges (pure
    composition, ε = 0.25 each, budget 10): exactly 40 succeed, every refusal is
    BudgetExhausted, and the ledger's sum — recomputed without checkpoints, and by a
    new Ledger on the same file — is exactly what was admitted."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    ledger = Ledger.from_url(url, composition="pure")
    ledger.migrate()
    ledger.create_analyst("alice", 10.0, 0.0)
    cost = PrivacyCost(0.25, 0.0, 0.25**2 / 2)
    admitted, refused, errors = [], [], []
    start = threading.Barrier(32)

    def charge(i: int) -> None:
        start.wait()
        for j in range(2):
            try:
                r = ledger.reserve(
                    "alice",
                    cost,
                    query_key=f"k{i}-{j}",
                    sql="SELECT COUNT(*) FROM t",
                    mechanism="laplace",
                    data_version="v",
                )
                ledger.commit(r, {"rows": []}, "answered")
                admitted.append(r.id)
            except BudgetExhausted:
                refused.append(i)
            except Exception as e:  # pragma: no cover - reported below
                errors.append(e)

    threads = [threading.Thread(target=charge, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert len(admitted) == 40 and len(refused) == 24
    spent, n = ledger.recompute_spent("alice")
    assert n == 40 and spent.epsilon == pytest.approx(10.0)
    ledger.close()
    again = Ledger.from_url(url, composition="pure")
    assert again.budget_status("alice").epsilon_spent == pytest.approx(10.0)
    again.close()


def test_an_unawaited_write_rides_on_the_next_batch_or_the_linger_timer(tmp_path: Path) -> None:
    db = Counted(tmp_path / "w.db")
    queue = WriteQueue(db.transaction)
    queue.submit(_insert(1), durable=False)
    assert queue.run(_insert(2), durable=True) == 2
    assert db.transactions == 1  # the log row rode on the charge's transaction
    queue.submit(_insert(3), durable=False)
    deadline = time.monotonic() + 5
    while db.values() != [1, 2, 3] and time.monotonic() < deadline:
        time.sleep(0.01)  # nobody writes: the linger timer does, without a flush
    assert db.values() == [1, 2, 3] and db.transactions == 2


def test_one_lingering_thread_serves_a_queue_and_ends_after_it(tmp_path: Path) -> None:
    db = Counted(tmp_path / "w.db")
    queue = WriteQueue(db.transaction)
    lingerers = set()
    for v in range(3):
        queue.submit(_insert(v), durable=False)
        lingerers.add(queue._lingerer)
        deadline = time.monotonic() + 5
        while len(db.values()) <= v and time.monotonic() < deadline:
            time.sleep(0.01)
    assert db.values() == [0, 1, 2] and db.transactions == 3  # each written when due
    assert len(lingerers) == 1  # one thread, not one per arming
    lingerer = lingerers.pop()
    assert lingerer is not None and lingerer.is_alive()
    del queue
    gc.collect()
    lingerer.join(timeout=5)  # it notices the queue is gone within a second
    assert not lingerer.is_alive()


def test_a_long_drain_leads_batch_after_batch_without_recursion(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Draining leads one batch after another in a loop: with more consecutive batches
    than Python's recursion limit, every queued write is still committed (a recursive
    drain raised RecursionError in the timer thread under sustained load)."""
    import sys

    import budget.writer as writer

    monkeypatch.setattr(writer, "MAX_BATCH", 2)
    db = Counted(tmp_path / "w.db")
    queue = WriteQueue(db.transaction)
    n = 2 * (sys.getrecursionlimit() + 200)
    for v in range(n):
        queue.submit(_insert(v), durable=False)
    queue.flush()
    assert db.values() == list(range(n))
    assert db.transactions >= n // 2
