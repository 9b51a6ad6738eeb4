"""A refusal names the group, in the analyst's terms; a dry run predicts the audit.

The group is a WHERE clause over declared columns built from the cell space (query texts
and the public schema), so naming it reveals nothing the analyst did not write; the dry
run's verdict (refused now / may be withheld after execution / answered) is the
pre-audit's, decided from earlier noisy answers and costing nothing.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from gateway.audit import Auditor
from gateway.core.config import TableConfig, with_nullability
from gateway.core.config_load import parse_config
from gateway.core.errors import AuditRefused
from gateway.core.plan import QueryRequest
from gateway.demo.hospital import NULLABLE, config_yaml
from gateway.pipeline.gateway import Gateway
from tests.test_audit import Session, refused

TARGET = "sex = 'F' AND age = 37 AND city = 'Eger'"


@pytest.fixture
def alice(tables: dict[str, TableConfig]) -> Session:
    return Session(Auditor(tables, min_group_size=5), tables)


@pytest.fixture(scope="module")
def tables() -> dict[str, TableConfig]:
    cfg = parse_config(yaml.safe_load(config_yaml("demo.db", "ledger.db")))
    return with_nullability(cfg.tables, NULLABLE)


def _refusal(result: Any) -> Any:
    pre, post = result
    return pre if not pre.allowed else post


@pytest.mark.parametrize(
    ("first", "second", "group"),
    [
        (
            "SELECT COUNT(*) FROM patients WHERE city = 'Sopron'",
            "SELECT COUNT(*) FROM patients WHERE city = 'Sopron' AND zip <> '8001'",
            "city = 'Sopron' AND zip = '8001'",
        ),
        (
            "SELECT COUNT(*) FROM patients WHERE disease = 'Crohn'",
            "SELECT COUNT(*) FROM patients WHERE disease = 'Crohn' AND age <> 37",
            "disease = 'Crohn' AND age = 37",
        ),
        (
            "SELECT COUNT(*) FROM patients WHERE city = 'Eger'",
            "SELECT AVG(glucose) FROM patients WHERE city = 'Eger'",
            "city = 'Eger' AND glucose IS NULL",
        ),
        (
            "SELECT COUNT(*) FROM patients WHERE age >= 40",
            "SELECT COUNT(*) FROM patients WHERE age > 40",
            "age = 40",
        ),
        # every value but one: `age <> 37`, not `age < 37 OR age > 37`
        (
            "SELECT COUNT(*) FROM patients WHERE city = 'Sopron'",
            "SELECT COUNT(*) FROM patients WHERE city = 'Sopron' AND age = 37",
            "city = 'Sopron' AND age <> 37",
        ),
        # a prefix's complement is NOT LIKE (it was once said as "zip <> '94%'")
        (
            "SELECT COUNT(*) FROM patients WHERE city = 'Sopron'",
            "SELECT COUNT(*) FROM patients WHERE city = 'Sopron' AND zip LIKE '94%'",
            "city = 'Sopron' AND zip NOT LIKE '94%'",
        ),
        # a longer prefix inside a shorter one: both conditions, not just the inner one
        (
            "SELECT COUNT(*) FROM patients WHERE zip LIKE '9%'",
            "SELECT COUNT(*) FROM patients WHERE zip LIKE '94%'",
            "(zip LIKE '9%' AND zip NOT LIKE '94%')",
        ),
        # … and the other way round (NOT LIKE is the complement, not LIKE)
        (
            "SELECT COUNT(*) FROM patients WHERE zip LIKE '9%'",
            "SELECT COUNT(*) FROM patients WHERE zip LIKE '9%' AND zip NOT LIKE '94%'",
            "zip LIKE '94%'",
        ),
    ],
)
def test_a_refusal_names_the_group_as_a_where_clause(
    alice: Session, first: str, second: str, group: str
) -> None:
    assert not refused(alice.ask(first, 30.0))
    decision = _refusal(alice.ask(second, 29.0))
    assert not decision.allowed
    assert decision.groups == (group,)
    assert f"WHERE {group}" in decision.reason and "directly" in decision.reason
    # the clause is one the analyst can send: asked directly, it is its own group
    assert not refused(alice.ask(f"SELECT COUNT(*) FROM patients WHERE {group}", 1.0))


def test_asking_the_named_group_directly_lets_the_query_through(alice: Session) -> None:
    """ "Ask for that group directly" can be followed: released with its own noise, the
    group is no longer a derived one."""
    alice.ask("SELECT COUNT(*) FROM patients WHERE city = 'Sopron'", 300.0)
    decision = _refusal(
        alice.ask("SELECT COUNT(*) FROM patients WHERE city = 'Sopron' AND age <> 37", 299.0)
    )
    (group,) = decision.groups
    assert not refused(alice.ask(f"SELECT COUNT(*) FROM patients WHERE {group}", 1.0))
    assert not refused(
        alice.ask("SELECT COUNT(*) FROM patients WHERE city = 'Sopron' AND age <> 37", 299.0)
    )


def _dry(gateway: Gateway, analyst: str, sql: str) -> dict[str, Any]:
    release = gateway.query(analyst, QueryRequest(sql, 1.0, 0.0, "laplace", dry_run=True))
    audit = release.extra["audit"]
    assert isinstance(audit, dict)
    return audit


def _ask(gateway: Gateway, analyst: str, sql: str) -> str:
    try:
        gateway.query(analyst, QueryRequest(sql, 1.0, 0.0, "laplace"))
    except AuditRefused as e:
        return "withheld" if e.detail["charged"] else "refused"
    return "answered"


def test_the_dry_run_predicts_the_audit(gateway: Gateway) -> None:
    gateway.ledger.create_analyst("alice", 100.0, 1e-6)
    spent = gateway.charges.status("alice").to_json()

    # a first question determines nothing: it will be answered
    first = f"SELECT COUNT(*) FROM patients WHERE {TARGET}"
    assert _dry(gateway, "alice", first)["verdict"] == "answered"
    assert _ask(gateway, "alice", first) == "answered"

    # a group known small from that answer: refused now, and the query is refused free
    split = f"SELECT COUNT(*) FROM patients WHERE {TARGET} AND smoker"
    predicted = _dry(gateway, "alice", split)
    assert predicted["verdict"] == "refused" and "WHERE" in predicted["reason"]
    assert _ask(gateway, "alice", split) == "refused"

    # a difference only its own answer can size: may be withheld, and the group is named
    assert _ask(gateway, "alice", "SELECT COUNT(*) FROM patients WHERE disease = 'Crohn'") == (
        "answered"
    )
    pair = "SELECT COUNT(*) FROM patients WHERE disease = 'Crohn' AND city <> 'Eger'"
    predicted = _dry(gateway, "alice", pair)
    assert predicted["verdict"] == "may_be_withheld"
    assert predicted["groups"] == ["city = 'Eger' AND disease = 'Crohn'"]
    assert _ask(gateway, "alice", pair) == "withheld"

    # a dry run costs nothing and changes nothing
    before = gateway.charges.status("alice").to_json()
    _dry(gateway, "alice", "SELECT COUNT(*) FROM patients WHERE age > 50")
    assert gateway.charges.status("alice").to_json() == before != spent


def test_a_dry_run_with_the_audit_off_says_so(make_gateway: Any) -> None:
    gateway = make_gateway(audit={"mode": "off"})
    audit = _dry(gateway, "demo", "SELECT COUNT(*) FROM patients")
    assert audit == {"verdict": "answered", "reason": "the audit is off"}
