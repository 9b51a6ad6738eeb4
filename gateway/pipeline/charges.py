"""Stage: charges — reserve a query's cost, record its outcome, refund it; and the one
mapping of the ledger's errors to the gateway's.

Invariant (docs/design.md, 1 and 2): a cost is durably reserved before the statement is
sent; only a failure to reach the database at all is refunded; any outcome after the
statement was sent is recorded against the charge, which stays.

A ledger failure tells the truth about the charge (``detail.charged``): before the
charge is written nothing was charged; after it, the charge stands. An outcome the
ledger could not take (answered-but-not-sent, withheld, a refund) is kept here and
written by the next ledger call that succeeds (``settle_pending``): until then the
charge shows as ``pending`` in the analyst's history, spent — the side of privacy.

An outcome is recorded before its query's release moment (the statement may finish
early, and how early can depend on the rows): ``hold`` stamps the moment into the
record (``visible_at``, wall clock), and until then the answer cache does not serve it
(``gateway.pipeline.answer_cache``) and the history shows the charge ``pending``
(tests/attacks/test_in_flight_oracle.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import budget
from budget import Reservation
from gateway.core.errors import (
    BudgetExhausted,
    Conflict,
    Forbidden,
    GatewayError,
    InvalidPrivacyParameters,
    InvalidRequest,
    LedgerUnavailable,
    Unauthenticated,
)
from gateway.core.plan import QueryRequest
from gateway.pipeline.release import RECORD_ONLY, VISIBLE_AT
from mechanisms import PrivacyCost

log = logging.getLogger("dpgate.charges")

#: Outcomes kept for a ledger that is back, at most (beyond: logged, the charge stays
#: pending in the ledger — spent, which errs on the side of privacy).
MAX_PENDING_SETTLEMENTS = 10_000

NOT_CHARGED_MESSAGE = "the ledger database is unavailable; nothing was charged or released"
CHARGED_MESSAGE = (
    "the ledger database became unavailable after this query was charged; nothing was "
    "released, and the charge's outcome is recorded when the ledger is back (a refund "
    "only if the statement never reached the protected database)"
)


def visible(record: dict[str, Any] | None) -> bool:
    """Whether a recorded outcome has reached its query's release moment (``hold``)."""
    moment = None if record is None else record.get(VISIBLE_AT)
    return not isinstance(moment, int | float) or moment <= time.time()


def charged_ledger_failure() -> LedgerUnavailable:
    """The error of a ledger failure after the request's charge was written."""
    return LedgerUnavailable(CHARGED_MESSAGE, charged=True)


@contextmanager
def uncharged_ledger_failures() -> Iterator[None]:
    """Report the ledger's unavailability — and nothing else — as the error saying that
    nothing was charged: for code that runs before a charge (the audit scope lock)."""
    try:
        yield
    except budget.LedgerUnavailable:
        raise LedgerUnavailable(NOT_CHARGED_MESSAGE, charged=False) from None


@contextmanager
def ledger_errors(*, unknown_analyst: type[GatewayError] = Unauthenticated) -> Iterator[None]:
    """Report the ledger's errors as the gateway's: one envelope, stable codes.

    ``unknown_analyst``: what a missing analyst means to the caller — to an analyst's own
    request, that the key no longer names anyone (``Unauthenticated``); to an admin
    naming one, ``NotFound``. A ledger failure here says nothing was charged: a charge's
    own failures are reported by ``Charges`` (``charged_ledger_failure``).
    """
    try:
        yield
    except budget.BudgetExhausted as e:
        raise BudgetExhausted(str(e), **e.detail()) from None
    except budget.UnsupportedCost as e:
        raise InvalidPrivacyParameters(str(e)) from None
    except budget.AnalystDisabled as e:
        raise Forbidden(str(e)) from None
    except budget.UnknownAnalyst as e:
        raise unknown_analyst(str(e)) from None
    except budget.AnalystExists as e:
        raise Conflict(str(e)) from None
    except budget.LedgerUnavailable:
        raise LedgerUnavailable(NOT_CHARGED_MESSAGE, charged=False) from None
    except ValueError as e:  # an admin's invalid budget figures
        raise InvalidRequest(str(e)) from None


