"""Privacy budgets: the accountants (zCDP and pure composition) and the durable ledger.

``from budget import Ledger, BudgetExhausted, …``. Nothing here knows HTTP or SQL text;
see docs/accounting.md for the composition rules and their guarantees.
"""

from budget.accountants import (
    SLACK,
    Accountant,
    Accounting,
    CompositionName,
    PureFilter,
    ZcdpFilter,
    accountant,
    cks_epsilon,
    zcdp_rho_budget,
)
from budget.errors import (
    AnalystDisabled,
    AnalystExists,
    BudgetExhausted,
    LedgerError,
    LedgerUnavailable,
    ReservationSettled,
    UnknownAnalyst,
    UnsupportedCost,
)
from budget.ledger import GLOBAL_NAME, Ledger
from budget.records import (
    Analyst,
    AuditEntry,
    BudgetStatus,
    CacheProbe,
    HistoryEntry,
    HistoryOutcome,
    Lookup,
    Outcome,
    Refusal,
    ReleaseEntry,
    Reservation,
)
from budget.schema import SCHEMA_VERSION, SchemaTooNew

__all__ = [
    "GLOBAL_NAME",
    "SCHEMA_VERSION",
    "SLACK",
    "Accountant",
    "Accounting",
    "Analyst",
    "AnalystDisabled",
    "AnalystExists",
    "AuditEntry",
    "BudgetExhausted",
    "BudgetStatus",
    "CacheProbe",
    "CompositionName",
    "HistoryEntry",
    "HistoryOutcome",
    "Ledger",
    "LedgerError",
    "LedgerUnavailable",
    "Lookup",
    "Outcome",
    "PureFilter",
    "Refusal",
    "ReleaseEntry",
    "Reservation",
    "ReservationSettled",
    "SchemaTooNew",
    "UnknownAnalyst",
    "UnsupportedCost",
    "ZcdpFilter",
    "accountant",
    "cks_epsilon",
    "zcdp_rho_budget",
]
