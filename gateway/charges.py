"""Stage: charges — reserve a query's cost, record its outcome, refund it; and the one
mapping of the ledger's errors to the gateway's.

Invariant (docs/design.md, 1 and 2): a cost is durably reserved before the statement is
sent; only a failure to reach the database at all is refunded; any outcome after the
statement was sent is recorded against the charge, which stays.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import budget
from budget import Reservation
from gateway.errors import (
    BudgetExhausted,
    Conflict,
    Forbidden,
    GatewayError,
    InvalidPrivacyParameters,
    InvalidRequest,
    LedgerUnavailable,
    Unauthenticated,
)
from gateway.plan import QueryRequest
from gateway.release import RECORD_ONLY
from mechanisms import PrivacyCost


@contextmanager
def ledger_errors(*, unknown_analyst: type[GatewayError] = Unauthenticated) -> Iterator[None]:
    """Report the ledger's errors as the gateway's: one envelope, stable codes.

    ``unknown_analyst``: what a missing analyst means to the caller — to an analyst's own
    request, that the key no longer names anyone (``Unauthenticated``); to an admin
    naming one, ``NotFound``.
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
        raise LedgerUnavailable(
            "the ledger database is unavailable; nothing was charged or released"
        ) from None
    except ValueError as e:  # an admin's invalid budget figures
        raise InvalidRequest(str(e)) from None


class Charges:
    """The ledger as the pipeline uses it: one method per thing that happens to a charge."""

    def __init__(self, ledger: budget.Ledger, data_version: str) -> None:
        self.ledger = ledger
        self.data_version = data_version

    def reserve(
        self, analyst: str, request: QueryRequest, cost: PrivacyCost, query_key: str
    ) -> Reservation:
        """Durably charge ``cost`` (raises ``BudgetExhausted`` and nothing is charged)."""
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
        with ledger_errors():
            self.ledger.commit(reservation, record, "answered", wait=wait)

    def withheld(self, reservation: Reservation, record: dict[str, Any], reason: str) -> None:
        """Record that nothing was released for this charge; it stays spent."""
        with ledger_errors():
            self.ledger.commit(reservation, record, "withheld", reason)

    def refund(self, reservation: Reservation, reason: str) -> None:
        """Give the charge back: the statement never reached the database."""
        with ledger_errors():
            self.ledger.refund(reservation, reason)

    def history(self, analyst: str, *, limit: int) -> list[dict[str, Any]]:
        """The analyst's own charged and refused queries, oldest first, as JSON (what was
        recorded for the auditor stays out: it was never released as such)."""
        with ledger_errors():
            entries = self.ledger.history(analyst, limit=limit)
        out = []
        for e in entries:
            release = None
            if e.release is not None and e.outcome == "answered":
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
                    "outcome": e.outcome,
                    "reason": e.reason,
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
