"""SQLite ledger writes: one writer per process, group commit, no busy-wait between writers.
(A server ledger uses ``WriteQueue`` only for its un-awaited writes, the request-log rows:
committed together by the lingering thread, each in a savepoint — ``Ledger.write``.)

SQLite has one write lock per database. With many threads and several worker processes
each opening its own write transactions, writers queue on that lock through SQLite's busy
handler, which sleeps in growing steps (1, 2, 5, 10, … ms) and convoys under load. Here:

- **Across processes** a write transaction first takes ``flock`` on ``<ledger>.locks/
  write.lock`` (``WriteLock``): the kernel wakes the next waiter the moment the lock is
  released, so writers never sleep in steps, and SQLite's ``BEGIN IMMEDIATE`` then finds
  the database free. Within a process a thread lock comes first, so at most one thread
  per process waits on the file.
- **Within a process** writes are group-committed (``WriteQueue``): the first writer to
  arrive leads, and runs in one transaction every operation queued until it starts,
  each inside its own savepoint (one operation's error — a refused charge, a duplicate
  outcome — rolls back only that operation), then commits once: one fsync for a whole
  batch of charges. Writers arriving meanwhile wait, and one of them leads the next
  batch. An operation's caller gets its result or its exception only after the commit
  returned, so a charge is durable before ``reserve`` returns, as before.

A batch commits durably (``synchronous=FULL`` by default: fsync) when any operation in it
asked to be durable (charges, admin changes); otherwise with ``synchronous=NORMAL`` (an
outcome, a request-log row or a rate-limit counter: a killed process loses nothing, an
OS crash may lose the last of them, never a charge that an answer was released for).
Operations submitted without waiting (request-log rows; an answer's outcome when the
auditor is off) ride on the next batch any writer leads, or are written ``LINGER_S``
later by the queue's lingering thread: under load they cost no transaction of their own,
and their submitter does not wait for a second turn at the write lock. ``flush()`` waits
for them (readers of the request log and of outcomes call it); a killed process may lose
the last ``LINGER_S`` of them (never a charge).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy.engine import Connection

from budget.prepared import driver_errors

try:  # POSIX only; without it, writers of other processes meet SQLite's busy handler
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

T = TypeVar("T")
log = logging.getLogger("dpgate.ledger")
MAX_BATCH = 256
LINGER_S = 0.05  # the longest an un-awaited write (a request-log row) waits for a batch

Transaction = Callable[[bool], AbstractContextManager[Connection]]


class WriteLock:
    """The ledger's write lock across threads (a mutex) and processes (``flock``)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._mutex = threading.Lock()
        self._fd: int | None = None
        self._pid = os.getpid()

    def _file(self) -> int | None:
        if self.path is None or fcntl is None:
            return None
        if self._fd is None or self._pid != os.getpid():  # new process (fork): own fd
            self.path.parent.mkdir(exist_ok=True)
            self._fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o600)
            self._pid = os.getpid()
        return self._fd

    def close(self) -> None:
        """Close the lock file (a later ``hold`` opens it again)."""
        with self._mutex:
            if self._fd is not None and self._pid == os.getpid():
                os.close(self._fd)
            self._fd = None

    @contextmanager
    def hold(self) -> Iterator[None]:
        with self._mutex:
            fd = self._file()
            if fd is None:
                yield
                return
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)


@dataclass
class _Op:
    fn: Callable[[Connection], Any]
    durable: bool
    savepoint: bool  # False: its writes are each valid alone (see _run_in_batch)
    # Held until the operation is done, or until its waiter is asked to lead the next
    # batch: its waiter blocks on it (None: nobody waits, a submitted write).
    wake: threading.Lock | None = None
    # Called once the operation is done, with its ``ok`` and ``value`` (submitted writes
    # whose submitter wants to know when they are committed).
    on_done: Callable[[bool, Any], None] | None = None
    done: bool = False
    ok: bool = False
    value: Any = None


def _awaited(fn: Callable[[Connection], Any], durable: bool, savepoint: bool = True) -> _Op:
    wake = threading.Lock()
    wake.acquire()
    return _Op(fn, durable, savepoint, wake)


_queues: weakref.WeakSet[WriteQueue] = weakref.WeakSet()


