"""Privacy budgets: the accountants (basic composition, zCDP, both), budget periods and the
durable ledger.

``from budget import Ledger, BudgetExhausted, …``. Nothing here knows HTTP or SQL text;
see docs/accounting.md for the composition rules and their guarantees.
"""

from budget.accountants import (
    COMPOSITIONS,
    DEFAULT_SELECTION_SHARE,
    SLACK,
    Accountant,
    Accounting,
    CombinedFilter,
    CompositionName,
    PureFilter,
    Spent,
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
from budget.ledger import Ledger
from budget.periods import PERIODS, Period
from budget.principals import GLOBAL_NAME
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
    HistoryOutcome,
    Lookup,
    Outcome,
    Quote,
    Refusal,
    ReleaseEntry,
    Reservation,
)
from budget.schema import SCHEMA_VERSION, SchemaTooNew

__all__ = [
    "ADMIN_ROLES",
    "COMPOSITIONS",
    "DEFAULT_SELECTION_SHARE",
    "GLOBAL_NAME",
    "PERIODS",
    "SCHEMA_VERSION",
    "SLACK",
    "Accountant",
    "Accounting",
    "AdminCaller",
    "AdminPrincipal",
    "AdminRole",
    "Analyst",
    "AnalystDisabled",
    "AnalystExists",
    "AuditEntry",
    "BudgetExhausted",
    "BudgetStatus",
    "CacheProbe",
    "Charge",
    "CombinedFilter",
    "CompositionName",
    "HistoryEntry",
    "HistoryOutcome",
    "Ledger",
    "LedgerError",
    "LedgerUnavailable",
    "Lookup",
    "Outcome",
    "Period",
    "PureFilter",
    "Quote",
    "Refusal",
    "ReleaseEntry",
    "Reservation",
    "ReservationSettled",
    "SchemaTooNew",
    "Spent",
    "UnknownAnalyst",
    "UnsupportedCost",
    "ZcdpFilter",
    "accountant",
    "cks_epsilon",
    "zcdp_rho_budget",
]
