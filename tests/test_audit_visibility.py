"""The auditor's view at a moment (gateway/audit/auditor.py, ``remember(visible_at=…)``).

An answer is remembered as soon as its post-audit passes, before its release moment;
a pre-audit (or a dry run's prediction) decides at once on what was released by then,
and the post-audits, in ticket order, on everything (tests/attacks/test_in_flight_oracle.py
is the attack this closes, through the gateway).
"""

from __future__ import annotations

import time

import pytest
import yaml

from gateway.audit import AnsweredCell, AnsweredQuery, Auditor, CountNoise
from gateway.core.config import TableConfig, with_nullability
from gateway.core.config_load import parse_config
from gateway.core.plan import QueryPlan
from gateway.demo.hospital import NULLABLE, config_yaml
from gateway.sql.analyze import analyze

NOISE = CountNoise("laplace", 1.0)
CROHN = "SELECT COUNT(*) FROM patients WHERE disease = 'Crohn'"
CROHN_IN_ZIP = "SELECT COUNT(*) FROM patients WHERE disease = 'Crohn' AND zip = '1051'"


@pytest.fixture(scope="module")
def tables() -> dict[str, TableConfig]:
    cfg = parse_config(yaml.safe_load(config_yaml("demo.db", "ledger.db")))
    return with_nullability(cfg.tables, NULLABLE)


def plan(sql: str, tables: dict[str, TableConfig]) -> QueryPlan:
    p = analyze(sql, tables)
    assert isinstance(p, QueryPlan)
    return p


def answer(query_id: str, p: QueryPlan, count: float) -> AnsweredQuery:
    return AnsweredQuery(query_id, p, (AnsweredCell((), count, {}, NOISE),))


def test_a_pre_audit_sees_an_answer_from_its_release_moment_only(
    tables: dict[str, TableConfig],
) -> None:
    auditor = Auditor(tables, min_group_size=5)
    now = time.monotonic()
    released_at = now + 60
    # a known small group (3 Crohn patients, noisily): its subset is refused before
    # spending — but only once that answer is out
    auditor.remember("alice", answer("q1", plan(CROHN, tables), 3.2), visible_at=released_at)
    subset = plan(CROHN_IN_ZIP, tables)
    assert auditor.pre_audit("alice", subset, at=now).allowed
    assert auditor.predict("alice", subset, at=now).verdict != "refused"
    later = auditor.pre_audit("alice", subset, at=released_at + 1)
    assert not later.allowed and later.combined_with == ("q1",)
    # without a moment: everything remembered (the post-audit's view)
    assert not auditor.pre_audit("alice", subset).allowed
    post = auditor.post_audit("alice", answer("q2", subset, 2.0))
    assert not post.allowed and post.combined_with == ("q1",)


def test_answers_become_visible_in_the_order_they_were_remembered(
    tables: dict[str, TableConfig],
) -> None:
    auditor = Auditor(tables, min_group_size=5)
    now = time.monotonic()
    auditor.remember("bob", answer("q1", plan(CROHN, tables), 3.2), visible_at=now + 30)
    other = "SELECT COUNT(*) FROM patients WHERE city = 'Eger'"
    auditor.remember("bob", answer("q2", plan(other, tables), 400.0), visible_at=now + 60)
    subset = plan(CROHN_IN_ZIP, tables)
    assert auditor.pre_audit("bob", subset, at=now).allowed  # neither is out
    assert not auditor.pre_audit("bob", subset, at=now + 45).allowed  # q1 is
    # another scope never sees bob's answers
    assert auditor.pre_audit("carol", subset, at=now + 90).allowed
