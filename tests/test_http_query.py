"""POST /v1/query and the analyst endpoints through the real app (test client), on a
real SQLite copy of the demo data and a real ledger.

Covers every supported construct, every error code with its envelope, and invariants 1,
2 and 7 of docs/design.md (charged before released; refusals are free; same question,
same answer, free).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from flask.testing import FlaskClient

from gateway.pipeline.gateway import Gateway
from tests.conftest import ADMIN_KEY

Ask = Callable[..., tuple[int, dict[str, Any]]]

SUPPORTED = [
    "SELECT COUNT(*) FROM patients",
    "SELECT COUNT(*) AS n FROM patients WHERE age > 30 AND sex = 'F'",
    "SELECT COUNT(glucose) FROM patients WHERE disease IN ('Diabetes', 'Crohn')",
    "SELECT COUNT(DISTINCT patient_id) FROM visits WHERE year BETWEEN 2020 AND 2022",
    "SELECT SUM(income), AVG(age) FROM patients WHERE NOT smoker",
    "SELECT AVG(glucose) FROM patients WHERE glucose IS NOT NULL",
    "SELECT COUNT(*) FROM patients WHERE zip LIKE '1%' OR city = 'Szeged'",
    "SELECT COUNT(*) FROM patients WHERE CASE WHEN age < 18 THEN 1 ELSE 0 END = 0",
    "SELECT sex, COUNT(*) FROM patients GROUP BY sex",
    "SELECT age / 10 AS decade, COUNT(*) AS n FROM patients GROUP BY age / 10 ORDER BY decade",
    "SELECT CASE WHEN age < 40 THEN 'young' ELSE 'old' END AS band, AVG(income) "
    "FROM patients GROUP BY 1",
    "SELECT department, SUM(length_of_stay) FROM visits GROUP BY department",
    "SELECT disease, COUNT(*) AS n FROM patients GROUP BY disease HAVING COUNT(*) > 50 "
    "ORDER BY n DESC LIMIT 3",
    'SELECT city, COUNT(*) FROM "main"."patients" AS p WHERE p.age >= 18 GROUP BY p.city',
    "SELECT * FROM (SELECT sex, COUNT(*) AS c FROM patients GROUP BY sex) AS virtual_table "
    "LIMIT 10",
    "SELECT zip, COUNT(*) FROM patients GROUP BY zip",
]


@pytest.mark.parametrize("sql", SUPPORTED)
def test_supported_queries_are_answered_with_accuracy_and_budget(ask: Ask, sql: str) -> None:
    status, body = ask(sql, epsilon=0.2)
    assert status == 200, body
    assert body["ok"] is True and body["cached"] is False
    assert [c["name"] for c in body["columns"]]
    for row in body["rows"]:
        assert len(row) == len(body["columns"])
    aggregates = [c["name"] for c in body["columns"] if c["type"] in ("integer", "real")]
    assert set(body["accuracy"]) <= set(aggregates) | {c["name"] for c in body["columns"]}
    assert body["privacy"]["epsilon"] == 0.2
    assert body["budget"]["epsilon_spent"] > 0


def test_a_count_is_near_the_truth_with_the_reported_accuracy(ask: Ask, gateway: Gateway) -> None:
    status, body = ask("SELECT COUNT(*) FROM patients WHERE age >= 40", epsilon=1.0)
    assert status == 200
    truth = _exact(gateway, "SELECT COUNT(*) FROM patients WHERE age >= 40")
    acc = body["accuracy"]["COUNT(*)"]
    # Laplace at ε=1, Δ=1: stddev √2·… ≈ 1.4; P(|noise| > 30) < 1e-12.
    assert abs(body["rows"][0][0] - truth) <= 30
    assert 1.0 < acc["stddev"] < 2.0
    assert acc["ci95_halfwidth"] >= 2


def test_public_group_values_are_all_released_in_declared_order(ask: Ask) -> None:
    status, body = ask("SELECT disease, COUNT(*) FROM patients GROUP BY disease")
    assert status == 200
    assert [r[0] for r in body["rows"]] == [
        "Crohn",
        "Influenza",
        "Meningitis",
        "Diabetes",
        "Asthma",
        "Hypertension",
        "None",
    ]


def test_group_keys_not_public_need_partition_selection(ask: Ask, gateway: Gateway) -> None:
    status, body = ask("SELECT zip, COUNT(*) FROM patients GROUP BY zip", epsilon=1.0)
    assert status == 200
    assert body["privacy"]["selection_delta"] > 0
    # Rare zips (a handful of people) are never released; every released zip is real.
    real = {r[0] for r in _rows(gateway, "SELECT DISTINCT zip FROM patients")}
    assert {r[0] for r in body["rows"]} <= real
    selection = body["partition_selection"]
    assert selection["keys"] == ["zip"] and selection["threshold"] > 1
    assert f"reaches {selection['threshold']}" in selection["note"]


def test_an_empty_partition_selection_says_why(ask: Ask) -> None:
    """Groups all below the threshold: an empty, charged answer that says so."""
    sql = "SELECT zip, COUNT(*) FROM patients WHERE age = 100 GROUP BY zip"
    status, body = ask(sql, epsilon=0.1)
    assert status == 200 and body["rows"] == []
    assert body["budget"]["epsilon_spent"] > 0
    selection = body["partition_selection"]
    assert "No group reached the threshold." in selection["note"]
    # The same note comes with the cached answer, and a dry run gives the threshold first.
    status, again = ask(sql, epsilon=0.1)
    assert again["cached"] and again["partition_selection"] == selection
    status, dry = ask(sql, epsilon=0.1, dry_run=True)
    assert dry["partition_selection"]["threshold"] == selection["threshold"]
    assert "No group" not in dry["partition_selection"]["note"]


def test_public_keys_need_no_partition_selection(ask: Ask) -> None:
    status, body = ask("SELECT sex, COUNT(*) FROM patients GROUP BY sex", epsilon=0.5)
    assert status == 200 and "partition_selection" not in body


def test_response_shape_matches_the_contract(ask: Ask) -> None:
    status, body = ask("SELECT sex, COUNT(*) AS n FROM patients GROUP BY sex", epsilon=0.5)
    assert status == 200
    assert set(body) == {
        "ok",
        "query_id",
        "cached",
        "columns",
        "rows",
        "accuracy",
        "privacy",
        "budget",
        "charge",
    }
    assert body["columns"] == [{"name": "sex", "type": "text"}, {"name": "n", "type": "integer"}]
    assert set(body["accuracy"]["n"]) == {"ci95_halfwidth", "stddev"}
    assert {"mechanism", "epsilon", "delta", "rho"} <= set(body["privacy"])
    assert {"epsilon_spent", "epsilon_remaining", "delta_spent", "delta_remaining"} <= set(
        body["budget"]
    )
    assert {"period", "period_ends_at"} <= set(body["budget"])
    assert body["charge"] == {"epsilon": 0.5, "delta": 0.0}  # the budget's ε spent rose 0.5


# -- errors -------------------------------------------------------------------------------

ERROR_CASES: list[tuple[dict[str, Any] | str, int, str]] = [
    ("not json", 400, "invalid_request"),
    ([1, 2], 400, "invalid_request"),
    ({}, 400, "invalid_request"),
    ({"sql": 42}, 400, "invalid_request"),
    ({"sql": "SELECT COUNT(*) FROM patients", "colour": "blue"}, 400, "invalid_request"),
    ({"sql": "SELECT COUNT(*) FROM patients", "dry_run": "yes"}, 400, "invalid_request"),
    ({"sql": "SELEC COUNT(*) FROM patients"}, 400, "sql_syntax"),
    ({"sql": "SELECT COUNT(*) FROM patients WHERE age >= 40 GROUP BY"}, 400, "sql_syntax"),
    ({"sql": "SELECT COUNT(*), FROM patients"}, 400, "sql_syntax"),
    ({"sql": "SELECT * FROM patients"}, 400, "unsupported_query"),
    ({"sql": "SELECT COUNT(*) FROM doctors"}, 400, "unknown_table"),
    ({"sql": "SELECT COUNT(name) FROM patients"}, 400, "unknown_column"),
    ({"sql": "SELECT COUNT(*) FROM patients", "epsilon": 0}, 400, "invalid_privacy_parameters"),
    ({"sql": "SELECT COUNT(*) FROM patients", "epsilon": -1}, 400, "invalid_privacy_parameters"),
    ({"sql": "SELECT COUNT(*) FROM patients", "epsilon": 5}, 400, "invalid_privacy_parameters"),
    ({"sql": "SELECT COUNT(*) FROM patients", "epsilon": "1"}, 400, "invalid_privacy_parameters"),
    (
        {"sql": "SELECT COUNT(*) FROM patients", "mechanism": "exponential"},
        400,
        "invalid_privacy_parameters",
    ),
    (
        {"sql": "SELECT COUNT(*) FROM patients", "mechanism": "gaussian", "delta": 0},
        400,
        "invalid_privacy_parameters",
    ),
    ({"sql": "SELECT COUNT(*) FROM patients", "epsilon": 1e309}, 400, "invalid_privacy_parameters"),
    (
        {"sql": "SELECT COUNT(*) FROM patients", "epsilon": 5e-324},
        400,
        "invalid_privacy_parameters",
    ),
    (
        {
            "sql": "SELECT COUNT(*) FROM patients",
            "epsilon": 1e-300,
            "mechanism": "gaussian",
            "delta": 1e-9,
        },
        400,
        "invalid_privacy_parameters",
    ),
]


@pytest.mark.parametrize("field", ["epsilon", "delta", "mechanism", "dry_run"])
def test_null_parameters_mean_the_default(ask: Ask, field: str) -> None:
    status, body = ask("SELECT COUNT(*) FROM patients WHERE age > 70", **{field: None})
    if field == "dry_run":
        assert status == 400 and body["error"]["code"] == "invalid_request"
    else:
        assert status == 200, body
        assert body["privacy"]["mechanism"] == "laplace"


@pytest.mark.parametrize(("body", "status", "code"), ERROR_CASES)
def test_every_bad_request_gets_the_envelope_and_costs_nothing(
    client: FlaskClient, auth: dict[str, str], body: Any, status: int, code: str
) -> None:
    before = client.get("/v1/budget", headers=auth).get_json()["budget"]
    if isinstance(body, str):
        resp = client.post(
            "/v1/query", data=body, headers={**auth, "Content-Type": "application/json"}
        )
    else:
        resp = client.post("/v1/query", json=body, headers=auth)
    assert resp.status_code == status
    assert_envelope(resp.get_json(), status, code)
    after = client.get("/v1/budget", headers=auth).get_json()["budget"]
    assert after == before


def assert_envelope(body: dict[str, Any], status: int, code: str) -> None:
    """The one error shape (docs/design.md, "Errors"), and nothing else."""
    assert set(body) == {"ok", "status", "error"}
    assert body["ok"] is False and body["status"] == status
    assert set(body["error"]) == {"code", "message", "detail"}
    assert body["error"]["code"] == code
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    assert isinstance(body["error"]["detail"], dict)
    assert "Traceback" not in body["error"]["message"]


def test_syntax_errors_say_where(ask: Ask) -> None:
    status, body = ask("SELECT COUNT(*)\nFROM patients\nWHERE age >")
    assert status == 400
    assert body["error"]["detail"]["line"] == 3


def test_syntax_errors_quote_the_offending_token(ask: Ask) -> None:
    status, body = ask("SELEC COUNT(*) FROM patients")
    assert status == 400
    assert body["error"]["detail"] | {"request_id": None} == {
        "line": 1,
        "column": 1,
        "near": "SELEC",
        "request_id": None,
    }
    assert "'SELEC'" in body["error"]["message"] and "SELECT" in body["error"]["message"]


def test_unsupported_queries_name_the_construct(ask: Ask) -> None:
    status, body = ask("SELECT MAX(zip) FROM patients")
    assert status == 400 and body["error"]["detail"]["construct"] == "MAX of an unbounded column"


def test_authentication(client: FlaskClient, auth: dict[str, str], gateway: Gateway) -> None:
    sql = {"sql": "SELECT COUNT(*) FROM patients"}
    resp = client.post("/v1/query", json=sql)
    assert resp.status_code == 401
    assert_envelope(resp.get_json(), 401, "unauthenticated")
    resp = client.post("/v1/query", json=sql, headers={"Authorization": "Bearer nope"})
    assert_envelope(resp.get_json(), 401, "unauthenticated")
    resp = client.post("/v1/query", json=sql, headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    assert_envelope(resp.get_json(), 403, "forbidden")
    gateway.ledger.update_analyst("alice", disabled=True)
    resp = client.post("/v1/query", json=sql, headers=auth)
    assert_envelope(resp.get_json(), 403, "forbidden")


def test_unknown_endpoint_and_method_use_the_envelope(client: FlaskClient) -> None:
    assert_envelope(client.get("/v1/nothing").get_json(), 404, "not_found")
    assert_envelope(client.get("/v1/query").get_json(), 405, "method_not_allowed")


def test_budget_exhausted_costs_nothing(make_gateway: Callable[..., Gateway]) -> None:
    from gateway.http.app import create_app

    gw = make_gateway(privacy={"composition": "pure"})
    key = gw.ledger.create_analyst("bob", 1.0, 0.0)
    client = create_app(gw.config, gateway=gw).test_client()
    h = {"Authorization": f"Bearer {key}"}
    answered = 0
    for age in range(30, 70, 2):  # bands of ~100 people: nothing for the auditor
        body = {"sql": f"SELECT COUNT(*) FROM patients WHERE age > {age}", "epsilon": 0.3}
        resp = client.post("/v1/query", json=body, headers=h)
        if resp.status_code == 200:
            answered += 1
        else:
            assert_envelope(resp.get_json(), 403, "budget_exhausted")
    assert answered == 3  # 3 × 0.3 ≤ 1.0 < 4 × 0.3
    assert client.get("/v1/budget", headers=h).get_json()["budget"]["epsilon_spent"] == (
        pytest.approx(0.9)
    )


def test_a_database_error_after_sending_is_charged_and_reveals_nothing(
    make_gateway: Callable[..., Gateway],
) -> None:
    """Once the statement reached the database, a failure stays charged (it could depend
    on the rows) and says nothing but that it failed."""
    from gateway.http.app import create_app
    from gateway.pipeline.gateway import CHARGED_FAILURE_MESSAGE

    gw = make_gateway()
    key = gw.ledger.create_analyst("carol", 10.0, 1e-6)
    db = Path(gw.config.database.url.removeprefix("sqlite:///"))
    gw.engine.dispose()
    with sqlite3.connect(db) as conn:
        conn.execute("DROP TABLE visits")
    client = create_app(gw.config, gateway=gw).test_client()
    h = {"Authorization": f"Bearer {key}"}
    resp = client.post("/v1/query", json={"sql": "SELECT COUNT(*) FROM visits"}, headers=h)
    body = resp.get_json()
    assert_envelope(body, 503, "database_unavailable")
    assert body["error"]["message"] == CHARGED_FAILURE_MESSAGE
    assert {k: v for k, v in body["error"]["detail"].items() if k != "request_id"} == {
        "charged": True
    }
    budget = client.get("/v1/budget", headers=h).get_json()["budget"]
    assert budget["rho_spent"] > 0.0
    history = client.get("/v1/queries", headers=h).get_json()["queries"]
    assert [q["outcome"] for q in history] == ["withheld"]
    assert all(q["release"] is None for q in history)


def test_an_unreachable_database_is_refunded(make_gateway: Callable[..., Gateway]) -> None:
    """A failure before the statement is sent cannot depend on the rows: refunded."""
    from gateway.http.app import create_app

    gw = make_gateway()
    key = gw.ledger.create_analyst("carol", 10.0, 1e-6)
    db = Path(gw.config.database.url.removeprefix("sqlite:///"))
    gw.engine.dispose()
    db.unlink()
    client = create_app(gw.config, gateway=gw).test_client()
    h = {"Authorization": f"Bearer {key}"}
    resp = client.post("/v1/query", json={"sql": "SELECT COUNT(*) FROM visits"}, headers=h)
    body = resp.get_json()
    assert_envelope(body, 503, "database_unavailable")
    assert "nothing was charged" in body["error"]["message"]
    assert body["error"]["detail"]["charged"] is False  # what the ledger says: refunded
    budget = client.get("/v1/budget", headers=h).get_json()["budget"]
    assert budget["rho_spent"] == 0.0
    history = client.get("/v1/queries", headers=h).get_json()["queries"]
    assert [q["outcome"] for q in history] == ["refunded"]


def test_unexpected_errors_are_internal_with_a_request_id_only(
    client: FlaskClient, auth: dict[str, str], gateway: Gateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    def boom(*_: Any, **__: Any) -> Any:
        raise RuntimeError("secret value Anna Nagy-17")

    monkeypatch.setattr(gateway, "schema", boom)
    resp = client.get("/v1/schema", headers=auth)
    body = resp.get_json()
    assert_envelope(body, 500, "internal")
    assert set(body["error"]["detail"]) == {"request_id"}
    assert "Anna" not in resp.get_data(as_text=True)


# -- docs/design.md, invariants 1 and 7: charged before released; same answer, free ----


def test_identical_requests_get_the_identical_answer_for_free(ask: Ask, gateway: Gateway) -> None:
    sql = "SELECT disease, COUNT(*) AS n FROM patients GROUP BY disease"
    status, first = ask(sql, epsilon=0.3)
    assert status == 200
    spent = first["budget"]["rho_spent"]
    for spelling in (sql, sql.lower(), sql.replace(" ", "  ")):
        status, again = ask(spelling, epsilon=0.3)
        assert status == 200 and again["cached"] is True
        assert again["rows"] == first["rows"] and again["query_id"] == first["query_id"]
        assert again["budget"]["rho_spent"] == spent
    status, other = ask(sql, epsilon=0.4)  # other parameters: a new release
    assert other["cached"] is False and other["budget"]["rho_spent"] > spent


def test_every_release_is_in_the_ledger_with_its_cost(
    ask: Ask, client: FlaskClient, auth: dict[str, str]
) -> None:
    released = []
    for age in (20, 30, 40):
        status, body = ask(f"SELECT COUNT(*) FROM patients WHERE age > {age}", epsilon=0.1)
        assert status == 200
        released.append(body)
    history = client.get("/v1/queries", headers=auth).get_json()["queries"]
    by_id = {q["query_id"]: q for q in history}
    for body in released:
        entry = by_id[body["query_id"]]
        assert entry["outcome"] == "answered"
        assert entry["release"]["rows"] == body["rows"]
        assert entry["cost"]["epsilon"] == pytest.approx(0.1)


def test_dry_run_spends_nothing_and_shows_cost_and_accuracy(
    ask: Ask, client: FlaskClient, auth: dict[str, str]
) -> None:
    before = client.get("/v1/budget", headers=auth).get_json()["budget"]
    status, body = ask("SELECT sex, AVG(age) FROM patients GROUP BY sex", epsilon=0.5, dry_run=True)
    assert status == 200
    assert body["dry_run"] is True and body["would_fit"] is True and body["rows"] == []
    assert body["plan"]["measures"][0]["kind"] == "sum"
    assert "AVG(age)" in body["accuracy"]
    assert client.get("/v1/budget", headers=auth).get_json()["budget"] == before


def test_probes_are_free(ask: Ask) -> None:
    status, body = ask("SELECT 1")
    assert status == 200 and body["rows"] == [[1]]
    assert body["privacy"]["epsilon"] == 0.0 and body["budget"]["rho_spent"] == 0.0


def test_schema_shows_only_what_is_declared(client: FlaskClient, auth: dict[str, str]) -> None:
    body = client.get("/v1/schema", headers=auth).get_json()
    patients = next(t for t in body["tables"] if t["name"] == "patients")
    names = [c["name"] for c in patients["columns"]]
    assert "name" not in names and "age" in names
    age = next(c for c in patients["columns"] if c["name"] == "age")
    assert (age["lower"], age["upper"]) == (0, 100)


# -- helpers ------------------------------------------------------------------------------


def _rows(gateway: Gateway, sql: str) -> list[tuple[Any, ...]]:
    db = gateway.config.database.url.removeprefix("sqlite:///")
    with sqlite3.connect(db) as conn:
        return conn.execute(sql).fetchall()


def _exact(gateway: Gateway, sql: str) -> int:
    return int(_rows(gateway, sql)[0][0])


def test_every_request_is_in_the_audit_log(client: FlaskClient, auth: dict[str, str]) -> None:
    client.post("/v1/query", json={"sql": "SELECT COUNT(*) FROM patients"}, headers=auth)
    client.post("/v1/query", json={"sql": "SELECT * FROM patients"}, headers=auth)
    client.post("/v1/query", json={"sql": "SELECT 1"})
    admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
    entries = client.get("/v1/admin/audit-log", headers=admin).get_json()
    rows = entries["entries"]
    outcomes = [(e["analyst"], e["status"], e.get("error_code")) for e in rows]
    assert ("alice", 200, None) in outcomes
    assert ("alice", 400, "unsupported_query") in outcomes
    assert (None, 401, "unauthenticated") in outcomes


def _broken_auditor(*_: Any, **__: Any) -> Any:
    raise KeyError("auditor bug")


def test_an_auditor_that_cannot_decide_refuses_for_free(
    ask: Ask, gateway: Gateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gateway.auditor, "pre_audit_cells", _broken_auditor)
    status, body = ask("SELECT COUNT(*) FROM patients WHERE age > 50")
    assert status == 403 and body["error"]["code"] == "audit_refused"
    assert body["error"]["detail"]["charged"] is False
    status, budget = 0, gateway.budget("alice")
    assert budget["rho_spent"] == 0.0


def test_an_auditor_that_cannot_decide_after_execution_withholds_everything(
    ask: Ask, gateway: Gateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A post-audit that fails leaves no row in: the answer is withheld (charged: its
    statement ran), never released unaudited nor in part."""
    monkeypatch.setattr(gateway.auditor, "post_audit_cells", _broken_auditor)
    status, body = ask("SELECT disease, COUNT(*) FROM patients GROUP BY disease")
    assert status == 403 and body["error"]["code"] == "audit_refused"
    assert body["error"]["detail"]["charged"] is True
    assert "rows" not in body


