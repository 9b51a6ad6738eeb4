"""The charge (refund) oracle: whether a query stayed charged must not depend on the rows.

Before issue 11 a query whose statement failed at run time was refunded ("nothing was
charged"), so the analyst's own budget told the secret bit as plainly as the status did.
The attacker here sends the issue's ABS overflow queries (one per target, one analyst per
query) and ignores the responses: it reads its budgets (GET /v1/budget: did the count of
charges go up?) and guesses bit 1 for every query that was refunded or never charged; its
history (GET /v1/queries) must tell the same story.

Every attack in this package scores the same charge rule on its own queries
(kit.assert_attack_fails) — the PostgreSQL division by zero and failing casts, the
timeouts among them — so the refund channel is measured for every failure tried, on both
backends, without sending the queries twice.

Measured recovery of the 256 bits:
- before issue 11 (commit 2efccd4): 100% on SQLite; 100% on PostgreSQL with every
  runtime error tried — the queries that hit the secret row were refunded, the others
  charged;
- after (commit 5b62263): the overflow is refused by the analyzer, for free (53%, the
  share of ones); on PostgreSQL, the queries that reach the database are all charged
  (47%, the share of zeros), timeouts included.
"""

from __future__ import annotations

import pytest

from tests.attacks import test_error_oracle_sqlite as on_sqlite
from tests.attacks.kit import Deployment, assert_attack_fails, attack_once, charge_guesses

pytestmark = pytest.mark.slow


def test_refunds_reveal_nothing(sqlite_gateway: Deployment) -> None:
    variant = "abs_min_int_literal"
    run = attack_once(
        sqlite_gateway, f"sqlite-{variant}", on_sqlite.queries(variant, sqlite_gateway)
    )
    assert_attack_fails(run, {"refund": charge_guesses(run)})
