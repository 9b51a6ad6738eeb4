"""Rate limits: requests per minute per source address and per analyst.

Counters live in a table of the ledger database (``dpgate_rate_limits``), so every
worker process and every gateway instance sharing that ledger counts against the same
limit, with no extra service to run.

The limit is a fixed one-minute window: request number ``n`` of a window is refused
when ``n > limit``. Each request increments its window's counter in one transaction
whose first statement is the ``UPDATE`` (a row lock in PostgreSQL, the write lock in
SQLite), so concurrent requests get distinct counts and a burst of ``limit + k``
requests inside one window gets exactly ``k`` refusals, however many workers serve it.
The price of exactness is the usual fixed-window edge: a client may send up to twice
the limit across a window boundary.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Literal

from sqlalchemy import (
    BigInteger,
    Column,
    Connection,
    Engine,
    Integer,
    MetaData,
    String,
    Table,
    delete,
    insert,
    inspect,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from budget import Ledger
from gateway.core.config import LimitsConfig
from gateway.core.errors import LedgerUnavailable, RateLimited

Scope = Literal["address", "analyst"]

WINDOW_SECONDS = 60

_metadata = MetaData()
RATE_LIMITS = Table(
    "dpgate_rate_limits",
    _metadata,
    Column("bucket", String(300), primary_key=True),  # "<scope>:<address or analyst name>"
    Column("window", BigInteger, primary_key=True),  # unix time // WINDOW_SECONDS
    Column("count", Integer, nullable=False),
)


class RateLimiter:
    """Counts requests per (scope, who) and minute in the ledger database."""

    def __init__(
        self,
        engine: Engine,
        *,
        address_per_minute: int | None,
        analyst_per_minute: int | None,
        clock: Callable[[], float] = time.time,
        write: Callable[[Callable[[Connection], int]], int | None] | None = None,
    ) -> None:
        self.engine = engine
        # The ledger's write path (``Ledger.write``: on SQLite, the
        # group-committed, unsynced batches); without it, a transaction of our own.
        self._run_write = write
        self.limits: dict[Scope, int | None] = {
            "address": address_per_minute,
            "analyst": analyst_per_minute,
        }
        self.clock = clock
        self._schema_ready = False
        self._schema_lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return any(limit is not None for limit in self.limits.values())

    def ensure_schema(self) -> None:
        """Create the counters table if it is missing (safe when workers race to do it)."""
        if self._schema_ready or not self.enabled:
            return
        with self._schema_lock:
            for attempt in range(3):
                try:
                    _metadata.create_all(self.engine, checkfirst=True)
                    break
                except SQLAlchemyError:
                    # Another worker may have created it between our check and our
                    # CREATE (PostgreSQL then reports a duplicate, SQLite "exists").
                    if inspect(self.engine).has_table(RATE_LIMITS.name):
                        break
                    if attempt == 2:
                        raise
                    time.sleep(0.05 * (attempt + 1))
            self._schema_ready = True

    def hit(self, scope: Scope, who: str) -> None:
        """Count one request; raise ``RateLimited`` if it is over the scope's limit.

        Raises ``LedgerUnavailable`` when the counters cannot be read or written: like
        every other path through the gateway, a request fails closed without its ledger.
        """
        limit = self.limits[scope]
        if limit is None:
            return
        now = self.clock()
        window = int(now // WINDOW_SECONDS)
        try:
            self.ensure_schema()
            count = self._increment(f"{scope}:{who}", window)
        except SQLAlchemyError as e:
            raise LedgerUnavailable(
                "the ledger database is unavailable", component="rate_limits"
            ) from e
        if count > limit:
            retry_after = max(1, math.ceil((window + 1) * WINDOW_SECONDS - now))
            raise RateLimited(
                f"more than {limit} requests per minute for this {scope}; retry in {retry_after} s",
                scope=scope,
                limit=limit,
                retry_after=retry_after,
            )

    @staticmethod
    def _write(conn: Connection) -> Connection:
        # On the ledger's SQLite engine this makes the transaction BEGIN IMMEDIATE
        # (budget.ledger's hook); other engines ignore the option.
        return conn.execution_options(dpgate_write=True)

    def _increment(self, bucket: str, window: int) -> int:
        """Add one to the window's counter and return the new count (exact under races)."""
        key = (RATE_LIMITS.c.bucket == bucket) & (RATE_LIMITS.c.window == window)

        def increment(conn: Connection) -> int:
            updated = conn.execute(
                update(RATE_LIMITS).where(key).values(count=RATE_LIMITS.c.count + 1)
            ).rowcount
            if updated:
                return int(conn.execute(select(RATE_LIMITS.c.count).where(key)).scalar_one())
            conn.execute(insert(RATE_LIMITS).values(bucket=bucket, window=window, count=1))
            # A new window: forget windows that can no longer matter.
            conn.execute(delete(RATE_LIMITS).where(RATE_LIMITS.c.window < window - 1))
            return 1

        for _ in range(5):
            try:
                if self._run_write is not None:
                    count = self._run_write(increment)
                    assert count is not None
                    return count
                with self.engine.connect() as conn, self._write(conn).begin():
                    return increment(conn)
            except IntegrityError:
                continue  # a concurrent request inserted this window first: count again
        raise LedgerUnavailable("could not update the rate-limit counters", component="rate_limits")


def limiter_for_ledger(ledger: Ledger, limits: LimitsConfig) -> RateLimiter | None:
    """The rate limiter of a gateway whose counters live in its ledger (written through
    the ledger's unsynced, group-committed batches); ``None`` when no limit is set."""
    if limits.analyst_per_minute is None and limits.address_per_minute is None:
        return None
    return RateLimiter(
        ledger.engine,
        address_per_minute=limits.address_per_minute,
        analyst_per_minute=limits.analyst_per_minute,
        write=lambda fn: ledger.write(fn, durable=False),
    )
