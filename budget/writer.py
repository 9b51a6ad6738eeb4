"""SQLite ledger writes: one writer per process, group commit, no busy-wait between writers.

SQLite has one write lock per database. With many threads and several worker processes
each opening its own write transactions, writers queue on that lock through SQLite's busy
handler, which sleeps in growing steps (1, 2, 5, 10, … ms) and convoys under load. Here:

- **Across processes** a write transaction first takes ``flock`` on ``<ledger>.locks/
  write.lock`` (``WriteLock``): the kernel wakes the next waiter the moment the lock is
  released, so writers never sleep in steps, and SQLite's ``BEGIN IMMEDIATE`` then finds
  the database free. Within a process a thread lock comes first, so at most one thread
  per process waits on the file.
- **Within a process** write operations go to one writer thread (``WriteQueue``). It takes
  every operation queued while the previous batch committed and runs them in one
  transaction, each inside its own savepoint (one operation's error — a refused charge, a
  duplicate outcome — rolls back only that operation), then commits once: one fsync for
  a whole batch of charges (group commit). An operation's caller gets its result or its
  exception only after the commit returned, so a charge is durable before ``reserve``
  returns, as before.

A batch commits durably (``synchronous=FULL`` by default: fsync) when any operation in it
asked to be durable (charges, admin changes); otherwise with ``synchronous=NORMAL`` (an
outcome, a request-log row or a rate-limit counter: a killed process loses nothing, an
OS crash may lose the last of them, never a charge that an answer was released for).
Operations submitted with ``wait=False`` (request-log rows) are written in the next batch,
after the response; ``flush()`` waits for them (readers of the request log call it).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import queue
import threading
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy.engine import Connection

try:  # POSIX only; without it, writers of other processes meet SQLite's busy handler
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

T = TypeVar("T")
MAX_BATCH = 256

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
    future: Future[Any] = field(default_factory=Future)


_STOP = object()
_queues: weakref.WeakSet[WriteQueue] = weakref.WeakSet()


class WriteQueue:
    """One writer thread per process that runs queued operations in group-committed
    batches (see the module docstring). ``transaction(durable)`` opens one write
    transaction on the ledger (taking ``WriteLock``)."""

    def __init__(self, transaction: Transaction) -> None:
        self._transaction = transaction
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        self._closed = False
        _queues.add(self)

    def run(self, fn: Callable[[Connection], T], *, durable: bool) -> T:
        """Run ``fn(conn)`` in the next batch; its result once the batch has committed."""
        future: Future[T] = self.submit(fn, durable=durable)
        return future.result()

    def submit(self, fn: Callable[[Connection], T], *, durable: bool) -> Future[T]:
        """Queue ``fn(conn)`` for the next batch without waiting for it."""
        op = _Op(fn, durable)
        self._ensure_thread()
        self._queue.put(op)
        return op.future

    def flush(self) -> None:
        """Wait until everything queued before this call is committed (or failed)."""
        if self._thread is None or self._pid != os.getpid():
            return
        self.submit(lambda conn: None, durable=False).result()

    def close(self) -> None:
        """Write what is queued, then stop the writer thread."""
        with self._lock:
            thread, self._closed = self._thread, True
            if thread is None or self._pid != os.getpid():
                return
            self._queue.put(_STOP)
        thread.join()

    def _ensure_thread(self) -> None:
        if self._thread is not None and self._pid == os.getpid():
            return
        with self._lock:
            if self._pid != os.getpid():
                # A forked child inherits the queue but not the thread: start afresh.
                self._queue = queue.SimpleQueue()
                self._thread = None
                self._pid = os.getpid()
            if self._thread is None:
                if self._closed:
                    raise RuntimeError("the ledger is closed")
                self._thread = threading.Thread(
                    target=self._loop, name="dpgate-ledger-writer", daemon=True
                )
                self._thread.start()

    def _loop(self) -> None:
        while True:
            first = self._queue.get()
            if first is _STOP:
                return
            batch: list[_Op] = [first]
            stop = False
            while len(batch) < MAX_BATCH:
                try:
                    op = self._queue.get_nowait()
                except queue.Empty:
                    break
                if op is _STOP:
                    stop = True
                    break
                batch.append(op)
            self._commit(batch)
            if stop:
                return

    def _commit(self, batch: list[_Op]) -> None:
        results: list[tuple[_Op, bool, Any]] = []
        try:
            with self._transaction(any(op.durable for op in batch)) as conn:
                for op in batch:
                    savepoint = conn.begin_nested()
                    try:
                        value = op.fn(conn)
                    except BaseException as exc:  # reported to its caller, not here
                        savepoint.rollback()
                        results.append((op, False, exc))
                    else:
                        savepoint.commit()
                        results.append((op, True, value))
        except BaseException as exc:  # the batch did not commit: nothing of it was written
            for op in batch:
                if not op.future.done():
                    op.future.set_exception(exc)
            return
        for op, ok, value in results:
            if ok:
                op.future.set_result(value)
            else:
                op.future.set_exception(value)


@atexit.register
def _flush_all() -> None:  # request-log rows queued just before the process exits
    for q in list(_queues):
        with contextlib.suppress(Exception):  # exiting anyway
            q.close()
