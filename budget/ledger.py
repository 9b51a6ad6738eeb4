"""The durable ledger: analysts, budgets, charges, outcomes and the request audit log.

Crash safety: ``reserve`` commits the charge before it returns, so an answer can only be
sent after its cost is durable; a crash between reserve and commit leaves the charge in
place (spent, outcome ``pending``), which errs on the side of privacy.

Concurrency: every charge runs in one transaction that first takes the write lock that
serializes charges of that analyst (and, with a global budget, of everyone), then sums
the ledger, asks the accountant, and appends. SQLite: ``BEGIN IMMEDIATE`` (the database
write lock, WAL journal, busy timeout); PostgreSQL: ``SELECT … FOR UPDATE`` on the
analyst row, then on the single global row. Lock order is always analyst → global, so
charges cannot deadlock. Budgets hold across processes and hosts sharing the database.
Refunds take the analyst's lock too, so every cost-bearing row of an analyst is appended
under it: that makes the per-analyst checkpoints (partial sums) exact. The global
budget's checkpoints need every analyst's rows settled below them: SQLite's write lock
gives that; on PostgreSQL every charge and refund row is appended holding an advisory
lock shared, which a checkpointing charge must obtain exclusively (``_spent_global``).

Layout: ``Ledger`` is composed of ``LedgerCore`` (here: the connection, transactions and
what was spent) and one mixin per group of its methods: ``principals`` (analysts, admins,
groups, grants, budgets), ``charging`` (reserve, quote, commit, refund), ``journal``
(refusals, history, releases, the request audit log). Below them: ``statements`` (the
hot-path SQL, built once), ``sqlite`` (WAL and BEGIN IMMEDIATE), ``reads`` (history,
releases, audit log), ``schema`` (tables, migrations).
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.pool import StaticPool

from budget import schema
from budget import statements as st
from budget.accountants import (
    DEFAULT_SELECTION_SHARE,
    Accountant,
    Accounting,
    CompositionName,
    Spent,
    accountant,
)
from budget.charging import Charging
from budget.errors import (
    LedgerUnavailable,
    UnknownAnalyst,
)
from budget.held import HeldConnections
from budget.journal import Journal
from budget.locks import ScopeLocks
from budget.periods import ALL_TIME, Period, check_period, period_end, period_start
from budget.pool import ping_when_idle
from budget.principals import Principals, _check_budget, _period_of
from budget.records import (
    BudgetStatus,
)
from budget.sqlite import begin as sqlite_begin
from budget.sqlite import install_sqlite_hooks
from budget.writer import WriteLock, WriteQueue
from mechanisms.types import PrivacyCost

_UNAVAILABLE = (sa.exc.OperationalError, sa.exc.InterfaceError, sa.exc.TimeoutError)


T = TypeVar("T")

# Rows summed past the latest checkpoint before a charge writes a new one.
CHECKPOINT_EVERY = 256
# A server ledger's connection pool per process: a serving worker runs 16 request
# threads, each holding a connection for one short transaction at a time, besides the
# lingering writer and the auditor's scope locks. SQLAlchemy's default (5 kept, 10 more
# opened and closed on demand) made a worker under load open a new PostgreSQL connection
# for most transactions beyond the fifth (py-spy: 4.7% of its time in connect).
SERVER_POOL_SIZE = 24
SERVER_POOL_OVERFLOW = 8  # opened beyond those for a burst, closed at check-in
# A SQLite ledger whose disk has less room than this is not ready (``probe_write``): a
# charge grows the file by a few pages, the request log by more.
LEDGER_MIN_FREE_BYTES = 256 * 1024


class LedgerCore:
    """The ledger's connection and transactions, and what was spent: the sums,
    checkpoints and budget statuses every group of ``Ledger``'s methods reads."""

    def __init__(
        self,
        engine: Engine,
        *,
        composition: CompositionName = "combined",
        global_budget: tuple[float, float] | None = None,
        global_period: Period = "none",
        selection_share: float = DEFAULT_SELECTION_SHARE,
        sqlite_synchronous: Literal["FULL", "NORMAL"] = "FULL",
        busy_timeout_ms: int = 30_000,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self.engine = engine
        self.accountant: Accountant = accountant(composition, selection_share)
        self.composition: CompositionName = composition
        if global_budget is not None:
            _check_budget(*global_budget)
        self.global_budget = global_budget
        self.global_period: Period = check_period(global_period)
        self._now: Callable[[], datetime] = clock or schema.utcnow
        self._sqlite = engine.dialect.name == "sqlite"
        self._sqlite_file: Path | None = None  # a SQLite ledger's file on disk
        self._write_lock: WriteLock | None = None
        self._writes: WriteQueue | None = None
        # A server ledger's un-awaited writes (request-log rows), committed together
        # (see ``write``); a SQLite file's ride in ``_writes``.
        self._deferred: WriteQueue | None = None
        # A server ledger's request-log rows: their own transactions, which take only the
        # audit chain's lock (budget/audit_chain.py: lock order).
        self._audit_rows: WriteQueue | None = None
        self._held: HeldConnections | None = None
        self._synchronous = sqlite_synchronous
        # Query keys whose answered outcome this process has queued, not yet committed
        # (``commit(wait=False)``): a read that looks for one waits for the queue first.
        self._unsettled: Counter[str] = Counter()
        self._unsettled_lock = threading.Lock()
        # Queued outcome rows whose batch failed (the ledger was away): written again by
        # ``record_unrecorded`` once it is back, oldest first.
        self._unrecorded: deque[Callable[[Connection], None]] = deque()
        # Charges whose write failed, perhaps after the server committed it (``reserve``):
        # refunded by ``record_unrecorded`` if they are there.
        self._in_doubt: deque[str] = deque()
        # Rows after the latest global checkpoint when this process last summed them
        # (a hint: when to try for a new one on PostgreSQL; ``_spent_global``).
        self._global_rows_seen = CHECKPOINT_EVERY

        def write_transaction(durable: bool) -> AbstractContextManager[Connection]:
            return self._transaction(write=True, durable=durable)

        if self._sqlite:
            install_sqlite_hooks(engine, sqlite_synchronous, busy_timeout_ms)
            database = engine.url.database or ""
            on_disk = database not in ("", ":memory:") and not database.startswith("file:")
            self._write_lock = WriteLock(
                Path(database + ".locks") / "write.lock" if on_disk else None
            )
            if on_disk:  # an in-memory ledger has one shared connection: nothing to batch
                self._sqlite_file = Path(database)
                self._held = HeldConnections(
                    engine, lambda e: install_sqlite_hooks(e, sqlite_synchronous, busy_timeout_ms)
                )
                self._writes = WriteQueue(write_transaction)
        else:
            self._deferred = WriteQueue(write_transaction)
            self._audit_rows = WriteQueue(write_transaction)
        self._locks = ScopeLocks(engine)
        # Observes how long each transaction waited for a pooled connection (the
        # gateway's metrics; seconds): ``None`` observes nothing.
        self.on_connection_wait: Callable[[float], None] | None = None

    def close(self) -> None:
        """Write what is queued, then release the ledger's connections."""
        for queue in (self._writes, self._deferred, self._audit_rows):
            if queue is not None:
                queue.close()
        if self._held is not None:
            self._held.close()
        if self._write_lock is not None:
            self._write_lock.close()
        self.engine.dispose()

    # -- plumbing ---------------------------------------------------------------------

    @contextmanager
    def _transaction(self, *, write: bool, durable: bool = True) -> Iterator[Connection]:
        """One transaction; database failures become ``LedgerUnavailable``.

        ``write`` takes the write lock up front (SQLite ``BEGIN IMMEDIATE``); ``durable``
        False lets SQLite skip the commit's fsync (WAL ``synchronous=NORMAL``): used for
        outcomes and the request log, never for charges or admin changes.
        """
        locked = self._write_lock.hold() if write and self._write_lock else nullcontext()
        held = self._held
        try:
            if held is not None:  # a SQLite file: this thread's connection, begun on the driver

                def begin(conn: Connection, raw: Any) -> None:
                    sqlite_begin(
                        conn, raw, write=write, durable=durable, synchronous=self._synchronous
                    )

                with locked, held.transaction(begin) as conn:
                    yield conn
                return
            asked = time.monotonic()
            with locked, self.engine.connect() as conn:
                if self.on_connection_wait is not None:
                    self.on_connection_wait(time.monotonic() - asked)
                if write:
                    conn.execution_options(dpgate_write=True, dpgate_durable=durable)
                with conn.begin():
                    if write and not durable and not self._sqlite:
                        # PostgreSQL: the outcome need not wait for its WAL flush (the
                        # charge it settles already did).
                        conn.exec_driver_sql("SET LOCAL synchronous_commit = off")
                    yield conn
        except _UNAVAILABLE as exc:
            raise LedgerUnavailable(f"the ledger database failed: {type(exc).__name__}") from exc

    def write(
        self,
        fn: Callable[[Connection], T],
        *,
        durable: bool,
        wait: bool = True,
        savepoint: bool = True,
        on_done: Callable[[bool, Any], None] | None = None,
    ) -> T | None:
        """Run ``fn`` in a write transaction: on a SQLite file, in the next
        group-committed batch (``budget.writer``); elsewhere in a transaction of its own
        (PostgreSQL group-commits concurrent sessions itself). With ``wait`` False the
        call may return before the write — for the request log: on a SQLite file it rides
        on the next batch; on a server its rows are committed together by the queue's
        lingering thread, each in a savepoint (PostgreSQL aborts a transaction at its
        first error), one transaction instead of one per request. ``savepoint`` False:
        ``fn``'s writes are each valid alone, so in a SQLite batch it needs no savepoint
        (``WriteQueue.run``). ``on_done(ok, value)``: called once an un-awaited write has
        committed or failed."""
        if not wait and self._deferred is not None:
            self._deferred.submit(fn, durable=durable, savepoint=True, on_done=on_done)
            return None
        if self._writes is not None:
            if not wait:
                self._writes.submit(fn, durable=durable, savepoint=savepoint, on_done=on_done)
                return None
            return self._writes.run(fn, durable=durable, savepoint=savepoint)
        try:
            with self._transaction(write=True, durable=durable) as conn:
                result = fn(conn)
        except Exception as exc:
            if on_done is not None:
                on_done(False, exc)
            raise
        if on_done is not None:
            on_done(True, result)
        return result

    def flush(self) -> None:
        """Wait until every write queued by this process so far is committed."""
        for queue in (self._writes, self._deferred, self._audit_rows):
            if queue is not None:
                queue.flush()

    def migrate(self) -> int:
        """Create the schema, or upgrade it to this version; returns the schema version."""
        with self._transaction(write=True) as conn:
            return schema.migrate(conn)

    def ping(self) -> None:
        """Raise ``LedgerUnavailable`` unless the ledger database answers (for /readyz)."""
        with self._transaction(write=False) as conn:
            conn.execute(sa.select(schema.schema_version.c.version).limit(1))

    def probe_write(self) -> None:
        """Raise ``LedgerUnavailable`` unless the ledger database takes a durable write
        (for /readyz: a full disk, a read-only or failed-over server answer reads but
        not charges). Rewrites the latest schema-version row with its own values."""
        latest = sa.select(sa.func.max(schema.schema_version.c.version)).scalar_subquery()
        touch = (
            sa.update(schema.schema_version)
            .where(schema.schema_version.c.version == latest)
            .values(applied_at=schema.schema_version.c.applied_at)
        )
        self.write(lambda conn: conn.execute(touch), durable=True)
        if self._sqlite_file is not None:
            # A full disk can still take this one write (SQLite rewinds a checkpointed WAL
            # and writes over it) and then fail the next charge, which grows the file.
            disk = os.statvfs(self._sqlite_file.parent)
            if disk.f_bavail * disk.f_frsize < LEDGER_MIN_FREE_BYTES:
                raise LedgerUnavailable(
                    f"the ledger's disk has less than {LEDGER_MIN_FREE_BYTES // 1024} KiB free"
                )

    def _analyst_row(self, conn: Connection, name: str, *, lock: bool = False) -> Any:
        if lock:
            row = st.HOT_ANALYST_FOR_UPDATE.first(conn, {"name": name})
        else:
            row = conn.execute(st.ANALYST, {"name": name}).first()
        if row is None:
            raise UnknownAnalyst(f"no analyst named {name!r}")
        return row

    def now(self) -> datetime:
        """The ledger's current time (naive UTC; the injected clock's, if any)."""
        return self._now()

    def _spent(
        self,
        conn: Connection,
        analyst_id: int | None,
        *,
        since: datetime = ALL_TIME,
        locked: bool = False,
    ) -> tuple[Spent, int]:
        """Σ of the charge and refund rows charged at or after ``since`` (refunds are
        stored negated), and how many charges are live: one analyst's rows, or with
        ``analyst_id`` None every analyst's (the global budget).

        The latest checkpoint of the same ``since`` plus the rows after it. With
        ``locked`` a new checkpoint is written once enough rows follow the last one: the
        caller holds the analyst's charge lock, or for the global sum is in a write
        transaction (``_spent_global`` says what more that needs).
        """
        if analyst_id is None:
            return self._spent_global(conn, since, checkpoint=locked)
        period = since != ALL_TIME
        params: dict[str, Any] = {"analyst_id": analyst_id}
        if period:
            params["since"] = since
        r = (st.SPENT_ANALYST_SINCE if period else st.SPENT_ANALYST).first(conn, params)
        sums = _after_checkpoint(r)
        if locked and r.rows >= CHECKPOINT_EVERY:
            self._checkpoint(conn, st.INSERT_CHECKPOINT, r, sums, since, analyst_id=analyst_id)
        return sums.spent, sums.charges

    def _spent_global(
        self, conn: Connection, since: datetime, *, checkpoint: bool
    ) -> tuple[Spent, int]:
        """Every analyst's rows charged at or after ``since``, from the latest global
        checkpoint (the global budget's sum; without checkpoints it would read the whole
        ledger on every charge, under the write lock).

        A global checkpoint at ``upto_id`` is exact only if no cost-bearing row can
        commit with a smaller id after it is written. On SQLite the caller's write
        transaction holds the database's only write lock, and a new row's id exceeds
        every id present. On PostgreSQL ids come from a sequence and commit out of order,
        so this transaction first tries the cost-rows advisory lock exclusively
        (``st.COST_ROWS_EXCLUSIVE``; every cost-bearing row is appended holding it
        shared: ``st.INSERT_ENTRY_SHARED``, ``_share_cost_rows``): if another
        transaction is appending one, no
        checkpoint is written this time. The lock is only tried, never waited for, so it
        adds no wait and no lock cycle; and only once the rows after the latest
        checkpoint, as this process last counted them, near the threshold (the try is a
        statement of its own: 0.2 ms)."""
        period = since != ALL_TIME
        quiet = checkpoint and (
            self._sqlite
            or (
                self._global_rows_seen >= CHECKPOINT_EVERY - CHECKPOINT_EVERY // 8
                and bool(st.COST_ROWS_EXCLUSIVE.scalar(conn))
            )
        )
        r = (st.SPENT_GLOBAL_SINCE if period else st.SPENT_GLOBAL).first(
            conn, {"since": since} if period else {}
        )
        self._global_rows_seen = int(r.rows)
        sums = _after_checkpoint(r)
        if quiet and r.rows >= CHECKPOINT_EVERY:
            self._checkpoint(conn, st.INSERT_GLOBAL_CHECKPOINT, r, sums, since)
        return sums.spent, sums.charges

    def _checkpoint(
        self,
        conn: Connection,
        insert: sa.Insert,
        r: Any,
        sums: _Sums,
        since: datetime,
        **key: int,
    ) -> None:
        conn.execute(
            insert,
            {
                **key,
                "upto_id": int(r.max_id),
                "epsilon": sums.epsilon,
                "delta": sums.delta,
                "rho": sums.rho,
                "selection_delta": sums.selection_delta,
                "charges": sums.charges,
                "gaussian": sums.gaussian,
                "since": since if since != ALL_TIME else None,
                "created_at": self._now(),
            },
        )

    def _share_cost_rows(self, conn: Connection) -> None:
        """Before appending a refund row on PostgreSQL: hold the cost-rows advisory lock
        shared, so no global checkpoint is written while this row may still commit
        below it (``_spent_global``; a charge's row takes it in its own statement,
        ``st.INSERT_ENTRY_SHARED``). Shared holders never wait for each other; they
        wait only for a checkpointing charge's transaction to end."""
        if not self._sqlite:
            st.COST_ROWS_SHARED.rows(conn)

    def recompute_spent(self, analyst: str) -> tuple[PrivacyCost, int]:
        """Σ of every charge and refund row of the analyst in their current period,
        ignoring checkpoints (audits)."""
        with self._transaction(write=False) as conn:
            row = self._analyst_row(conn, analyst)
            since = period_start(row.period, self._now())
            r = conn.execute(
                st.SPENT_ALL_SINCE.where(schema.ledger.c.analyst_id == row.id), {"since": since}
            ).one()
        spent = _clamped(r.epsilon, r.delta, r.rho, r.selection_delta, r.gaussian)
        return spent.cost, int(r.n)

    def _status(
        self,
        name: str,
        disabled: bool,
        epsilon: float,
        delta: float,
        period: Period,
        spent: Spent,
        n: int,
        now: datetime,
    ) -> BudgetStatus:
        acc: Accounting = self.accountant.report(epsilon, delta, spent)
        start = None if period == "none" else period_start(period, now)
        end = period_end(period, now)
        return BudgetStatus(
            name=name,
            disabled=disabled,
            composition=acc.composition,
            epsilon=acc.epsilon,
            delta=acc.delta,
            epsilon_spent=acc.epsilon_spent,
            delta_spent=acc.delta_spent,
            epsilon_remaining=acc.epsilon_remaining,
            delta_remaining=acc.delta_remaining,
            rho_budget=acc.rho_budget,
            rho_spent=acc.rho_spent,
            rho_remaining=acc.rho_remaining,
            max_next_laplace_epsilon=acc.max_next_laplace_epsilon,
            queries=n,
            period=period,
            period_started_at=None if start is None else schema.as_utc(start),
            period_ends_at=None if end is None else schema.as_utc(end),
            basis=acc.basis,
            epsilon_spent_basic=acc.epsilon_spent_basic,
            epsilon_spent_zcdp=acc.epsilon_spent_zcdp,
            selection_delta_budget=acc.selection_delta_budget,
        )

    def _row_status(self, conn: Connection, row: Any, now: datetime) -> BudgetStatus:
        period = _period_of(row)
        spent, n = self._spent(conn, row.id, since=period_start(period, now))
        return self._status(
            row.name, bool(row.disabled), row.epsilon, row.delta, period, spent, n, now
        )

    def _global(
        self, conn: Connection, *, lock: bool = False
    ) -> tuple[float, float, Period] | None:
        """The global budget: the one an admin set in the ledger, else the config's."""
        row = (st.LOCK_GLOBAL if lock else st.GLOBAL_BUDGET).first(conn)
        if row is None:
            return self._global_of(None, None, None)
        return self._global_of(row.epsilon, row.delta, row.period)

    def _global_of(
        self, epsilon: float | None, delta: float | None, period: str | None
    ) -> tuple[float, float, Period] | None:
        """The global budget from the ledger's row (epsilon None: no admin set one)."""
        if epsilon is not None:
            return float(epsilon), float(delta or 0.0), check_period(period or "none")
        if self.global_budget is None:
            return None
        return self.global_budget[0], self.global_budget[1], self.global_period

    # -- analysts -----------------------------------------------------------------------

    # -- admin principals ------------------------------------------------------------

    # -- access: group memberships and table grants (budget/grants.py) ------------------

    # -- charging ----------------------------------------------------------------------

    def _await_outcome(self, query_key: str | None = None) -> None:
        """Before reading outcomes: let this process's queued ones (of ``query_key``, or
        any) reach the ledger."""
        with self._unsettled_lock:
            pending = bool(self._unsettled) if query_key is None else query_key in self._unsettled
        if pending:
            self.flush()

    # -- audit refusals ------------------------------------------------------------------

    # -- reading the ledger --------------------------------------------------------------

    # -- the request audit log -------------------------------------------------------------


@dataclass(frozen=True)
class _Sums:
    """A checkpoint plus the rows after it (unclamped: a new checkpoint stores these)."""

    epsilon: float
    delta: float
    rho: float
    selection_delta: float
    charges: int
    gaussian: int

    @property
    def spent(self) -> Spent:
        return _clamped(self.epsilon, self.delta, self.rho, self.selection_delta, self.gaussian)


def _after_checkpoint(r: Any) -> _Sums:
    """The sums of a ``SPENT_ANALYST`` / ``SPENT_GLOBAL`` row: its checkpoint's (none:
    zero) plus those of the rows after it."""
    # A checkpoint without a Gaussian count (written by an older dpgate) may hide one.
    cp_gaussian = 0 if r.cp_id is None else (1 if r.cp_gaussian is None else r.cp_gaussian)
    return _Sums(
        epsilon=(r.cp_epsilon or 0.0) + r.epsilon,
        delta=(r.cp_delta or 0.0) + r.delta,
        rho=(r.cp_rho or 0.0) + r.rho,
        selection_delta=(r.cp_selection_delta or 0.0) + r.selection_delta,
        charges=int(r.cp_charges or 0) + int(r.n),
        gaussian=int(cp_gaussian) + int(r.gaussian),
    )


def _clamped(eps: float, delta: float, rho: float, sel: float, gaussian: Any) -> Spent:
    # Σ charges − Σ refunds of equal values can leave a float residue just below zero.
    return Spent(
        max(0.0, eps), max(0.0, delta), max(0.0, rho), max(0.0, sel), max(0, int(gaussian or 0))
    )


class Ledger(Principals, Charging, Journal, LedgerCore):
    """Budgets and the append-only ledger of charges, outcomes and requests (SQLAlchemy).

    ``composition`` picks the accountant (``combined``, ``zcdp`` or ``pure``) and
    ``selection_share`` the share of each δ budget partition selection may spend
    (``budget.accountants``). ``global_budget`` = (ε, δ), renewed every ``global_period``,
    caps the composition of every analyst's charges together until an admin sets the
    global budget in the ledger (``set_global_budget``), which then wins. ``clock``
    returns the current naive UTC time (tests inject one to move through periods).
    """

    @classmethod
    def from_url(cls, url: str, **kw: Any) -> Ledger:
        """A ledger on a database URL (``sqlite:///path``, ``postgresql+psycopg://…``).

        SQLite URLs may end in ``?synchronous=normal``: charges are then no longer fsynced
        at commit (WAL ``synchronous=NORMAL``). A killed process still loses nothing; an
        OS crash or power cut may lose the last transactions, charges included. The
        default, ``full``, fsyncs every charge before ``reserve`` returns.
        """
        parsed = sa.make_url(url)
        engine_kw: dict[str, Any] = {}
        if parsed.get_backend_name() == "sqlite":
            synchronous = str(parsed.query.get("synchronous", "")).upper()
            if synchronous:
                if synchronous not in ("FULL", "NORMAL"):
                    raise ValueError("a SQLite ledger URL's synchronous must be full or normal")
                kw.setdefault("sqlite_synchronous", synchronous)
                parsed = parsed.difference_update_query(["synchronous"])
            if parsed.database in (None, "", ":memory:"):
                engine_kw["poolclass"] = StaticPool
                engine_kw["connect_args"] = {"check_same_thread": False}
        if parsed.get_backend_name() != "sqlite":
            # Kept, not opened per transaction: connections are made only as concurrency
            # first needs them, then reused.
            engine_kw.update(pool_size=SERVER_POOL_SIZE, max_overflow=SERVER_POOL_OVERFLOW)
        engine = sa.create_engine(parsed, **engine_kw)
        if parsed.get_backend_name() != "sqlite":
            ping_when_idle(engine)  # a server's connections can go stale (budget/pool.py)
        return cls(engine, **kw)
