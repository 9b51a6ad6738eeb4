"""Per-scope audit locks shared by every process and host that shares a ledger.

The auditor's decision about a query depends on every answer released before it in the
same audit scope (an analyst, or everyone). Two halves of a differencing pair audited at
the same moment by two workers would each see only the other's absence, and both be
answered. So a gateway holds its scope's lock from the moment it re-reads the scope's
released answers until its own answer is recorded: one query per scope at a time,
whatever the number of workers. Different scopes never wait for each other.

- **PostgreSQL**: a transaction-scoped advisory lock, ``pg_advisory_xact_lock(namespace,
  hash(scope))``, on a connection held for the duration (released at commit, or when the
  connection dies with its process). Two scopes hashing alike merely share a lock.
- **SQLite** (one host): ``flock`` on a per-scope file in ``<ledger file>.locks/``, which
  excludes other processes and other threads alike, and is released when its process
  dies. An in-memory ledger is private to its process: a thread lock is enough.

Each process first takes an in-process lock per scope, so that at most one of its threads
waits on the database (or the file) for a scope, holding at most one connection.

**Turns.** ``hold`` yields the scope's *turn*: a number every holder advances by one the
moment it takes the lock (in the lock file's first 8 bytes on SQLite; in memory for an
in-memory ledger), so a holder whose turn is its previous turn + 1 knows that nobody took
the lock in between — nobody else can have recorded anything under it (the auditor then
skips re-reading the scope's history: ``gateway.pipeline.audit_policy``). It is advanced on
taking, not on leaving, so a holder that died with the lock still counts; a new lock file
starts a new random epoch, so its turns never follow an old file's. ``None``: not
known (PostgreSQL, or a file ledger without ``flock``) — the caller must assume others held it.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from budget.errors import LedgerUnavailable

_NAMESPACE = 0x64706175  # "dpau": the first key of every audit lock (two-key form)

try:  # POSIX only; without it, a file ledger serialises within one process
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]


class ScopeLocks:
    """``hold(scope)``: the audit lock of one scope on this ledger's database."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._mutex = threading.Lock()
        self._local: dict[str, threading.Lock] = {}
        self._turns: dict[str, int] = {}  # an in-memory ledger's turns (one process)
        self._dir: Path | None = None
        self._paths: dict[str, str] = {}  # each scope's lock file (``_path``)
        # an in-memory SQLite ledger: no other process can hold its locks
        self._private = engine.dialect.name == "sqlite" and (engine.url.database or "") in (
            "",
            ":memory:",
        )
        if engine.dialect.name == "sqlite":
            database = engine.url.database or ""
            if database and database != ":memory:" and not database.startswith("file:"):
                self._dir = Path(database + ".locks")

    def _thread_lock(self, scope: str) -> threading.Lock:
        with self._mutex:
            lock = self._local.get(scope)
            if lock is None:
                lock = self._local[scope] = threading.Lock()
            return lock

    @contextmanager
    def hold(self, scope: str) -> Iterator[int | None]:
        """Hold ``scope``'s lock; yields this holder's turn (see the module; None: unknown)."""
        with self._thread_lock(scope):
            if self.engine.dialect.name == "postgresql":
                with self._advisory(scope):
                    yield None
            elif self._dir is not None and fcntl is not None:
                with self._file(scope) as turn:
                    yield turn
            elif self._private:  # in memory: private to this process, and to this object
                turn = self._turns[scope] = self._turns.get(scope, 0) + 1
                yield turn
            else:
                yield None

    @contextmanager
    def _advisory(self, scope: str) -> Iterator[None]:
        key = int.from_bytes(hashlib.sha256(scope.encode()).digest()[:4], "big", signed=True)
        try:
            conn = self.engine.connect()
            transaction = conn.begin()
            conn.execute(sa.select(sa.func.pg_advisory_xact_lock(_NAMESPACE, key)))
        except (sa.exc.OperationalError, sa.exc.InterfaceError, sa.exc.TimeoutError) as exc:
            raise LedgerUnavailable(f"the ledger database failed: {type(exc).__name__}") from exc
        try:
            yield
        finally:
            try:
                transaction.rollback()  # ends the transaction: the lock is released
                conn.close()
            except sa.exc.SQLAlchemyError:
                # the connection died (and the lock with it): nothing left to release
                conn.invalidate()

    def _path(self, scope: str) -> str:
        """The lock file of ``scope`` (its name hashed once per scope and process)."""
        path = self._paths.get(scope)
        if path is None:
            assert self._dir is not None
            name = hashlib.sha256(scope.encode()).hexdigest()[:32] + ".lock"
            path = self._paths[scope] = os.path.join(self._dir, name)
        return path

    @contextmanager
    def _file(self, scope: str) -> Iterator[int]:
        assert self._dir is not None
        path = self._path(scope)
        try:
            fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
        except FileNotFoundError:  # no lock directory (yet, or any more): made first
            self._dir.mkdir(exist_ok=True)
            fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                yield _advance_turn(fd)
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)


def _advance_turn(fd: int) -> int:
    """The lock file's turn plus one, written back (under the lock: no other writer).
    No fsync: the number only has to be seen by the processes of this host, through the
    page cache; after a reboot every process starts afresh and re-reads everything.

    The file's *epoch*, a random number its first holder writes beside the turn, is in
    the high bits: a lock file removed and made again counts afresh, and its turns never
    follow one of the old file's. (It was the file's inode number, which the file system
    hands out again: a worker whose last turn on the old file was t could take t + 1 on
    the new one after another worker's turns there, and skip re-reading what that worker
    recorded.)"""
    raw = os.pread(fd, 16, 0)
    turn = struct.unpack("<Q", raw[:8])[0] if len(raw) >= 8 else 0
    epoch = struct.unpack("<Q", raw[8:16])[0] if len(raw) == 16 else 0
    if epoch == 0:  # a new file (or one written before epochs): its epoch starts now
        epoch = secrets.randbits(63) + 1
    turn += 1
    os.pwrite(fd, struct.pack("<QQ", turn, epoch), 0)
    return (epoch << 64) | turn