class WriteQueue:
    """Group commit without a thread of its own: the first writer to arrive becomes the
    leader and commits, in one transaction, every operation queued until it starts;
    writers arriving meanwhile wait, and one of them leads the next batch. An
    uncontended write runs in its caller's thread (no hand-off); under load, one commit
    (one fsync) serves a whole batch. ``transaction(durable)`` opens one write
    transaction on the ledger (taking ``WriteLock``).

    Each waiting writer sleeps on a lock of its own, released once its operation is done
    or once it is to lead: a commit wakes exactly the writers it served and the next
    leader, not every thread waiting (under the GIL, each needless wake-up is a context
    switch and a GIL hand-off).
    """

    def __init__(self, transaction: Transaction) -> None:
        self._transaction = transaction
        self._lock = threading.Lock()
        self._pending: list[_Op] = []
        self._leading = False
        # Un-awaited writes are due by this time (None: none waiting for the lingerer);
        # one thread per queue writes them then, woken through this condition.
        self._linger_due: float | None = None
        self._lingering = threading.Condition(self._lock)
        self._lingerer: threading.Thread | None = None
        self._pid = os.getpid()
        _queues.add(self)

    def run(self, fn: Callable[[Connection], T], *, durable: bool, savepoint: bool = True) -> T:
        """Run ``fn(conn)`` in the next batch; its result once the batch has committed
        (its exception if it raised: only its own writes are rolled back). ``savepoint``
        False: ``fn``'s writes are each valid alone (one statement, or a checkpoint and
        then one statement), so a failed statement is undone by SQLite itself and ``fn``
        needs no savepoint of its own — two statements fewer under the write lock."""
        op = _awaited(fn, durable, savepoint)
        self._drive(op)
        if not op.ok:
            raise op.value
        return op.value

    def submit(
        self,
        fn: Callable[[Connection], Any],
        *,
        durable: bool,
        savepoint: bool = True,
        on_done: Callable[[bool, Any], None] | None = None,
    ) -> None:
        """Queue ``fn(conn)`` without waiting: it rides on the next batch any writer leads,
        and is written at the latest ``LINGER_S`` later by the lingering thread.
        ``on_done(ok, value)`` runs once its batch has committed or failed (``value``: the
        exception)."""
        with self._lock:
            self._reset_after_fork()
            self._pending.append(_Op(fn, durable, savepoint, on_done=on_done))
            self._arm_timer()

    def _arm_timer(self) -> None:  # with self._lock held
        if self._linger_due is not None:
            return
        self._linger_due = time.monotonic() + LINGER_S
        if self._lingerer is None:
            # One thread for the queue's life, not a timer thread per arming: starting a
            # thread waits for it to run, which was 3% of a lone client's request.
            self._lingerer = threading.Thread(
                target=_linger, args=(weakref.ref(self), self._lingering), daemon=True
            )
            self._lingerer.start()
        else:
            self._lingering.notify()

    def flush(self) -> None:
        """Wait until everything queued before this call is committed (or failed)."""
        self._drive(_awaited(lambda conn: None, False))

    def close(self) -> None:
        """Write what is queued."""
        with self._lock:
            self._reset_after_fork()
            if not self._pending:
                return
        self.flush()

    def _reset_after_fork(self) -> None:
        if self._pid != os.getpid():  # a forked child inherits no leader and no timer
            self._pending, self._leading, self._pid = [], False, os.getpid()
            self._linger_due, self._lingerer = None, None

    def _drive(self, op: _Op | None) -> None:
        """Queue ``op`` (if any) and wait until it is done, leading batches as needed
        (without ``op``: lead until nothing is queued, unless another writer leads)."""
        with self._lock:
            self._reset_after_fork()
            if op is not None:
                self._pending.append(op)
            if self._leading:
                if op is None:  # the leader takes what is queued (or hands it on)
                    return
                lead = False
            elif not self._pending:
                return
            else:
                self._leading = lead = True
        while True:
            if not lead:
                assert op is not None and op.wake is not None
                op.wake.acquire()  # released when done, or when asked to lead
                if op.done:
                    return
            lead = True  # self._leading stays True on this writer's behalf
            with self._lock:
                batch = self._pending[:MAX_BATCH]
                del self._pending[:MAX_BATCH]
            successor: _Op | None = None
            keep_lead = False
            try:
                self._commit(batch)
            finally:
                for o in batch:  # only if _commit was interrupted (BaseException)
                    if not o.done:
                        o.ok, o.value = False, RuntimeError("write interrupted")
                        _done(o)
                with self._lock:
                    if op is None or not op.done:  # draining, or op beyond a full batch
                        keep_lead = op is not None or bool(self._pending)
                    if not keep_lead:
                        # hand the lead to the first writer waiting, if any
                        successor = next((o for o in self._pending if o.wake is not None), None)
                        if successor is None:
                            self._leading = False
                            if self._pending:  # only un-awaited writes: the timer's
                                self._arm_timer()
                for o in batch:
                    if o.wake is not None and o is not op:
                        o.wake.release()
                if successor is not None and successor.wake is not None:
                    successor.wake.release()
            if not keep_lead:
                return

    def _commit(self, batch: list[_Op]) -> None:
        try:
            with self._transaction(any(op.durable for op in batch)) as conn:
                if len(batch) == 1:  # alone: its error rolls back the whole transaction
                    batch[0].value, batch[0].ok = batch[0].fn(conn), True
                else:
                    for op in batch:
                        _run_in_batch(conn, op)
        except Exception as exc:  # the batch did not commit: nothing of it was written
            for op in batch:
                op.ok, op.value = False, exc
        for op in batch:
            _done(op)


