"""One analyst's spend over time, from the ledger's history, as the accountant reports it.

Each charge that stands (``answered``, ``withheld`` or still ``pending``) adds its cost;
``refunded`` and ``refused`` queries cost nothing. After each charge the running total is
reported by the same accountant the ledger uses for ``budget_status``, so the last point
is the ε spent that ``GET /v1/admin/analysts/<name>`` shows (under zCDP that is the CKS
ε of Σρ, not Σε).
"""

from __future__ import annotations

from collections.abc import Iterable

from budget import HistoryEntry, accountant
from budget.accountants import CompositionName
from gateway.console.charts import SpendPoint
from mechanisms.types import PrivacyCost

STANDING = frozenset({"answered", "withheld", "pending"})


def spend_series(
    entries: Iterable[HistoryEntry],
    *,
    composition: CompositionName,
    epsilon: float,
    delta: float,
) -> list[SpendPoint]:
    """ε spent just after each standing charge, oldest first."""
    report = accountant(composition).report
    eps = dl = rho = sel = 0.0
    points = []
    for entry in sorted(entries, key=lambda e: e.created_at):
        if entry.outcome not in STANDING:
            continue
        c = entry.cost
        eps, dl, rho, sel = eps + c.epsilon, dl + c.delta, rho + c.rho, sel + c.selection_delta
        spent = report(epsilon, delta, PrivacyCost(eps, dl, rho, sel)).epsilon_spent
        points.append(
            SpendPoint(
                at=entry.created_at.isoformat(),
                epsilon_spent=spent,
                query_epsilon=c.epsilon,
                outcome=entry.outcome,
            )
        )
    return points
