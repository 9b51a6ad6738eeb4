"""A refusal says what to ask instead, as queries that can be sent as they are
(``gateway/pipeline/audit_advice.py``), and following that advice gets the answer.

On the demo data (k = 5, ε = 1 unless said): the analyst's honest questions that the
auditor refuses — a SUM over part of a group answered before, whose other part no count
sizes — come back with ``detail.ask_instead``; the first suggestion (the same query with
COUNT(*)) is answered; asking the group's count first, then the refused query again, is
answered too: a refusal before execution is decided again when asked again (what the
analyst asked since may size the group), while a withheld answer's repeat stays refused,
free (``tests/test_audit_http.py``).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from flask.testing import FlaskClient

from gateway.core.errors import AuditRefused
from gateway.core.plan import QueryRequest
from gateway.pipeline.audit_advice import MAX_GROUPS, ask_instead, breakdown, with_count
from gateway.pipeline.gateway import Gateway
from tests.test_audit_http import Ask, refused

DEPARTMENT_SUM = (
    "SELECT department, SUM(cost) AS total FROM visits WHERE year = 2024 GROUP BY department"
)


def test_the_query_with_a_count_keeps_its_own_text_and_outputs() -> None:
    assert with_count(DEPARTMENT_SUM) == (
        "SELECT department, SUM(cost) AS total, COUNT(*) AS n FROM visits "
        "WHERE year = 2024 GROUP BY department"
    )
    # a name already taken is not reused; a query that counts already gets nothing
    assert with_count("SELECT MEDIAN(age) AS n FROM patients") == (
        "SELECT MEDIAN(age) AS n, COUNT(*) AS n_rows FROM patients"
    )
    assert with_count("SELECT COUNT(*) FROM patients WHERE smoker") is None
    # nested: the outer query's rows are the inner query's groups, not people
    assert (
        with_count("SELECT AVG(n) FROM (SELECT city, COUNT(*) AS n FROM patients GROUP BY city)")
        is None
    )
    assert with_count("SELEC 1") is None


def test_only_suggestions_the_gateway_would_plan_are_kept() -> None:
    def plans(sql: str) -> object:
        from gateway.core.errors import UnsupportedQuery

        if "bad" in sql:
            raise UnsupportedQuery("not this one")
        return sql

    out = ask_instead(
        "SELECT SUM(x) AS s FROM t WHERE a = 1",
        "t",
        ["a <> 1", "bad = 2", "c = 3", "d = 4"],
        uncounted=True,
        plans=plans,
    )
    assert out == [
        "SELECT SUM(x) AS s, COUNT(*) AS n FROM t WHERE a = 1",
        "SELECT COUNT(*) AS n FROM t WHERE a <> 1",
        "SELECT COUNT(*) AS n FROM t WHERE c = 3",
    ]  # (the fourth group is past the three a refusal names)


def test_groups_that_differ_in_one_key_are_counted_by_one_breakdown() -> None:
    groups = [
        "year <> 2024 AND department = 'Surgery'",
        "year <> 2024 AND department <> 'Surgery'",  # not one value: not this breakdown's
        "department = 'Cardiology' AND year <> 2024",
        "smoker = TRUE",
    ]
    assert breakdown("visits", groups, ["department"]) == (
        "SELECT department, COUNT(*) AS n FROM visits WHERE year <> 2024 GROUP BY department"
    )
    # one group alone is better asked by itself; a column not grouped by is no breakdown
    assert breakdown("visits", groups[:2], ["department"]) is None
    assert breakdown("visits", groups, ["year"]) is None
    assert breakdown("patients", ["sex = 'F'", "sex = 'M'"], ["sex"]) == (
        "SELECT sex, COUNT(*) AS n FROM patients GROUP BY sex"
    )


def _department_totals_then_the_sum(ask: Ask) -> dict[str, Any]:
    for sql in (
        "SELECT department, COUNT(*) AS n FROM visits GROUP BY department",
        "SELECT department, AVG(cost) AS mean_cost FROM visits GROUP BY department",
        "SELECT year, COUNT(*) AS n FROM visits GROUP BY year",
    ):
        assert ask(sql, epsilon=1.0)[0] == 200, sql
    status, body = ask(DEPARTMENT_SUM, epsilon=1.0)
    assert refused(status, body) and body["error"]["detail"]["charged"] is False
    return dict(body["error"]["detail"])


def test_a_refusal_says_what_to_ask_and_the_first_suggestion_is_answered(
    ask: Ask, client: FlaskClient, auth: Any
) -> None:
    detail = _department_totals_then_the_sum(ask)
    suggestions = detail["ask_instead"]
    assert suggestions[0] == with_count(DEPARTMENT_SUM)
    # every department's other years, in one breakdown
    assert suggestions[1] == (
        "SELECT department, COUNT(*) AS n FROM visits WHERE year <> 2024 GROUP BY department"
    )
    # then the first groups' own counts, in the refusal's words
    assert len(detail["groups"]) > MAX_GROUPS
    assert suggestions[2:] == [
        f"SELECT COUNT(*) AS n FROM visits WHERE {group}" for group in detail["groups"][:MAX_GROUPS]
    ]
    # every suggestion is a query the gateway plans (its dry run is no error)
    for sql in suggestions:
        status, body = ask(sql, epsilon=1.0, dry_run=True)
        assert status == 200, (sql, body)
    # the dry run of the refused query predicts the refusal, with the same advice
    status, dry = ask(DEPARTMENT_SUM, epsilon=1.0, dry_run=True)
    assert status == 200 and dry["audit"]["verdict"] == "refused"
    assert dry["audit"]["ask_instead"] == suggestions
    status, body = ask(suggestions[0], epsilon=1.0)
    assert status == 200, body
    assert [c["name"] for c in body["columns"]] == ["department", "total", "n"]
    assert "audit_left_out" not in body


def test_a_refusal_before_execution_is_decided_again_once_the_group_is_counted(
    ask: Ask, client: FlaskClient, auth: Any
) -> None:
    _department_totals_then_the_sum(ask)
    status, again = ask(DEPARTMENT_SUM, epsilon=1.0)
    assert refused(status, again)  # nothing new: refused again, free, said so
    assert again["error"]["detail"]["refused_before"] is True
    assert again["error"]["detail"]["charged"] is False
    history = client.get("/v1/queries", headers=auth).get_json()["queries"]
    assert sum(q["outcome"] == "refused" for q in history) == 1  # recorded once
    # the counts that size every department's other years
    breakdown = "SELECT year, department, COUNT(*) AS n FROM visits GROUP BY year, department"
    assert ask(breakdown, epsilon=1.0)[0] == 200
    status, dry = ask(DEPARTMENT_SUM, epsilon=1.0, dry_run=True)
    assert status == 200 and dry["audit"]["verdict"] == "answered"
    status, body = ask(DEPARTMENT_SUM, epsilon=1.0)
    assert status == 200, body
    assert "audit_left_out" not in body


def _refusal_seen(gateway: Gateway) -> list[dict[str, Any]]:
    """What the analyst sees of the SUM's refusals (asked twice), query ids blanked."""
    gateway.ledger.create_analyst("eve", 100.0, 1e-6)
    for sql in (
        "SELECT department, COUNT(*) AS n FROM visits GROUP BY department",
        "SELECT department, AVG(cost) AS mean_cost FROM visits GROUP BY department",
        "SELECT year, COUNT(*) AS n FROM visits GROUP BY year",
    ):
        gateway.query("eve", QueryRequest(sql, 1.0, 0.0, "laplace"))
    seen = []
    for _ in range(2):
        with pytest.raises(AuditRefused) as refused:
            gateway.query("eve", QueryRequest(DEPARTMENT_SUM, 1.0, 0.0, "laplace"))
        detail = dict(refused.value.detail)
        ids = detail.pop("combined_with")
        message = refused.value.message
        for query_id in ids:
            message = message.replace(query_id, "<id>")
        seen.append({**detail, "message": message, "combined": len(ids)})
    return seen


def test_what_a_refusal_says_and_suggests_is_the_same_on_neighbouring_data(
    make_gateway: Callable[..., Gateway],
) -> None:
    """The attack on the advice: it is written from query texts, the schema and the
    groups' WHERE clauses, and a refusal before execution is decided again from
    answers already released — so its status, text, groups, suggestions, charge and
    ``refused_before`` must not move when one patient (and her visits) is taken out of
    the data. Deterministic: nothing here depends on a noisy value."""

    def without_one_patient(db: Path) -> None:
        with sqlite3.connect(db) as conn:
            (pid,) = conn.execute("SELECT MIN(patient_id) FROM visits").fetchone()
            conn.execute("DELETE FROM visits WHERE patient_id = ?", (pid,))
            conn.execute("DELETE FROM patients WHERE patient_id = ?", (pid,))

    seen = _refusal_seen(make_gateway())
    assert seen == _refusal_seen(make_gateway(prepare=without_one_patient))
    first, again = seen
    assert first["charged"] is False and first["ask_instead"]
    assert "refused_before" not in first and again["refused_before"] is True
