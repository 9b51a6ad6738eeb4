"""Release: what dpgate sends back for one answered query, as a frozen value.

A release is built from noisy values only. It is what the ledger records, what the cache
returns for an identical request, and what the HTTP layer serialises.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from budget import BudgetStatus, Charge
from gateway.pipeline.planning import PlannedQuery

# Parts of a response that belong to the request, never to the answer it shares.
_PER_REQUEST = frozenset({"ok", "cached", "budget", "charge"})
# Parts of a ledger record never released as such: the auditor's cells and flags, and
# the uncut answer (every row HAVING kept, values as drawn) later requests are cut from.
RECORD_ONLY = ("audit_cells", "audit_flags", "uncut", "visible_at")
#: The record's release moment (wall clock): its outcome is shown from then on only
#: (``gateway.pipeline.charges.Charges.hold``).
VISIBLE_AT = "visible_at"


@dataclass(frozen=True)
class ColumnInfo:
    name: str
    type: str


@dataclass(frozen=True)
class PrivacySpent:
    """What a query was calibrated for and costs (the ``privacy`` part of a response)."""

    mechanism: str
    epsilon: float
    delta: float
    rho: float
    selection_delta: float

    def to_json(self) -> dict[str, Any]:
        # 12 significant digits, as the budget's figures (budget.records.JSON_DIGITS)
        return {
            "mechanism": self.mechanism,
            "epsilon": float(f"{self.epsilon:.12g}"),
            "delta": float(f"{self.delta:.12g}"),
            "rho": float(f"{self.rho:.12g}"),
            "selection_delta": float(f"{self.selection_delta:.12g}"),
        }

    @staticmethod
    def from_json(data: dict[str, Any]) -> PrivacySpent:
        return PrivacySpent(
            mechanism=str(data.get("mechanism", "none")),
            epsilon=float(data.get("epsilon", 0.0)),
            delta=float(data.get("delta", 0.0)),
            rho=float(data.get("rho", 0.0)),
            selection_delta=float(data.get("selection_delta", 0.0)),
        )


NO_PRIVACY_SPENT = PrivacySpent("none", 0.0, 0.0, 0.0, 0.0)


@dataclass(frozen=True)
class Release:
    """One answered query. ``answer`` is the JSON-ready body minus budget and cache flag."""

    query_id: str
    cached: bool
    columns: tuple[ColumnInfo, ...]
    rows: tuple[tuple[Any, ...], ...]
    accuracy: dict[str, dict[str, Any]]
    privacy: PrivacySpent
    budget: BudgetStatus
    extra: dict[str, Any] = field(default_factory=dict)
    # What this answer added to the analyst's budget figures (budget units), when it was
    # charged now; never part of the answer identical requests share.
    charge: Charge | None = None

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "ok": True,
            "query_id": self.query_id,
            "cached": self.cached,
            **self._answer(),
            "budget": self.budget.to_json(),
        }
        body.update(self.extra)
        if self.charge is not None:
            body["charge"] = self.charge.to_json()
        return body

    def answer_json(self) -> dict[str, Any]:
        """The part of the body that identical requests share (what the cache stores)."""
        shared = {k: v for k, v in self.extra.items() if k not in _PER_REQUEST}
        return {"query_id": self.query_id, **self._answer(), **shared}

    def _answer(self) -> dict[str, Any]:
        return {
            "columns": [{"name": c.name, "type": c.type} for c in self.columns],
            "rows": [list(r) for r in self.rows],
            "accuracy": self.accuracy,
            "privacy": self.privacy.to_json(),
        }

    @staticmethod
    def from_answer_json(answer: dict[str, Any], *, cached: bool, budget: BudgetStatus) -> Release:
        known = {"query_id", "columns", "rows", "accuracy", "privacy"}
        return Release(
            query_id=str(answer["query_id"]),
            cached=cached,
            columns=tuple(ColumnInfo(c["name"], c["type"]) for c in answer["columns"]),
            rows=tuple(tuple(r) for r in answer["rows"]),
            accuracy=dict(answer.get("accuracy") or {}),
            privacy=PrivacySpent.from_json(dict(answer.get("privacy") or {})),
            budget=budget,
            extra={k: v for k, v in answer.items() if k not in known},
        )


def privacy_spent(planned: PlannedQuery) -> PrivacySpent:
    """The ``privacy`` part of a response: what the query was calibrated for and costs."""
    request, cost = planned.request, planned.calibration.cost
    return PrivacySpent(
        mechanism=request.mechanism,
        epsilon=request.epsilon,
        delta=request.delta if request.mechanism == "gaussian" else 0.0,
        rho=cost.rho,
        selection_delta=cost.selection_delta,
    )
