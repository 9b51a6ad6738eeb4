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

Layout: ``statements`` (the hot-path SQL, built once), ``sqlite`` (WAL and BEGIN
IMMEDIATE), ``reads`` (history, releases, audit log), ``schema`` (tables, migrations).
"""

from __future__ import annotations

import base64
import json
import logging
import math
import re
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.pool import StaticPool

from budget import audit_chain, grants, reads, schema
from budget import statements as st
from budget.accountants import (
    DEFAULT_SELECTION_SHARE,
    Accountant,
    Accounting,
    CompositionName,
    Spent,
    accountant,
    is_pure,
)
from budget.errors import (
    AnalystDisabled,
    AnalystExists,
    BudgetExhausted,
    LedgerUnavailable,
    ReservationSettled,
    UnknownAnalyst,
    UnsupportedCost,
)
from budget.held import HeldConnections
from budget.keys import ScramVerifier, key_hash, new_api_key, scram_verifier
from budget.locks import ScopeLocks
from budget.periods import ALL_TIME, Period, check_period, period_end, period_start
from budget.pool import ping_when_idle
from budget.records import (
    ADMIN_ROLES,
    AdminCaller,
    AdminPrincipal,
    AdminRole,
    Analyst,
    AuditEntry,
    BudgetStatus,
    CacheProbe,
    Charge,
    HistoryEntry,
    Lookup,
    Outcome,
    Quote,
    Refusal,
    ReleaseEntry,
    Reservation,
)
from budget.sqlite import begin as sqlite_begin
from budget.sqlite import install_sqlite_hooks
from budget.writer import WriteLock, WriteQueue, flush_all
from mechanisms.types import PrivacyCost

log = logging.getLogger("dpgate.ledger")

GLOBAL_NAME = "(global)"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$")
_UNAVAILABLE = (sa.exc.OperationalError, sa.exc.InterfaceError, sa.exc.TimeoutError)

t_analysts = schema.analysts

T = TypeVar("T")

#: Queued outcome rows kept to be written again after a ledger outage (each holds its
#: released answer); beyond this many, an outcome stays pending (its charge stands).
MAX_UNRECORDED = 10_000
# Rows summed past the latest checkpoint before a charge writes a new one.
CHECKPOINT_EVERY = 256
# A server ledger's connection pool per process: a serving worker runs 16 request
# threads, each holding a connection for one short transaction at a time, besides the
# lingering writer and the auditor's scope locks. SQLAlchemy's default (5 kept, 10 more
# opened and closed on demand) made a worker under load open a new PostgreSQL connection
# for most transactions beyond the fifth (py-spy: 4.7% of its time in connect).
SERVER_POOL_SIZE = 24
SERVER_POOL_OVERFLOW = 8  # opened beyond those for a burst, closed at check-in


def _check_budget(epsilon: float, delta: float) -> None:
    if not (math.isfinite(epsilon) and epsilon >= 0):
        raise ValueError("epsilon must be a finite number >= 0")
    if not (math.isfinite(delta) and 0 <= delta < 1):
        raise ValueError("delta must be a number in [0, 1)")


def _check_cost(cost: PrivacyCost) -> None:
    values = (cost.epsilon, cost.delta, cost.rho, cost.selection_delta)
    if not all(math.isfinite(v) and v >= 0 for v in values):
        raise UnsupportedCost("every component of a privacy cost must be finite and >= 0")


class Ledger:
    """Budgets and the append-only ledger of charges, outcomes and requests (SQLAlchemy).

    ``composition`` picks the accountant (``combined``, ``zcdp`` or ``pure``) and
    ``selection_share`` the share of each δ budget partition selection may spend
    (``budget.accountants``). ``global_budget`` = (ε, δ), renewed every ``global_period``,
    caps the composition of every analyst's charges together until an admin sets the
    global budget in the ledger (``set_global_budget``), which then wins. ``clock``
    returns the current naive UTC time (tests inject one to move through periods).
    """

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

    def create_analyst(
        self,
        name: str,
        epsilon: float,
        delta: float,
        period: Period = "none",
        *,
        caller: AdminCaller | None = None,
    ) -> str:
        """Create an analyst with budget (ε, δ), renewed every ``period`` (``none``:
        never); returns their API key (shown only once). ``caller``: the admin change is
        audit-logged (``analyst.create``) in the same transaction."""
        if not _NAME.match(name):
            raise ValueError(
                "an analyst name is 1-64 letters, digits, '_', '.', '@' or '-', "
                "starting with a letter or digit"
            )
        _check_budget(epsilon, delta)
        check_period(period)
        key = new_api_key()
        now = self._now()
        try:
            with self._transaction(write=True) as conn:
                exists = conn.execute(
                    sa.select(t_analysts.c.id).where(t_analysts.c.name == name)
                ).first()
                if exists is not None:
                    raise AnalystExists(f"an analyst named {name!r} already exists")
                inserted = conn.execute(
                    sa.insert(t_analysts).values(
                        name=name,
                        key_hash=key_hash(key),
                        epsilon=float(epsilon),
                        delta=float(delta),
                        period=period,
                        disabled=False,
                        created_at=now,
                        updated_at=now,
                    )
                ).inserted_primary_key
                assert inserted is not None
                _store_verifier(conn, int(inserted[0]), scram_verifier(key))
                self._record_admin(
                    conn,
                    caller,
                    "analyst.create",
                    {"name": name, "epsilon": epsilon, "delta": delta, "period": period},
                )
        except sa.exc.IntegrityError as exc:  # a concurrent create won the race
            raise AnalystExists(f"an analyst named {name!r} already exists") from exc
        return key

    def ensure_analyst(
        self, name: str, epsilon: float, delta: float, period: Period = "none"
    ) -> str | None:
        """Create the analyst unless one of that name exists (config bootstrap).

        Returns the new key if created, ``None`` if the analyst already existed (the
        ledger, not the config, is the source of truth: an existing budget is kept).
        """
        try:
            return self.create_analyst(name, epsilon, delta, period)
        except AnalystExists:
            return None

    def authenticate(self, key: str) -> Analyst | None:
        """The analyst holding this API key (possibly disabled), or ``None``."""
        if not key or len(key) > 256:
            return None
        with self._transaction(write=False) as conn:
            row = conn.execute(st.ANALYST_BY_KEY, {"key_hash": key_hash(key)}).first()
        if row is None:
            return None
        return Analyst(row.name, bool(row.disabled), row.epsilon, row.delta, _period_of(row))

    def lookup(
        self,
        key: str | None,
        probe: CacheProbe | None = None,
        *,
        access: bool = False,
        groups: bool = True,
        name: str | None = None,
    ) -> Lookup:
        """Authenticate ``key`` (or, for a caller already authenticated elsewhere — a
        verified token — find the analyst ``name``) and, for its analyst, find the release
        ``probe`` names and the analyst's budget; with ``access``, also the stored grants
        and the analyst's groups (``budget.grants``; without ``groups``, only when some
        grant is stored) — in one read transaction (a request's only read)."""
        if name is None and (not key or len(key) > 256):
            return Lookup(None)
        if probe is not None:
            self._await_outcome(probe.query_key)
        now = self._now()
        with self._transaction(write=False) as conn:
            if name is not None:
                row = st.HOT_ANALYST_BY_NAME.first(conn, {"name": name})
            else:
                row = st.HOT_ANALYST_BY_KEY.first(conn, {"key_hash": key_hash(key or "")})
            if row is None:
                return Lookup(None)
            analyst = Analyst(row.name, bool(row.disabled), row.epsilon, row.delta, _period_of(row))
            stored = grants.read_access(conn, row.name, groups=groups) if access else None
            if probe is None or analyst.disabled:
                return Lookup(analyst, access=stored)
            release = reads.find_release(
                conn, probe.query_key, None if probe.any_analyst else row.name, probe.data_version
            )
            if release is None:
                return Lookup(analyst, access=stored)
            return Lookup(analyst, release, self._row_status(conn, row, now), stored)

    def rotate_key(self, name: str, *, caller: AdminCaller | None = None) -> str:
        """Replace the analyst's API key; returns the new key (the old one stops working).
        ``caller``: audit-logged (``key.rotate``; the key is not) in the same transaction."""
        key = new_api_key()
        verifier = scram_verifier(key)
        with self._transaction(write=True) as conn:
            row = self._analyst_row(conn, name, lock=True)
            conn.execute(
                sa.update(t_analysts)
                .where(t_analysts.c.name == name)
                .values(key_hash=key_hash(key), updated_at=self._now())
            )
            conn.execute(
                sa.delete(schema.scram_verifiers).where(
                    schema.scram_verifiers.c.analyst_id == row.id
                )
            )
            _store_verifier(conn, row.id, verifier)
            self._record_admin(conn, caller, "key.rotate", {"name": name})
        return key

    # -- admin principals ------------------------------------------------------------

    def create_admin(self, name: str, role: AdminRole, *, caller: AdminCaller | None = None) -> str:
        """Create a named admin with ``role`` (``admin`` or ``auditor``); returns their key
        (shown once; only its hash is kept). ``admin`` is the bootstrap admin's name
        (``DPGATE_ADMIN_KEY``) and cannot be taken. Audit-logged as ``admin.create``."""
        if not _NAME.match(name) or name == "admin":
            raise ValueError(
                "an admin name is 1-64 letters, digits, '_', '.', '@' or '-', starting "
                "with a letter or digit, and not 'admin' (the bootstrap admin)"
            )
        if role not in ADMIN_ROLES:
            raise ValueError(f"role must be one of {', '.join(ADMIN_ROLES)}")
        key = new_api_key()
        now = self._now()
        t = schema.admins
        try:
            with self._transaction(write=True) as conn:
                if conn.execute(sa.select(t.c.id).where(t.c.name == name)).first():
                    raise AnalystExists(f"an admin named {name!r} already exists")
                conn.execute(
                    sa.insert(t).values(
                        name=name,
                        role=role,
                        key_hash=key_hash(key),
                        disabled=False,
                        created_at=now,
                        updated_at=now,
                    )
                )
                self._record_admin(conn, caller, "admin.create", {"name": name, "role": role})
        except sa.exc.IntegrityError as exc:
            raise AnalystExists(f"an admin named {name!r} already exists") from exc
        return key

    def update_admin(
        self,
        name: str,
        *,
        role: AdminRole | None = None,
        disabled: bool | None = None,
        caller: AdminCaller | None = None,
    ) -> AdminPrincipal:
        """Change a named admin's role or disable / enable them (``admin.update``)."""
        if role is not None and role not in ADMIN_ROLES:
            raise ValueError(f"role must be one of {', '.join(ADMIN_ROLES)}")
        t = schema.admins
        with self._transaction(write=True) as conn:
            row = conn.execute(sa.select(t).where(t.c.name == name)).first()
            if row is None:
                raise UnknownAnalyst(f"no admin named {name!r}")
            new_role = row.role if role is None else role
            new_disabled = bool(row.disabled) if disabled is None else bool(disabled)
            conn.execute(
                sa.update(t)
                .where(t.c.id == row.id)
                .values(role=new_role, disabled=new_disabled, updated_at=self._now())
            )
            given = {"role": role, "disabled": disabled}
            changed = {k: v for k, v in given.items() if v is not None}
            self._record_admin(conn, caller, "admin.update", {"name": name, **changed})
        return AdminPrincipal(name, new_role, new_disabled)

    def admin_by_key(self, key: str) -> AdminPrincipal | None:
        """The named admin holding this key (possibly disabled), or ``None``."""
        if not key or len(key) > 256:
            return None
        t = schema.admins
        with self._transaction(write=False) as conn:
            row = conn.execute(sa.select(t).where(t.c.key_hash == key_hash(key))).first()
        return None if row is None else AdminPrincipal(row.name, row.role, bool(row.disabled))

    def list_admins(self) -> list[AdminPrincipal]:
        """Every named admin, by name."""
        t = schema.admins
        with self._transaction(write=False) as conn:
            rows = conn.execute(sa.select(t).order_by(t.c.name)).all()
        return [AdminPrincipal(r.name, r.role, bool(r.disabled)) for r in rows]

    # -- access: group memberships and table grants (budget/grants.py) ------------------

    def access(self, analyst: str | None = None) -> grants.StoredAccess:
        """The stored table grants and ``analyst``'s groups, in one read."""
        with self._transaction(write=False) as conn:
            return grants.read_access(conn, analyst)

    def group_members(self) -> dict[str, list[str]]:
        """Every group with members: group → analysts."""
        with self._transaction(write=False) as conn:
            return grants.members(conn)

    def add_member(self, group: str, analyst: str, *, caller: AdminCaller | None = None) -> None:
        """Put an existing analyst in ``group`` (``group.add_member``); ``AnalystExists``
        if they are in it already."""
        if not _NAME.match(group):
            raise ValueError(
                "a group name is 1-64 letters, digits, '_', '.', '@' or '-', starting with "
                "a letter or digit"
            )
        with self._transaction(write=True) as conn:
            self._analyst_row(conn, analyst)
            if grants.has_member(conn, group, analyst):
                raise AnalystExists(f"analyst {analyst!r} is in group {group!r} already")
            conn.execute(
                sa.insert(schema.group_members).values(
                    group_name=group, analyst=analyst, created_at=self._now()
                )
            )
            self._record_admin(
                conn, caller, "group.add_member", {"group": group, "analyst": analyst}
            )

    def remove_member(self, group: str, analyst: str, *, caller: AdminCaller | None = None) -> None:
        """Take ``analyst`` out of ``group`` (``group.remove_member``)."""
        t = schema.group_members
        with self._transaction(write=True) as conn:
            if not grants.has_member(conn, group, analyst):
                raise UnknownAnalyst(f"analyst {analyst!r} is not in group {group!r}")
            conn.execute(sa.delete(t).where(t.c.group_name == group, t.c.analyst == analyst))
            self._record_admin(
                conn, caller, "group.remove_member", {"group": group, "analyst": analyst}
            )

    def grant(self, table: str, group: str, *, caller: AdminCaller | None = None) -> None:
        """Let ``group`` read ``table`` (``grant.add``); ``AnalystExists`` if it may
        already. The table's name is the gateway's to check."""
        if not _NAME.match(group):
            raise ValueError(
                "a group name is 1-64 letters, digits, '_', '.', '@' or '-', starting with "
                "a letter or digit"
            )
        with self._transaction(write=True) as conn:
            if grants.has_grant(conn, table, group):
                raise AnalystExists(f"table {table!r} is granted to {group!r} already")
            conn.execute(
                sa.insert(schema.table_grants).values(
                    table_name=table, group_name=group, created_at=self._now()
                )
            )
            self._record_admin(conn, caller, "grant.add", {"table": table, "group": group})

    def revoke(self, table: str, group: str, *, caller: AdminCaller | None = None) -> None:
        """Take back ``group``'s grant on ``table`` (``grant.remove``)."""
        t = schema.table_grants
        with self._transaction(write=True) as conn:
            if not grants.has_grant(conn, table, group):
                raise UnknownAnalyst(f"table {table!r} is not granted to {group!r}")
            conn.execute(sa.delete(t).where(t.c.table_name == table, t.c.group_name == group))
            self._record_admin(conn, caller, "grant.remove", {"table": table, "group": group})

    def scram_login(self, name: str) -> tuple[Analyst, ScramVerifier] | None:
        """The analyst named ``name`` and their key's SCRAM-SHA-256 verifier, or ``None``
        when there is no such analyst or their key predates verifiers (rotate it)."""
        if not _NAME.match(name):
            return None
        v = schema.scram_verifiers
        with self._transaction(write=False) as conn:
            row = conn.execute(
                sa.select(t_analysts, v.c.salt, v.c.iterations, v.c.stored_key, v.c.server_key)
                .join(v, v.c.analyst_id == t_analysts.c.id)
                .where(t_analysts.c.name == name)
            ).first()
        if row is None:
            return None
        verifier = ScramVerifier(
            salt=base64.b64decode(row.salt),
            iterations=int(row.iterations),
            stored_key=base64.b64decode(row.stored_key),
            server_key=base64.b64decode(row.server_key),
        )
        return Analyst(row.name, bool(row.disabled), row.epsilon, row.delta), verifier

    def update_analyst(
        self,
        name: str,
        *,
        epsilon: float | None = None,
        delta: float | None = None,
        disabled: bool | None = None,
        period: Period | None = None,
        caller: AdminCaller | None = None,
    ) -> BudgetStatus:
        """Change an analyst's budget totals, period or disabled flag; the new status.
        ``caller``: audit-logged in the same transaction (``analyst.disable``,
        ``analyst.enable``, ``budget.set``, or ``analyst.update`` for several at once).

        Lowering a budget below what is spent is allowed: nothing more is admitted. A new
        period counts the charges made since the start of the current one.
        """
        with self._transaction(write=True) as conn:
            row = self._analyst_row(conn, name, lock=True)
            new_eps = row.epsilon if epsilon is None else float(epsilon)
            new_delta = row.delta if delta is None else float(delta)
            _check_budget(new_eps, new_delta)
            new_period = _period_of(row) if period is None else check_period(period)
            new_disabled = bool(row.disabled) if disabled is None else bool(disabled)
            now = self._now()
            conn.execute(
                sa.update(t_analysts)
                .where(t_analysts.c.id == row.id)
                .values(
                    epsilon=new_eps,
                    delta=new_delta,
                    period=new_period,
                    disabled=new_disabled,
                    updated_at=now,
                )
            )
            spent, n = self._spent(conn, row.id, since=period_start(new_period, now))
            given = {"epsilon": epsilon, "delta": delta, "period": period}
            changed: dict[str, Any] = {k: v for k, v in given.items() if v is not None}
            if disabled is None:
                action = "budget.set"
            elif changed:
                action = "analyst.update"
            else:
                action = "analyst.disable" if disabled else "analyst.enable"
            if disabled is not None:
                changed["disabled"] = disabled
            self._record_admin(conn, caller, action, {"name": name, **changed})
        return self._status(name, new_disabled, new_eps, new_delta, new_period, spent, n, now)

    def budget_status(self, name: str) -> BudgetStatus:
        """The analyst's budget, in their current period, as the accountant reports it."""
        now = self._now()
        with self._transaction(write=False) as conn:
            return self._row_status(conn, self._analyst_row(conn, name), now)

    def global_status(self) -> BudgetStatus | None:
        """The dataset-wide budget (named ``(global)``), or ``None`` if there is none."""
        now = self._now()
        with self._transaction(write=False) as conn:
            budget = self._global(conn)
            if budget is None:
                return None
            epsilon, delta, period = budget
            spent, n = self._spent(conn, None, since=period_start(period, now))
        return self._status(GLOBAL_NAME, False, epsilon, delta, period, spent, n, now)

    def set_global_budget(
        self,
        *,
        epsilon: float | None = None,
        delta: float | None = None,
        period: Period | None = None,
        caller: AdminCaller | None = None,
    ) -> BudgetStatus:
        """Set the dataset-wide budget in the ledger (it then wins over the config's).
        ``caller``: audit-logged (``budget.set_global``) in the same transaction.

        Fields left ``None`` keep their current value; without a global budget yet,
        ``epsilon`` and ``delta`` are required. Returns the new status.
        """
        now = self._now()
        with self._transaction(write=True) as conn:
            current = self._global(conn, lock=True)
            if current is None and (epsilon is None or delta is None):
                raise ValueError("there is no global budget yet: give both epsilon and delta")
            old_eps, old_delta, old_period = current or (0.0, 0.0, "none")
            new_eps = old_eps if epsilon is None else float(epsilon)
            new_delta = old_delta if delta is None else float(delta)
            new_period = old_period if period is None else check_period(period)
            _check_budget(new_eps, new_delta)
            conn.execute(
                sa.update(schema.global_lock)
                .where(schema.global_lock.c.id == 1)
                .values(epsilon=new_eps, delta=new_delta, period=new_period, updated_at=now)
            )
            spent, n = self._spent(conn, None, since=period_start(new_period, now), locked=True)
            given = {"epsilon": epsilon, "delta": delta, "period": period}
            self._record_admin(
                conn,
                caller,
                "budget.set_global",
                {k: v for k, v in given.items() if v is not None},
            )
        return self._status(GLOBAL_NAME, False, new_eps, new_delta, new_period, spent, n, now)

    def list_analysts(self) -> list[BudgetStatus]:
        """Every analyst's budget status, by name."""
        now = self._now()
        with self._transaction(write=False) as conn:
            rows = conn.execute(sa.select(t_analysts).order_by(t_analysts.c.name)).all()
            return [self._row_status(conn, r, now) for r in rows]

    # -- charging ----------------------------------------------------------------------

    def reserve(
        self,
        analyst: str,
        cost: PrivacyCost,
        *,
        query_key: str,
        sql: str,
        mechanism: str,
        data_version: str,
    ) -> Reservation:
        """Charge ``cost`` to the analyst (and the global budget) if the accountant admits it.

        One transaction: lock, sum the ledger (the current period of each budget), ask
        the accountant, append the charge. The charge is durable when this returns.
        Raises ``BudgetExhausted`` (nothing appended), ``UnknownAnalyst``,
        ``AnalystDisabled``, ``UnsupportedCost`` (e.g. a Gaussian cost under ``pure``),
        ``LedgerUnavailable``.
        """
        self._check_chargeable(cost, mechanism)
        reservation_id = uuid.uuid4().hex
        now = self._now()

        def charge(conn: Connection) -> tuple[Any, Period, Spent, int]:
            row = st.HOT_CHARGE_ANALYST.first(conn, {"name": analyst})
            if row is None:
                raise UnknownAnalyst(f"no analyst named {analyst!r}")
            if row.disabled:
                raise AnalystDisabled(f"analyst {analyst!r} is disabled")
            period = _period_of(row)
            global_budget = self._global_of(row.global_epsilon, row.global_delta, row.global_period)
            if global_budget is not None:  # lock, and read again under the lock
                global_budget = self._global(conn, lock=True)
            spent, n = self._spent(conn, row.id, since=period_start(period, now), locked=True)
            self._admit("analyst", row.epsilon, row.delta, period, spent, cost, mechanism, now)
            if global_budget is not None:
                g_eps, g_delta, g_period = global_budget
                global_spent, _ = self._spent(
                    conn, None, since=period_start(g_period, now), locked=True
                )
                self._admit("global", g_eps, g_delta, g_period, global_spent, cost, mechanism, now)
            # PostgreSQL: appended holding the cost-rows lock shared (``_spent_global``)
            (st.INSERT_ENTRY if self._sqlite else st.INSERT_ENTRY_SHARED).run(
                conn,
                {
                    "reservation_id": reservation_id,
                    "settles": None,
                    "analyst_id": row.id,
                    "kind": "charge",
                    "epsilon": cost.epsilon,
                    "delta": cost.delta,
                    "rho": cost.rho,
                    "selection_delta": cost.selection_delta,
                    "mechanism": mechanism,
                    "query_key": query_key,
                    "sql": sql,
                    "data_version": data_version,
                    "release": None,
                    "reason": None,
                    "created_at": now,
                    "charged_at": now,
                },
            )
            return row, period, spent, n

        # No savepoint: reads, then at most a checkpoint (exact whether or not the charge
        # follows) and the charge's one row.
        result = self.write(charge, durable=True, savepoint=False)
        assert result is not None
        row, period, spent, n = result
        before = self._status(row.name, False, row.epsilon, row.delta, period, spent, n, now)
        after = self._status(
            row.name,
            False,
            row.epsilon,
            row.delta,
            period,
            spent.plus(cost, mechanism),
            n + 1,
            now,
        )
        return Reservation(
            id=reservation_id,
            analyst=row.name,
            cost=cost,
            mechanism=mechanism,
            query_key=query_key,
            data_version=data_version,
            created_at=schema.as_utc(now),
            budget=after,
            charge=_charge(before, after),
        )

    def quote(self, analyst: str, cost: PrivacyCost, mechanism: str) -> Quote:
        """What charging ``cost`` would do to the analyst's budget, without charging:
        whether it fits now, what it would add to their figures, and how many such
        queries their budget still admits (the global budget aside)."""
        self._check_chargeable(cost, mechanism)
        now = self._now()
        with self._transaction(write=False) as conn:
            row = self._analyst_row(conn, analyst)
            period = _period_of(row)
            spent, n = self._spent(conn, row.id, since=period_start(period, now))
        eps, delta, disabled = row.epsilon, row.delta, bool(row.disabled)
        before = self._status(row.name, disabled, eps, delta, period, spent, n, now)
        after = self._status(
            row.name, disabled, eps, delta, period, spent.plus(cost, mechanism), n + 1, now
        )
        acc = self.accountant
        return Quote(
            would_fit=not disabled and acc.refusal(eps, delta, spent, cost, mechanism) is None,
            charge=_charge(before, after),
            queries_remaining=0
            if disabled
            else acc.queries_remaining(eps, delta, spent, cost, mechanism),
            budget=before,
        )

    def _check_chargeable(self, cost: PrivacyCost, mechanism: str) -> None:
        _check_cost(cost)
        if self.composition == "pure" and not is_pure(cost, mechanism):
            raise UnsupportedCost(
                "this gateway accounts pure ε-DP only (composition: pure): "
                "Gaussian releases cannot be charged; use the Laplace mechanism"
            )

    def _admit(
        self,
        scope: Literal["analyst", "global"],
        epsilon: float,
        delta: float,
        period: Period,
        spent: Spent,
        cost: PrivacyCost,
        mechanism: str,
        now: datetime,
    ) -> None:
        reason = self.accountant.refusal(epsilon, delta, spent, cost, mechanism)
        if reason is None:
            return
        left = self.accountant.report(epsilon, delta, spent)
        whose = "your privacy budget" if scope == "analyst" else "the dataset-wide budget"
        end = period_end(period, now)
        renews = "" if end is None else f"; it renews at {schema.as_utc(end).isoformat()}"
        raise BudgetExhausted(
            f"{whose} cannot pay for this query ({reason}): it costs ε={cost.epsilon:.4g} "
            f"(ρ={cost.rho:.4g}, selection δ={cost.selection_delta:.3g}); remaining "
            f"ε={left.epsilon_remaining:.4g}, δ={left.delta_remaining:.3g} under "
            f"{self.composition} composition; the largest next Laplace query may use "
            f"ε={left.max_next_laplace_epsilon:.4g}{renews}",
            scope=scope,
            remaining_epsilon=left.epsilon_remaining,
            remaining_delta=left.delta_remaining,
            max_next_laplace_epsilon=left.max_next_laplace_epsilon,
            period_ends_at=None if end is None else schema.as_utc(end).isoformat(),
        )

    def _settle(
        self,
        reservation: Reservation,
        kind: Literal["answered", "withheld", "refund"],
        *,
        release: dict[str, Any] | None,
        reason: str | None,
        wait: bool = True,
    ) -> None:
        params = {
            "rid": reservation.id,
            "kind": kind,
            "sign": -1.0 if kind == "refund" else 0.0,
            "release": None if release is None else json.dumps(release, default=str),
            "reason": reason,
            "now": self._now(),
        }

        def settle(conn: Connection) -> None:
            if kind == "refund":
                conn.execute(st.LOCK_ANALYST_OF_RESERVATION, {"rid": reservation.id}).first()
                self._share_cost_rows(conn)
            if st.SETTLE.run(conn, params) == 0:
                raise ValueError(f"no reservation {reservation.id!r} in this ledger")

        if not wait:
            self._settle_later(reservation, settle)
            return
        try:
            self.write(settle, durable=False, savepoint=False)  # one row, or none
        except sa.exc.IntegrityError as exc:
            raise ReservationSettled(
                f"reservation {reservation.id} already has its outcome"
            ) from exc

    def _settle_later(self, reservation: Reservation, settle: Callable[[Connection], None]) -> None:
        """Queue an outcome row (it rides on the next batch); until it is committed, a
        read of this process that looks for its query key waits for the queue."""
        key = reservation.query_key

        def done(ok: bool, value: Any) -> None:
            with self._unsettled_lock:
                self._unsettled[key] -= 1
                if self._unsettled[key] <= 0:
                    del self._unsettled[key]
            if not ok and isinstance(value, sa.exc.IntegrityError):
                return  # the outcome was written meanwhile
            if not ok:
                with self._unsettled_lock:
                    kept = len(self._unrecorded) < MAX_UNRECORDED
                    if kept:
                        self._unrecorded.append(settle)
                log.error(
                    "the outcome of query %s was not recorded (%s): its charge stands; %s",
                    reservation.id,
                    type(value).__name__,
                    "it is written again once the ledger is back"
                    if kept
                    else "too many are waiting, it stays pending",
                )

        with self._unsettled_lock:
            self._unsettled[key] += 1
        self.write(settle, durable=False, wait=False, savepoint=False, on_done=done)

    @property
    def unrecorded(self) -> int:
        """How many queued outcome rows wait to be written again (their batch failed)."""
        return len(self._unrecorded)

    def record_unrecorded(self) -> int:
        """Write again the queued outcome rows whose batch failed, oldest first; stops at
        the first that fails again (the ledger is still away). Returns how many remain.
        A row written meanwhile (the reservation already has its outcome) is dropped."""
        while True:
            with self._unsettled_lock:
                if not self._unrecorded:
                    return 0
                settle = self._unrecorded[0]
            try:
                self.write(settle, durable=False, savepoint=False)
            except sa.exc.IntegrityError:
                pass  # recorded meanwhile
            except Exception:  # still away: keep it for the next try
                with self._unsettled_lock:
                    return len(self._unrecorded)
            with self._unsettled_lock:
                if self._unrecorded and self._unrecorded[0] is settle:
                    self._unrecorded.popleft()

    def _await_outcome(self, query_key: str | None = None) -> None:
        """Before reading outcomes: let this process's queued ones (of ``query_key``, or
        any) reach the ledger."""
        with self._unsettled_lock:
            pending = bool(self._unsettled) if query_key is None else query_key in self._unsettled
        if pending:
            self.flush()

    def commit(
        self,
        reservation: Reservation,
        release: dict[str, Any],
        outcome: Outcome,
        reason: str | None = None,
        *,
        wait: bool = True,
    ) -> None:
        """Record the outcome of a reserved query: ``answered`` (with the released answer)
        or ``withheld`` — by the post-audit, or because execution failed after the
        statement reached the database — still charged; ``release`` is what the gateway
        wants recorded, not sent, and ``reason`` says why it was withheld.

        ``wait`` False: the row is queued and rides on the writer's next batch (within
        ``budget.writer.LINGER_S``), so the answer leaves without waiting for a second
        write. The charge is already durable; what a killed process can lose is the
        outcome row — the charge then stays spent, and the answer is not reused. This
        process's own reads wait for the row (``_await_outcome``); another process may
        not see it for those milliseconds, so a repeat sent there is charged again. Not
        for a gateway whose auditor replays other workers' answers: it must see the row
        before the scope lock is released."""
        if outcome not in ("answered", "withheld"):
            raise ValueError("outcome must be 'answered' or 'withheld'")
        self._settle(reservation, outcome, release=release, reason=reason, wait=wait)

    def refund(self, reservation: Reservation, reason: str) -> None:
        """Append a refund: nothing was released, so the charge no longer counts."""
        self._settle(reservation, "refund", release=None, reason=reason)

    # -- audit refusals ------------------------------------------------------------------

    def record_refusal(
        self,
        analyst: str,
        *,
        query_key: str,
        sql: str,
        data_version: str,
        reason: str,
        combined_with: tuple[str, ...] = (),
        reservation_id: str | None = None,
    ) -> None:
        """Append an audit refusal of this request (its cost, if any, is the charge of
        ``reservation_id``, recorded apart)."""

        def refuse(conn: Connection) -> None:
            row = self._analyst_row(conn, analyst)
            conn.execute(
                sa.insert(schema.refusals).values(
                    analyst_id=row.id,
                    query_key=query_key,
                    sql=sql,
                    data_version=data_version,
                    reservation_id=reservation_id,
                    reason=reason,
                    combined_with=json.dumps(list(combined_with)),
                    created_at=now,
                )
            )

        now = self._now()
        self.write(refuse, durable=False)

    def find_refusal(self, query_key: str, analyst: str, data_version: str) -> Refusal | None:
        """The auditor's refusal of this request for this analyst, if it was refused."""
        with self._transaction(write=False) as conn:
            row = self._analyst_row(conn, analyst)
            return reads.find_refusal(conn, row.id, query_key, data_version)

    @contextmanager
    def scope_lock(self, scope: str) -> Iterator[None]:
        """Hold the audit lock of ``scope`` (``locks``): across processes and hosts
        sharing this ledger, one query of a scope is audited and answered at a time."""
        with self._locks.hold(scope):
            yield

    # -- reading the ledger --------------------------------------------------------------

    def history(self, analyst: str, *, limit: int | None = None) -> list[HistoryEntry]:
        """The analyst's charged queries with their outcomes, oldest first (last ``limit``)."""
        self._await_outcome()
        with self._transaction(write=False) as conn:
            row = self._analyst_row(conn, analyst)
            return reads.history(conn, row.id, limit)

    def find_release(
        self, query_key: str, analyst: str | None, data_version: str
    ) -> dict[str, Any] | None:
        """The first released answer of an answered query with this key and data version,
        for that analyst (or any analyst when ``None``); ``None`` if there is none."""
        self._await_outcome(query_key)
        with self._transaction(write=False) as conn:
            return reads.find_release(conn, query_key, analyst, data_version)

    def releases(
        self, analyst: str | None, data_version: str, *, after: int | None = None
    ) -> list[ReleaseEntry]:
        """Answered and withheld queries (of one analyst, or all), in ledger order.

        ``after``: only entries whose ``seq`` is greater (incremental replay).
        """
        self._await_outcome()
        with self._transaction(write=False) as conn:
            return reads.releases(conn, analyst, data_version, after)

    # -- the request audit log -------------------------------------------------------------

    def log_request(
        self,
        *,
        request_id: str,
        analyst: str | None,
        endpoint: str,
        sql: str | None,
        outcome: str,
        error_code: str | None,
        status: int,
        actor: str | None = None,
        action: str | None = None,
        params: dict[str, Any] | None = None,
    ) -> None:
        """Append one request, answered or not, to the audit log's hash chain (written
        after this returns: on a SQLite ledger in the writer's next batch, on a server in
        a transaction of request-log rows only). ``actor``: who called (default: the
        analyst); ``action``/``params``: an admin request's (never a key)."""
        row = _audit_row(
            request_id=request_id,
            actor=actor if actor is not None else analyst,
            analyst=analyst,
            endpoint=endpoint,
            action=action,
            params=params,
            sql=sql,
            outcome=outcome,
            error_code=error_code,
            status=status,
            created_at=self._now(),
        )

        def append(conn: Connection) -> None:
            audit_chain.append(conn, row, st.INSERT_REQUEST.run)

        if self._audit_rows is not None:
            self._audit_rows.submit(append, durable=False, savepoint=True)
            return
        self.write(append, durable=False, wait=False, savepoint=False)

    def _record_admin(
        self, conn: Connection, caller: AdminCaller | None, action: str, params: dict[str, Any]
    ) -> None:
        """Append an admin change's audit row in the change's transaction (durable with
        it). The chain's lock is the last this transaction takes (budget/audit_chain)."""
        if caller is None:
            return
        row = _audit_row(
            request_id=caller.request_id,
            actor=caller.actor,
            analyst=None,
            endpoint=caller.endpoint,
            action=action,
            params=params,
            sql=None,
            outcome="admin",
            error_code=None,
            status=caller.status,
            created_at=self._now(),
        )
        audit_chain.append(conn, row, st.INSERT_REQUEST.run)

    def audit_log(
        self,
        analyst: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        limit: int = 1000,
        actor: str | None = None,
    ) -> list[AuditEntry]:
        """Logged requests, newest first, optionally of one analyst or one actor, in
        [since, until).

        Rows another process queued in its last ``budget.writer.LINGER_S`` may not be
        written yet; this process's are (``flush_all``)."""
        flush_all()
        with self._transaction(write=False) as conn:
            return reads.audit_log(conn, analyst, since, until, limit, actor)

    def verify_audit_log(
        self,
        *,
        anchor: tuple[int, str] | None = None,
        kept: Sequence[Mapping[str, Any]] = (),
    ) -> audit_chain.Verdict:
        """Check the audit log's hash chain (``budget.audit_chain.verify``): the first
        row altered or removed; with ``anchor`` or ``kept``, also against a head or an
        export kept outside."""
        flush_all()
        with self._transaction(write=False) as conn:
            return audit_chain.verify(conn, anchor=anchor, kept=kept)

    def export_audit_log(self, after: int = 0) -> Iterator[dict[str, Any]]:
        """The audit log's rows after chain position ``after``, in chain order, each with
        its hashes (``budget.audit_chain.export_row``): JSON lines for an outside copy."""
        flush_all()
        with self._transaction(write=False) as conn:
            yield from audit_chain.export(conn, after)


def _audit_row(
    *,
    request_id: str,
    actor: str | None,
    analyst: str | None,
    endpoint: str,
    action: str | None,
    params: dict[str, Any] | None,
    sql: str | None,
    outcome: str,
    error_code: str | None,
    status: int,
    created_at: datetime,
) -> dict[str, Any]:
    """An audit-log row's fields, cut to their columns' sizes (what is hashed is what is
    stored)."""
    return {
        "request_id": request_id[:64],
        "actor": None if actor is None else actor[:64],
        "analyst": None if analyst is None else analyst[:64],
        "endpoint": endpoint[:200],
        "action": None if action is None else action[:64],
        "params": audit_chain.params_text(params),
        "sql": sql,
        "outcome": outcome[:32],
        "error_code": None if error_code is None else error_code[:64],
        "status": int(status),
        "created_at": created_at.replace(tzinfo=None),
    }


def _store_verifier(conn: Connection, analyst_id: int, verifier: ScramVerifier) -> None:
    def b64(raw: bytes) -> str:
        return base64.b64encode(raw).decode("ascii")

    conn.execute(
        sa.insert(schema.scram_verifiers).values(
            analyst_id=analyst_id,
            salt=b64(verifier.salt),
            iterations=verifier.iterations,
            stored_key=b64(verifier.stored_key),
            server_key=b64(verifier.server_key),
            created_at=schema.utcnow(),
        )
    )


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


def _period_of(row: Any) -> Period:
    return check_period(row.period or "none")


def _rise(before: float, after: float) -> float:
    if after == before:
        return 0.0
    if math.isinf(after):
        return math.inf
    return max(0.0, after - before)


def _charge(before: BudgetStatus, after: BudgetStatus) -> Charge:
    """What one charge added to a budget's figures, in the budget's units."""
    return Charge(
        epsilon=_rise(before.epsilon_spent, after.epsilon_spent),
        delta=_rise(before.delta_spent, after.delta_spent),
    )
