"""One person, many rows: per-row cost caps alone do not cap one person's cost.

The analyzer caps what one row can cost, and `max_rows_per_unit` caps how many of a
person's rows count. Before commit 5b62263 the WHERE clause was evaluated on every row a
person has in the table, before the compiled SQL kept `max_rows_per_unit` of them: a person
with R rows cost R times the per-row cap. Tables of visits, orders or events routinely
hold many rows per person, and an index on a person's external identifier is routine too.

Here `people` has no key on `person_id`, an index on `tag`, 1,000 rows for each target
and one for everyone else; the admin set a short statement timeout (25 ms, a legitimate
choice for an indexed lookup). For each target the attacker sends (one analyst per query,
8 in flight)

    SELECT COUNT(*) FROM people WHERE tag = 't017'
                                  AND CASE WHEN secret = 1 THEN <costly, false> ELSE FALSE END

with the costliest branch the analyzer accepts in 2,000 characters (about 45 µs a row in
SQLite). Without a bound on the rows read per person, the index hands SQLite the target's
rows only: about 1 ms when the bit is 0, about 45 ms — past the timeout — when it is 1.
The bit is guessed from the status and the charge.

Measured recovery of the 256 bits:
- commit c313166 (issue 11's caps and deadline, no read bound): 100% by status, every
  run (93-100% under the load of a parallel test run). The padded attack of
  test_timeout_oracle did the same without an index: 65-68% with 300-500 rows a person on
  a quiet machine;
- commit 5b62263 (at most `max_rows_read_per_unit` = 10 rows read per person, chosen by a
  window over the whole table before the analyst's expressions): 53%, the share of ones.
  Every query times out, whatever the bit: the window sorts all 257,000 rows (about
  0.4 s) before the index can help — uniform, so nothing leaks, but a table of this size
  then needs a longer timeout and deadline to be usable.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator

import pytest

from tests.attacks.kit import (
    BRANCH_SQL,
    PEOPLE,
    Deployment,
    assert_attack_fails,
    attack,
    costliest_branch,
    shut_down,
    start_deployment,
    target_tags,
    write_sqlite,
)

pytestmark = pytest.mark.slow

ROWS = 1_000  # each target's rows in the table
TIMEOUT_MS = 25  # the admin's statement timeout
STREAMS = 8  # queries in flight: few, so that the gateway's own threads do not stall SQLite
QUERY = (
    "SELECT COUNT(*) FROM people WHERE tag = '{tag}' "
    "AND CASE WHEN {secret} THEN {branch} ELSE FALSE END"
)


@pytest.fixture(scope="module")
def many_rows_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    root = tmp_path_factory.mktemp("attack-rows-per-person")
    people = [p for p in PEOPLE for _ in range(ROWS if p.tag.startswith("t") else 1)]
    write_sqlite(root / "people.db", people, primary_key=False)
    db = sqlite3.connect(root / "people.db")
    db.execute("CREATE INDEX people_tag ON people (tag)")
    db.commit()
    db.close()
    deployment = start_deployment(
        root, "sqlite:///people.db", "sqlite-many-rows", statement_timeout_ms=TIMEOUT_MS
    )
    yield deployment
    shut_down(deployment)


def test_a_person_with_many_rows_reveals_nothing(many_rows_gateway: Deployment) -> None:
    deployment = many_rows_gateway
    key = deployment.analyst("many-rows")
    branch = costliest_branch(
        deployment,
        key,
        lambda b: QUERY.format(tag="t000", secret="secret = 1", branch=b),
        max_sql=BRANCH_SQL,
    )
    sqls = [QUERY.format(tag=tag, secret="secret = 1", branch=branch) for tag in target_tags()]
    assert deployment.ask(key, sqls[-1], dry_run=True).status == 200, "the attack is refused"
    run = attack(deployment, "sqlite-many-rows-per-person", sqls, streams=STREAMS)
    assert_attack_fails(run)