def _done(op: _Op) -> None:
    op.done = True
    if op.on_done is not None:
        try:
            op.on_done(op.ok, op.value)
        except Exception:  # a bookkeeping callback must not fail the batch's other writers
            log.exception("a write's completion callback failed")


def _run_in_batch(conn: Connection, op: _Op) -> None:
    """Run one operation of a batch; its error rolls back only its own writes.

    The savepoint is the driver's own (``SAVEPOINT``/``RELEASE``/``ROLLBACK TO``), not
    SQLAlchemy's ``begin_nested``: a batch runs one per operation, and SQLAlchemy's
    bookkeeping would cost more than the operation. An operation whose writes are each
    valid alone runs without one: SQLite undoes a failed statement and keeps the
    transaction (on SQLite; a server ledger's queue carries only un-awaited writes, each
    with its savepoint, since PostgreSQL aborts a transaction at its first error).
    Should SQLite have rolled the whole transaction back (a full disk, an I/O error),
    the batch fails: nothing of it was written, and nothing after it may run outside a
    transaction.
    """
    raw = conn.connection.dbapi_connection
    assert raw is not None
    cursor = raw.cursor() if op.savepoint else None
    try:
        if cursor is not None:
            with driver_errors(conn.dialect, "SAVEPOINT"):
                cursor.execute("SAVEPOINT dpgate_op")
        try:
            op.value = op.fn(conn)
        except Exception as exc:  # reported to its caller, not here
            # SQLite may have rolled the whole transaction back; a server keeps it (in
            # error until the savepoint is rolled back to, which fails if it is gone).
            if not getattr(raw, "in_transaction", True):
                raise
            if cursor is not None:
                with driver_errors(conn.dialect, "ROLLBACK TO SAVEPOINT"):
                    cursor.execute("ROLLBACK TO SAVEPOINT dpgate_op")
                    cursor.execute("RELEASE SAVEPOINT dpgate_op")
            op.value = exc
        else:
            if cursor is not None:
                with driver_errors(conn.dialect, "RELEASE SAVEPOINT"):
                    cursor.execute("RELEASE SAVEPOINT dpgate_op")
            op.ok = True
    finally:
        if cursor is not None:
            cursor.close()


def _linger(ref: weakref.ref[WriteQueue], lingering: threading.Condition) -> None:
    """The lingerer: writes a queue's un-awaited writes once they are due, and ends soon
    after the queue is gone (it holds the queue only while writing)."""
    while True:
        with lingering:
            queue = ref()
            if queue is None or queue._lingerer is not threading.current_thread():
                return  # the queue is gone, or this is a forked child's copy
            due = queue._linger_due
            wait = 1.0 if due is None else due - time.monotonic()
            if wait > 0:
                del queue
                lingering.wait(wait)
                continue
            queue._linger_due = None
        queue._drive(None)
        del queue


def flush_all() -> None:
    """Write every queued row of every ledger open in this process (readers of the
    request log call it: another Ledger on the same file may hold rows not yet written)."""
    for q in list(_queues):
        q.flush()


@atexit.register
def _flush_all() -> None:  # request-log rows queued just before the process exits
    for q in list(_queues):
        with contextlib.suppress(Exception):  # exiting anyway
            q.close()
