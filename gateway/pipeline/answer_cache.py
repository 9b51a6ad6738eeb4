"""Stage: answer cache — an identical request gets the identical release, free
(docs/design.md, invariant 7).

The cache is the ledger itself: the release recorded with a charge, found by the
request's key (canonical SQL, ε, δ, mechanism, data version) for the same analyst, or
for anyone with ``cache.scope: global``. On the HTTP path the lookup rides on the
request's one ledger read (``identity.identify``); in-process callers use ``lookup``.

A release is recorded before its query's release moment; until that moment it is no
hit (``usable``): whether it is there yet depends on when the statement finished.
"""

from __future__ import annotations

from typing import Any, Literal

import budget
from gateway.pipeline.charges import ledger_errors, visible
from gateway.pipeline.planning import PlannedQuery
from gateway.pipeline.postprocess import Answer, shown
from gateway.pipeline.release import RECORD_ONLY, Release


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

    @staticmethod
    def usable(stored: dict[str, Any] | None) -> bool:
        """Whether a stored release may be served: there, and past its release moment
        (``gateway.pipeline.charges.Charges.hold``)."""
        return stored is not None and visible(stored)

    def hit(
        self, planned: PlannedQuery, stored: dict[str, Any], status: budget.BudgetStatus
    ) -> Release:
        """The stored release, as a cached answer with the caller's budget, cut and
        clamped for this request (its LIMIT, OFFSET and ``raw`` may differ from the
        request that paid for it: ``gateway.pipeline.postprocess.present``)."""
        answer = {k: v for k, v in stored.items() if k not in RECORD_ONLY}
        release = Release.from_answer_json(answer, cached=True, budget=status)
        uncut = stored.get("uncut")
        if isinstance(uncut, dict):
            rows = tuple(tuple(r) for r in uncut["rows"])
            return shown(planned, release, Answer(rows, dict(uncut["accuracy"])))
        # recorded before uncut answers were kept: the rows as released then
        return shown(planned, release, Answer(release.rows, release.accuracy))

    def lookup(self, analyst: str, planned: PlannedQuery) -> Release | None:
        """The release an identical earlier request of ``analyst`` got, if any."""
        with ledger_errors():
            stored = self.ledger.find_release(
                planned.key, None if self.any_analyst else analyst, self.data_version
            )
            if stored is None or not self.usable(stored):
                return None
            status = self.ledger.budget_status(analyst)
        return self.hit(planned, stored, status)