class Charges:
    """The ledger as the pipeline uses it: one method per thing that happens to a charge."""

    def __init__(self, ledger: budget.Ledger, data_version: str) -> None:
        self.ledger = ledger
        self.data_version = data_version
        self._pending: deque[tuple[str, Callable[[], None]]] = deque()
        self._pending_lock = threading.Lock()
        self._held: dict[str, float] = {}  # reservation id → its release moment (wall clock)

    def hold(self, reservation: Reservation, release_at: float | None) -> None:
        """Keep the outcome of ``reservation`` out of sight until ``release_at`` (its
        release moment, ``time.monotonic()``; ``None``: no release moment): ``answered``
        and ``withheld`` stamp it into the record as ``visible_at`` (wall clock, which
        other workers sharing the ledger read too)."""
        if release_at is not None:
            with self._pending_lock:
                self._held[reservation.id] = time.time() + (release_at - time.monotonic())

    def _stamped(self, reservation: Reservation, record: dict[str, Any]) -> dict[str, Any]:
        with self._pending_lock:
            visible_at = self._held.pop(reservation.id, None)
        return record if visible_at is None else {**record, VISIBLE_AT: visible_at}

    def settle_pending(self) -> int:
        """Write the outcomes a failed ledger could not take — the ledger's own queued
        rows whose batch failed first, then this pipeline's — oldest first; stops at the
        first that fails again (the ledger is still away). Returns how many remain."""
        if self.ledger.unrecorded and self.ledger.record_unrecorded():
            return len(self._pending) + self.ledger.unrecorded
        while True:
            with self._pending_lock:
                if not self._pending:
                    return 0
                reservation_id, write = self._pending[0]
            try:
                write()
            except budget.LedgerUnavailable:
                with self._pending_lock:
                    return len(self._pending)
            except budget.LedgerError as e:  # settled meanwhile, say: nothing to retry
                log.warning("outcome of %s not recorded: %s", reservation_id, type(e).__name__)
            else:
                log.info("outcome of %s recorded after a ledger outage", reservation_id)
            with self._pending_lock:
                if self._pending and self._pending[0][1] is write:
                    self._pending.popleft()

    def _settle(self, reservation: Reservation, write: Callable[[], None]) -> None:
        """Write an outcome of a charged request; if the ledger fails, keep it for
        ``settle_pending`` and raise the error that says the request was charged."""
        try:
            write()
        except budget.LedgerUnavailable:
            with self._pending_lock:
                if len(self._pending) < MAX_PENDING_SETTLEMENTS:
                    self._pending.append((reservation.id, write))
                else:
                    log.error("outcome of %s dropped: too many pending", reservation.id)
            raise charged_ledger_failure() from None
        except budget.LedgerError:
            with ledger_errors():
                raise

    def reserve(
        self, analyst: str, request: QueryRequest, cost: PrivacyCost, query_key: str
    ) -> Reservation:
        """Durably charge ``cost`` (raises ``BudgetExhausted`` and nothing is charged)."""
        if self._pending or self.ledger.unrecorded:
            self.settle_pending()
        with ledger_errors():
            return self.ledger.reserve(
                analyst,
                cost,
                query_key=query_key,
                sql=request.sql,
                mechanism=request.mechanism,
                data_version=self.data_version,
            )

    def answered(
        self, reservation: Reservation, record: dict[str, Any], *, wait: bool = True
    ) -> None:
        """Record the released answer (what the cache and the auditor's replay read).
        ``wait`` False: the row rides on the ledger writer's next batch, and the answer
        leaves without waiting for it (``budget.Ledger.commit``)."""
        record = self._stamped(reservation, record)
        try:
            self.ledger.commit(reservation, record, "answered", wait=wait)
        except budget.LedgerUnavailable:
            # Not sent: recorded as withheld once the ledger is back (the charge stays).
            self._settle(
                reservation,
                lambda: self.ledger.commit(
                    reservation,
                    {"withheld": True, "failed": True},
                    "withheld",
                    "the ledger failed before the answer was sent",
                ),
            )
        except budget.LedgerError:
            with ledger_errors():
                raise

    def withheld(self, reservation: Reservation, record: dict[str, Any], reason: str) -> None:
        """Record that nothing was released for this charge; it stays spent."""
        record = self._stamped(reservation, record)
        self._settle(
            reservation, lambda: self.ledger.commit(reservation, record, "withheld", reason)
        )

    def refund(self, reservation: Reservation, reason: str) -> None:
        """Give the charge back: the statement never reached the database."""
        self._stamped(reservation, {})
        self._settle(reservation, lambda: self.ledger.refund(reservation, reason))

    def history(self, analyst: str, *, limit: int) -> list[dict[str, Any]]:
        """The analyst's own charged and refused queries, oldest first, as JSON (what was
        recorded for the auditor stays out: it was never released as such)."""
        with ledger_errors():
            entries = self.ledger.history(analyst, limit=limit)
        out = []
        for e in entries:
            release = None
            outcome, reason = e.outcome, e.reason
            if not visible(e.release):  # before its release moment: as if in flight
                outcome, reason = "pending", None
            elif e.release is not None and e.outcome == "answered":
                release = {k: v for k, v in e.release.items() if k not in RECORD_ONLY}
            out.append(
                {
                    "query_id": e.reservation_id,
                    "sql": e.sql,
                    "mechanism": e.mechanism,
                    "cost": {
                        "epsilon": e.cost.epsilon,
                        "delta": e.cost.delta,
                        "rho": e.cost.rho,
                        "selection_delta": e.cost.selection_delta,
                    },
                    "outcome": outcome,
                    "reason": reason,
                    "release": release,
                    "created_at": e.created_at.isoformat(),
                }
            )
        return out

    def status(self, analyst: str) -> budget.BudgetStatus:
        with ledger_errors():
            return self.ledger.budget_status(analyst)

    def quote(self, analyst: str, cost: PrivacyCost, mechanism: str) -> budget.Quote:
        """What ``cost`` would do to the analyst's own budget (the global cap aside):
        whether it fits, its charge in budget units, how many such queries remain."""
        with ledger_errors():
            return self.ledger.quote(analyst, cost, mechanism)