def test_a_ledger_failure_releases_nothing(
    ask: Ask, gateway: Gateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    import budget

    def down(*_: Any, **__: Any) -> Any:
        raise budget.LedgerUnavailable("connection refused")

    monkeypatch.setattr(gateway.ledger, "reserve", down)
    status, body = ask("SELECT COUNT(*) FROM patients WHERE age > 60")
    assert status == 503
    assert_envelope(body, 503, "ledger_unavailable")
    assert "rows" not in body


def test_cache_scope_global_shares_answers_across_analysts(
    make_gateway: Callable[..., Gateway],
) -> None:
    from gateway.http.app import create_app

    sql = {"sql": "SELECT sex, COUNT(*) FROM patients GROUP BY sex", "epsilon": 0.2}
    for scope, shared in (("global", True), ("analyst", False)):
        gw = make_gateway(cache={"scope": scope})
        client = create_app(gw.config, gateway=gw).test_client()
        answers = []
        for name in ("ann", "ben"):
            key = gw.ledger.create_analyst(name, 5.0, 1e-6)
            resp = client.post("/v1/query", json=sql, headers={"Authorization": f"Bearer {key}"})
            answers.append(resp.get_json())
        assert answers[1]["cached"] is shared
        assert (answers[1]["rows"] == answers[0]["rows"]) or not shared
        assert (answers[1]["budget"]["rho_spent"] == 0.0) is shared


def test_the_gaussian_mechanism_end_to_end(ask: Ask, gateway: Gateway) -> None:
    sql = "SELECT disease, COUNT(*) AS n FROM patients GROUP BY disease"
    status, body = ask(sql, epsilon=0.5, delta=1e-7, mechanism="gaussian")
    assert status == 200, body
    assert body["privacy"]["mechanism"] == "gaussian" and body["privacy"]["delta"] == 1e-7
    # The analytic Gaussian at ε=0.5, δ=1e-7, Δ₂=1 needs σ ≈ 7.7; ρ = 1/(2σ²).
    sigma = body["accuracy"]["n"]["stddev"]
    assert 5 < sigma < 12
    assert body["privacy"]["rho"] == pytest.approx(1 / (2 * sigma**2), rel=0.02)
    assert body["budget"]["rho_spent"] == pytest.approx(body["privacy"]["rho"])
    truth = dict(_rows(gateway, "SELECT disease, COUNT(*) FROM patients GROUP BY disease"))
    for disease, n in body["rows"]:
        assert abs(n - truth[disease]) < 8 * sigma  # P(|N(0,σ²)| > 8σ) < 1e-15


def test_a_filter_dropdown_lists_declared_values_for_free(ask: Ask) -> None:
    status, body = ask("SELECT DISTINCT disease AS column_values FROM main.patients LIMIT 10000")
    assert status == 200
    assert [r[0] for r in body["rows"]][:3] == ["Crohn", "Influenza", "Meningitis"]
    assert body["privacy"]["epsilon"] == 0.0 and body["budget"]["rho_spent"] == 0.0
    # Values that are not declared public, or a filtered list, stay refused.
    for sql in (
        "SELECT DISTINCT zip FROM patients",
        "SELECT DISTINCT disease FROM patients WHERE age > 90",
    ):
        status, body = ask(sql)
        assert status == 400 and body["error"]["code"] == "unsupported_query"


def test_where_on_a_group_key_narrows_the_released_groups(ask: Ask) -> None:
    status, body = ask(
        "SELECT disease, COUNT(*) FROM patients WHERE disease IN ('Crohn', 'Influenza') "
        "GROUP BY disease"
    )
    assert status == 200
    assert [r[0] for r in body["rows"]] == ["Crohn", "Influenza"]


@pytest.mark.parametrize("audit", ["refuse", "off"])
def test_an_answer_is_reused_at_once_whether_its_outcome_was_waited_for_or_queued(
    make_gateway: Callable[..., Gateway], audit: str
) -> None:
    """With the auditor off, an answer leaves before its outcome row is written (it rides
    on the ledger writer's next batch); this process's cache and history still see it at
    once. With the auditor on, the row is committed before the answer leaves: another
    worker's auditor replays it under the scope lock (a second ledger object here plays
    that other process)."""
    from budget import Ledger
    from gateway.http.app import create_app

    gw = make_gateway(audit={"mode": audit})
    client = create_app(gw.config, gateway=gw).test_client()
    auth = {"Authorization": f"Bearer {gw.ledger.create_analyst('alice', 10.0, 1e-6)}"}
    sql = "SELECT sex, COUNT(*) AS n FROM patients GROUP BY sex"
    first = client.post("/v1/query", json={"sql": sql, "epsilon": 0.2}, headers=auth).get_json()
    if audit == "refuse":
        other = Ledger.from_url(gw.config.ledger.url)
        try:
            assert [h.outcome for h in other.history("alice")] == ["answered"]
        finally:
            other.close()
    again = client.post("/v1/query", json={"sql": sql, "epsilon": 0.2}, headers=auth).get_json()
    assert again["cached"] is True and again["query_id"] == first["query_id"]
    assert again["rows"] == first["rows"]
    assert again["budget"]["rho_spent"] == first["budget"]["rho_spent"]
    history = client.get("/v1/queries", headers=auth).get_json()["queries"]
    assert [(q["query_id"], q["outcome"]) for q in history] == [(first["query_id"], "answered")]


def test_a_count_selects_its_groups_by_its_own_noise(ask: Ask, gateway: Gateway) -> None:
    """COUNT(*) over one row per person: the count itself, at the query's full ε, decides
    which zips appear (no ε for a separate count of people) and is released as drawn."""
    from gateway.core.plan import QueryRequest

    def selection(sql: str) -> Any:
        planned = gateway.planner.plan(QueryRequest(sql, 1.0, 1e-6, "laplace"))
        return planned.calibration  # type: ignore[union-attr]

    count = selection("SELECT zip, COUNT(*) AS n FROM patients GROUP BY zip")
    assert count.selection.measure == 0 and count.selection.noise == count.noises[0]
    assert count.noises[0].scale == 1  # ε = 1 all on the count
    assert count.selection.threshold == 15  # τ for ε = 1, δ = 1e-6, one row per person
    # AVG selects by its count of values; SUM alone has no count, so a unit count selects
    avg = selection("SELECT zip, AVG(age) FROM patients GROUP BY zip")
    assert avg.selection.measure == 1 and len(avg.noises) == 2
    total = selection("SELECT zip, SUM(age) FROM patients GROUP BY zip")
    assert total.selection.measure is None and total.selection.noise.scale == 2
    status, body = ask("SELECT zip, COUNT(*) AS n FROM patients GROUP BY zip", epsilon=1.0)
    assert status == 200
    note = body["partition_selection"]["note"]
    assert "its noisy n (the one released) reaches" in note
    threshold = body["partition_selection"]["threshold"]
    assert all(row[1] >= threshold for row in body["rows"])


def test_an_average_sums_its_values_from_the_middle_of_their_bounds(
    ask: Ask, gateway: Gateway
) -> None:
    """AVG(age), age in [0, 100]: Σ(age − 50) moves by ≤ 50 per person, not 100, so the
    sum's noise is half; the released average adds 50 back. A SUM of the same column in
    the same query is shared instead (one noisy sum, not two)."""
    from gateway.core.plan import QueryRequest

    def planned(sql: str) -> Any:
        return gateway.planner.plan(QueryRequest(sql, 1.0, 1e-6, "laplace"))

    avg = planned("SELECT AVG(age) FROM patients")
    total = avg.plan.measures[avg.plan.outputs[0].measures[0]]
    assert total.center == 50 and total.sensitivity.l1 == 50
    assert avg.calibration.noises[0].scale == 100  # 50 / (ε/2)
    both = planned("SELECT SUM(age), AVG(age) FROM patients")
    assert [m.kind for m in both.plan.measures] == ["sum", "count_values"]
    assert all(m.center == 0 for m in both.plan.measures)
    truth = _rows(gateway, "SELECT AVG(age), COUNT(age) FROM patients")[0]
    status, body = ask("SELECT AVG(age) AS a FROM patients", epsilon=1.0)
    assert status == 200
    value = body["rows"][0][0]
    low, high = body["accuracy"]["a"]["ci95_intervals"][0]
    # the interval is around the released value, and the value near the truth (the sum's
    # noise has scale 100 over thousands of people)
    assert low <= value <= high and high - low < 1.0
    assert abs(value - truth[0]) < 1.0
