"""The timeout oracle: the secret row's costly branch pushes a statement past the timeout.

The admin set a short `database.statement_timeout_ms` (50 ms: a legitimate choice). A
costly branch the analyzer accepts in 20,000 characters (the costliest, or a shorter one
within a factor 3 of its cost) is evaluated for enough rows of the 2,000-person table to
take about that long: the attacker pads each query with rows it knows nothing secret
about (`score < S`, the target's own row excluded) that evaluate the branch too
(kit.padded_timeout_attack):

    SELECT COUNT(*) FROM people
    WHERE CASE WHEN (tag = 't017' AND secret = 1) OR (tag <> 't017' AND score < S)
               THEN <costly, false> ELSE FALSE END

and tunes S, a priori and from control queries only, so that the padding alone finishes
in time while the padding plus one more evaluation of the branch does not. It finds the
edge, the smallest S of a doubling ladder at which the padding alone (`secret > 1`, true
for nobody, in place of `secret = 1`) mostly times out, with 12 queries in flight as in
the attack itself (staggered over the release deadline, so that their statements do not
all compete for the CPU at once); then it tries paddings below the edge with 6 controls
`secret < 2` (true for everybody) and 6 controls `secret > 1` each, alternating, and
keeps the one whose controls differ most. A target's bit is then guessed 1 when its query
fails (status) or was not left charged (charge).

Measured recovery of the 256 bits:
- before issue 11 (commit 2efccd4): 99.6-100% by status and by charge (one evaluation of an
  uncapped 10 KB LIKE outlasts the timeout; a timeout was a refunded 503);
- after (commit 5b62263): 48-54% by status, 47% by charge (every failure stays charged).
  One row's share of the statement is about 45 µs, far below the jitter of a loaded
  machine.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.attacks.kit import (
    PEOPLE,
    Deployment,
    assert_attack_fails,
    padded_timeout_attack,
    shut_down,
    start_deployment,
    write_sqlite,
)

pytestmark = [pytest.mark.slow, pytest.mark.timing]

TIMEOUT_MS = 50


@pytest.fixture(scope="module")
def timeout_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    root = tmp_path_factory.mktemp("attack-timeout")
    write_sqlite(root / "people.db", PEOPLE)
    deployment = start_deployment(
        root, "sqlite:///people.db", "sqlite-timeout", statement_timeout_ms=TIMEOUT_MS
    )
    yield deployment
    shut_down(deployment)


def test_the_statement_timeout_reveals_nothing(timeout_gateway: Deployment) -> None:
    run = padded_timeout_attack(timeout_gateway, "sqlite-timeout-oracle")
    assert_attack_fails(run)
