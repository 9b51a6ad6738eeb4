"""Charging: reserve a query's cost, then commit or refund it (``Ledger``'s methods).

Crash safety and concurrency are those of ``budget.ledger``: ``reserve`` commits the
charge before it returns, under the analyst's (then the global) write lock; an outcome
is appended later, queued when the caller does not wait for it, and written again after
a ledger outage. A mixin of ``budget.ledger.Ledger``.
"""

from __future__ import annotations

import json
import logging
import math
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from budget import schema
from budget import statements as st
from budget.accountants import (
    Spent,
    is_pure,
)
from budget.errors import (
    AnalystDisabled,
    BudgetExhausted,
    LedgerUnavailable,
    ReservationSettled,
    UnknownAnalyst,
    UnsupportedCost,
)
from budget.periods import Period, period_end, period_start
from budget.principals import _period_of
from budget.records import (
    BudgetStatus,
    Charge,
    Outcome,
    Quote,
    Reservation,
)
from mechanisms.types import PrivacyCost

if TYPE_CHECKING:  # the base the methods run on (budget/ledger.py)
    from budget.ledger import LedgerCore

    _Base = LedgerCore
else:
    _Base = object

log = logging.getLogger("dpgate.ledger")

#: Queued outcome rows kept to be written again after a ledger outage (each holds its
#: released answer); beyond this many, an outcome stays pending (its charge stands).
MAX_UNRECORDED = 10_000


def _check_cost(cost: PrivacyCost) -> None:
    values = (cost.epsilon, cost.delta, cost.rho, cost.selection_delta)
    if not all(math.isfinite(v) and v >= 0 for v in values):
        raise UnsupportedCost("every component of a privacy cost must be finite and >= 0")


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


class Charging(_Base):
    """Reserve, quote, commit and refund: the charges and their outcomes."""

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
        try:
            result = self.write(charge, durable=True, savepoint=False)
        except LedgerUnavailable:
            # The caller says nothing was charged. If the connection failed after the
            # server committed (a COMMIT whose answer was lost), the charge is there,
            # without an outcome: it is refunded once the ledger is back.
            with self._unsettled_lock:
                if len(self._in_doubt) < MAX_UNRECORDED:
                    self._in_doubt.append(reservation_id)
            raise
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
        outcome = self._outcome_row(reservation.id, kind, release, reason)

        def settle(conn: Connection) -> None:
            if not outcome(conn):
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

    def _outcome_row(
        self,
        rid: str,
        kind: Literal["answered", "withheld", "refund"],
        release: dict[str, Any] | None,
        reason: str | None,
    ) -> Callable[[Connection], bool]:
        """The write of reservation ``rid``'s outcome row (a refund first locks its
        analyst and shares the cost rows); it returns whether the charge was there."""
        params = {
            "rid": rid,
            "kind": kind,
            "sign": -1.0 if kind == "refund" else 0.0,
            "release": None if release is None else json.dumps(release, default=str),
            "reason": reason,
            "now": self._now(),
        }

        def write(conn: Connection) -> bool:
            if kind == "refund":
                conn.execute(st.LOCK_ANALYST_OF_RESERVATION, {"rid": rid}).first()
                self._share_cost_rows(conn)
            return bool(st.SETTLE.run(conn, params))

        return write

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
        """How many queued outcome rows wait to be written again (their batch failed), and
        charges in doubt to settle (``reserve``)."""
        return len(self._unrecorded) + len(self._in_doubt)

    def record_unrecorded(self) -> int:
        """Write again the queued outcome rows whose batch failed, oldest first; stops at
        the first that fails again (the ledger is still away). Returns how many remain.
        A row written meanwhile (the reservation already has its outcome) is dropped.
        Then the charges in doubt are refunded where they were committed after all."""
        while True:
            with self._unsettled_lock:
                settle = self._unrecorded[0] if self._unrecorded else None
            if settle is None:
                return self._refund_in_doubt()
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

    def _refund_in_doubt(self) -> int:
        """Refund each charge in doubt that the ledger holds without an outcome (its
        request was told nothing was charged, and nothing ran); one that is not there
        was never committed. Stops at the first failure; returns how many remain."""
        while True:
            with self._unsettled_lock:
                if not self._in_doubt:
                    return 0
                rid = self._in_doubt[0]
            refund = self._outcome_row(
                rid, "refund", None, "the ledger failed as the charge was written: nothing ran"
            )
            try:
                if self.write(refund, durable=True, savepoint=False):
                    log.warning("charge %s (in doubt) refunded", rid)
            except sa.exc.IntegrityError:
                pass  # it has its outcome already
            except Exception:  # still away: keep it for the next try
                with self._unsettled_lock:
                    return len(self._in_doubt)
            with self._unsettled_lock:
                if self._in_doubt and self._in_doubt[0] == rid:
                    self._in_doubt.popleft()

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
