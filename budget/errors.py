"""Errors the ledger raises.

::

    LedgerError                    root of everything budget/ raises on purpose
    ├── BudgetExhausted            the accountant refuses the cost (analyst or global budget)
    ├── LedgerUnavailable          the ledger database cannot be reached or answered in time
    ├── UnknownAnalyst             no analyst of that name
    ├── AnalystExists              create_analyst with a name already taken
    ├── AnalystDisabled            reserve for an analyst an admin has disabled
    ├── ReservationSettled         commit/refund of a reservation that already has an outcome
    └── UnsupportedCost            a cost this composition cannot account (also a ValueError)

``BudgetExhausted`` says what remains (never anything read from protected rows); the
gateway maps these to its HTTP error codes (``budget_exhausted`` 403,
``ledger_unavailable`` 503, ``forbidden`` 403, ...). Invalid arguments (a negative budget,
a malformed analyst name) raise ``ValueError``.
"""

from __future__ import annotations


class LedgerError(Exception):
    """Root of the errors the ledger raises on purpose."""


class BudgetExhausted(LedgerError):
    """The accountant refuses the cost: admitting it would overspend a budget.

    ``scope`` is ``"analyst"`` or ``"global"``; ``remaining_epsilon`` /
    ``remaining_delta`` / ``max_next_laplace_epsilon`` describe what is left in that scope;
    ``period_ends_at`` (ISO 8601 UTC) is when that budget renews, ``None`` if never.
    """

    def __init__(
        self,
        message: str,
        *,
        scope: str,
        remaining_epsilon: float,
        remaining_delta: float,
        max_next_laplace_epsilon: float,
        period_ends_at: str | None = None,
    ) -> None:
        super().__init__(message)
        self.scope = scope
        self.remaining_epsilon = remaining_epsilon
        self.remaining_delta = remaining_delta
        self.max_next_laplace_epsilon = max_next_laplace_epsilon
        self.period_ends_at = period_ends_at

    def detail(self) -> dict[str, float | str | None]:
        """A JSON-ready summary for the error envelope's ``detail``."""
        return {
            "scope": self.scope,
            "epsilon_remaining": self.remaining_epsilon,
            "delta_remaining": self.remaining_delta,
            "max_next_laplace_epsilon": self.max_next_laplace_epsilon,
            "period_ends_at": self.period_ends_at,
        }


class LedgerUnavailable(LedgerError):
    """The ledger database failed (connection refused, lock timeout, ...): nothing was charged
    unless the operation's transaction had committed."""


class UnknownAnalyst(LedgerError):
    """No analyst of that name exists."""


class AnalystExists(LedgerError):
    """An analyst of that name already exists."""


class AnalystDisabled(LedgerError):
    """The analyst is disabled: nothing may be charged to (or released for) them."""


class ReservationSettled(LedgerError):
    """The reservation already has its outcome (answered, withheld or refunded)."""


class UnsupportedCost(LedgerError, ValueError):
    """The cost cannot be accounted under this composition (a Gaussian cost under ``pure``,
    or a negative / non-finite cost)."""
