"""Stage: answer cache — an identical request gets the identical release, free
(docs/design.md, invariant 7).

The cache is the ledger itself: the release recorded with a charge, found by the
request's key (canonical SQL, ε, δ, mechanism, data version) for the same analyst, or
for anyone with ``cache.scope: global``. On the HTTP path the lookup rides on the
request's one ledger read (``identity.identify``); in-process callers use ``lookup``.
"""

from __future__ import annotations

from typing import Any, Literal

import budget
from gateway.charges import ledger_errors
from gateway.planning import PlannedQuery
from gateway.release import Release

RECORD_ONLY = ("audit_cells", "audit_flags")  # recorded for the auditor, never released


class AnswerCache:
    def __init__(
        self, ledger: budget.Ledger, scope: Literal["analyst", "global"], data_version: str
    ) -> None:
        self.ledger = ledger
        self.any_analyst = scope != "analyst"
        self.data_version = data_version

    def probe(self, planned: PlannedQuery) -> budget.CacheProbe:
        """What to look for in the ledger for this request."""
        return budget.CacheProbe(planned.key, self.data_version, self.any_analyst)

    def hit(self, stored: dict[str, Any], status: budget.BudgetStatus) -> Release:
        """The stored release, as a cached answer with the caller's budget."""
        answer = {k: v for k, v in stored.items() if k not in RECORD_ONLY}
        return Release.from_answer_json(answer, cached=True, budget=status)

    def lookup(self, analyst: str, planned: PlannedQuery) -> Release | None:
        """The release an identical earlier request of ``analyst`` got, if any."""
        with ledger_errors():
            stored = self.ledger.find_release(
                planned.key, None if self.any_analyst else analyst, self.data_version
            )
            if stored is None:
                return None
            status = self.ledger.budget_status(analyst)
        return self.hit(stored, status)
