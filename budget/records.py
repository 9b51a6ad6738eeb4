"""Frozen values the ledger hands out: analysts, budget statuses, reservations, entries."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from datetime import datetime
from typing import Any, Literal

from budget.accountants import Basis, CompositionName
from budget.periods import Period
from mechanisms.types import PrivacyCost

Outcome = Literal["answered", "withheld"]
HistoryOutcome = Literal["pending", "answered", "withheld", "refunded", "refused"]


@dataclass(frozen=True)
class Analyst:
    """An authenticated analyst and their budget (what ``authenticate`` returns)."""

    name: str
    disabled: bool
    epsilon: float
    delta: float
    period: Period = "none"


@dataclass(frozen=True)
class BudgetStatus:
    """One budget (an analyst's, or the global one) as its accountant reports it.

    ``epsilon``/``delta`` are the totals, renewed every ``period`` (``none``: never);
    every figure counts the charges of the current period only, which ends at
    ``period_ends_at`` (``None`` without a period). ``epsilon_spent`` is the smaller of
    the totals that apply (``basis``): ``epsilon_spent_basic`` (Σε, while no Gaussian
    query was charged; else ``math.inf``) and ``epsilon_spent_zcdp`` (the
    Canonne–Kamath–Steinke ε of Σρ at the conversion δ). ``delta_spent`` is the
    partition-selection δ, of ``selection_delta_budget``. ``max_next_laplace_epsilon`` is
    the largest ε a next Laplace query could still use. ``queries`` counts charges not
    refunded.
    """

    name: str
    disabled: bool
    composition: CompositionName
    epsilon: float
    delta: float
    epsilon_spent: float
    delta_spent: float
    epsilon_remaining: float
    delta_remaining: float
    rho_budget: float
    rho_spent: float
    rho_remaining: float
    max_next_laplace_epsilon: float
    queries: int
    period: Period = "none"
    period_started_at: datetime | None = None
    period_ends_at: datetime | None = None
    basis: Basis = "basic"
    epsilon_spent_basic: float = math.inf
    epsilon_spent_zcdp: float = math.inf
    selection_delta_budget: float = 0.0

    def to_json(self) -> dict[str, Any]:
        """A JSON-safe dict (a non-finite number becomes ``None``, a time ISO 8601 UTC)."""
        # Field by field, not ``asdict``: every field is a scalar or a time, and asdict's
        # deep copy of each was most of the cost of every response's budget.
        return {f.name: _json_value(getattr(self, f.name)) for f in _STATUS_FIELDS}


_STATUS_FIELDS = fields(BudgetStatus)


@dataclass(frozen=True)
class Reservation:
    """A charge appended to the ledger: durably spent until refunded.

    ``budget`` is the analyst's status right after the charge (what the response shows).
    """

    id: str
    analyst: str
    cost: PrivacyCost
    mechanism: str
    query_key: str
    data_version: str
    created_at: datetime
    budget: BudgetStatus
    charge: Charge | None = None


@dataclass(frozen=True)
class Charge:
    """What one query adds to a budget's figures, in the budget's own units: the rise of
    ``epsilon_spent`` and ``delta_spent`` (ε spent is the smaller of two totals, so a
    query can cost less ε here than the ε it was calibrated for; ``math.inf`` if the
    query would leave no total that applies)."""

    epsilon: float
    delta: float

    def to_json(self) -> dict[str, Any]:
        return {"epsilon": _json_number(self.epsilon), "delta": _json_number(self.delta)}


@dataclass(frozen=True)
class Quote:
    """What one query would cost an analyst, before spending (``Ledger.quote``).

    ``would_fit``: the analyst's budget admits it now (the global budget aside);
    ``charge``: what it would add to their figures; ``queries_remaining``: how many such
    queries, one after the other, their budget still admits (this one included);
    ``budget``: their status now.
    """

    would_fit: bool
    charge: Charge
    queries_remaining: int
    budget: BudgetStatus


@dataclass(frozen=True)
class Refusal:
    """A query the auditor refused: why, and the earlier queries it would combine with.
    ``reservation_id`` is set when the refusal came after execution (charged)."""

    query_key: str
    sql: str
    reason: str
    combined_with: tuple[str, ...]
    reservation_id: str | None
    created_at: datetime


@dataclass(frozen=True)
class HistoryEntry:
    """One query of an analyst with its outcome (``GET /v1/queries``): every charged
    query, and every query the auditor refused before spending (``refused``, cost 0)."""

    reservation_id: str
    sql: str
    mechanism: str
    cost: PrivacyCost
    outcome: HistoryOutcome
    release: dict[str, Any] | None
    reason: str | None
    created_at: datetime
    settled_at: datetime | None

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "query_id": self.reservation_id,
            "sql": self.sql,
            "mechanism": self.mechanism,
            "cost": {k: _json_number(v) for k, v in asdict(self.cost).items()},
            "outcome": self.outcome,
            "release": self.release,
            "reason": self.reason,
            "created_at": self.created_at.isoformat(),
            "settled_at": self.settled_at.isoformat() if self.settled_at else None,
        }


@dataclass(frozen=True)
class ReleaseEntry:
    """An answered or withheld query, in ledger order (what the auditor rebuilds from).

    ``release`` is ``None`` for a withheld query unless the gateway recorded something.
    ``seq`` is the entry's position in the ledger (increasing): pass the last one seen as
    ``releases(..., after=seq)`` to fetch only newer entries.
    """

    reservation_id: str
    analyst: str
    query_key: str
    sql: str
    data_version: str
    outcome: Outcome
    release: dict[str, Any] | None
    cost: PrivacyCost
    created_at: datetime
    seq: int = 0


AdminRole = Literal["admin", "auditor"]
ADMIN_ROLES: tuple[AdminRole, ...] = ("admin", "auditor")


@dataclass(frozen=True)
class AdminPrincipal:
    """A named admin: ``admin`` may do everything, ``auditor`` only read."""

    name: str
    role: AdminRole
    disabled: bool = False

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return asdict(self)


@dataclass(frozen=True)
class AdminCaller:
    """Who makes an admin change, for its audit-log row (written by the ledger in the
    change's own transaction, with the action and its parameters — never a key): an
    admin principal's name, or the CLI's OS user / ``--actor``; the request it came with
    (an HTTP request id and ``METHOD path``, or ``cli …``); the status to record."""

    actor: str
    request_id: str
    endpoint: str
    status: int = 200


@dataclass(frozen=True)
class AuditEntry:
    """One request as the audit log recorded it, answered or not."""

    id: int
    request_id: str
    analyst: str | None
    endpoint: str
    sql: str | None
    outcome: str
    error_code: str | None
    status: int
    created_at: datetime
    # Who acted (admin principal, CLI user, analyst), the admin action and its parameters
    # (never a key), and the row's place in the hash chain (budget/audit_chain.py).
    actor: str | None = None
    action: str | None = None
    params: dict[str, Any] | None = None
    seq: int | None = None
    hash: str | None = None

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        d = asdict(self)
        d["created_at"] = self.created_at.isoformat()
        return d


# Budget figures in JSON carry 12 significant digits: sums of floats such as
# 0.7 + 0.7 = 1.4000000000000001 read as the 1.4 that was spent; the ledger keeps the
# exact figures, and 12 digits are far below any budget's meaningful precision.
JSON_DIGITS = 12


def _json_number(value: Any) -> Any:
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        return float(f"{value:.{JSON_DIGITS}g}")
    return value


def _json_value(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    return _json_number(value)


@dataclass(frozen=True)
class CacheProbe:
    """Which stored release a request would reuse: its key, data version, and whether a
    release of any analyst counts (cache scope ``dataset``) or only the caller's own."""

    query_key: str
    data_version: str
    any_analyst: bool = False


@dataclass(frozen=True)
class Lookup:
    """What one read of the ledger says about a request: who holds the key (``None``:
    nobody), the stored release it may reuse, and — with a release — the caller's budget
    (the response to a cache hit shows it)."""

    analyst: Analyst | None
    release: dict[str, Any] | None = None
    budget: BudgetStatus | None = None
    access: Any = None  # budget.grants.StoredAccess, when asked for
