"""The admin endpoints: auth (401/403), analysts, budgets, key rotation, audit log.

Runs the blueprint in the real app (``create_app`` over the demo gateway), so the admin
endpoints are authenticated by the same path as the analyst endpoints.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from flask.testing import FlaskClient

from budget import Ledger
from gateway.http.app import create_app
from gateway.pipeline.gateway import Gateway
from mechanisms.types import PrivacyCost
from tests.conftest import ADMIN_KEY


@pytest.fixture
def gateway(make_gateway: Callable[..., Gateway]) -> Gateway:
    return make_gateway(analysts=[])  # no analyst but those the tests create


@pytest.fixture
def ledger(gateway: Gateway) -> Ledger:
    return gateway.ledger


@pytest.fixture
def client(gateway: Gateway) -> FlaskClient:
    return create_app(gateway.config, gateway=gateway).test_client()


def admin(token: str = ADMIN_KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def error_code(response: Any) -> str:
    body = response.get_json()
    assert body["ok"] is False and body["status"] == response.status_code
    assert set(body["error"]) == {"code", "message", "detail"}
    return str(body["error"]["code"])


def test_no_or_wrong_key_is_401(client: FlaskClient) -> None:
    for headers in ({}, {"Authorization": "Basic abc"}, admin("wrong"), admin(ADMIN_KEY + "x")):
        r = client.get("/v1/admin/analysts", headers=headers)
        assert r.status_code == 401 and error_code(r) == "unauthenticated"


def test_analyst_key_is_403(client: FlaskClient, ledger: Ledger) -> None:
    key = ledger.create_analyst("alice", 1.0, 1e-6)
    r = client.get("/v1/admin/analysts", headers=admin(key))
    assert r.status_code == 403 and error_code(r) == "forbidden"
    r = client.post("/v1/admin/analysts/alice/keys", headers=admin(key))
    assert r.status_code == 403


def test_admin_api_is_closed_without_an_admin_key(
    client: FlaskClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DPGATE_ADMIN_KEY")
    for token in ("", ADMIN_KEY):
        r = client.get("/v1/admin/analysts", headers=admin(token))
        assert r.status_code == 401


def test_create_list_patch_rotate(client: FlaskClient, ledger: Ledger) -> None:
    r = client.post(
        "/v1/admin/analysts", json={"name": "alice", "epsilon": 2.0, "delta": 1e-6}, headers=admin()
    )
    assert r.status_code == 201
    body = r.get_json()
    assert body["ok"] and body["name"] == "alice" and body["budget"]["epsilon"] == 2.0
    key = body["api_key"]
    got = ledger.authenticate(key)
    assert got is not None and got.name == "alice"

    r = client.post(
        "/v1/admin/analysts", json={"name": "alice", "epsilon": 1, "delta": 0}, headers=admin()
    )
    assert r.status_code == 409 and error_code(r) == "conflict"

    ledger.reserve(
        "alice",
        PrivacyCost(0.1, 0.0, 0.005),
        query_key="k",
        sql="SELECT 1",
        mechanism="laplace",
        data_version="v",
    )
    r = client.get("/v1/admin/analysts", headers=admin())
    assert r.status_code == 200
    listed = r.get_json()
    assert listed["global"] is None
    [alice] = listed["analysts"]
    assert alice["name"] == "alice" and alice["queries"] == 1 and alice["rho_spent"] == 0.005

    r = client.patch("/v1/admin/analysts/alice", json={"epsilon": 3.0}, headers=admin())
    assert r.status_code == 200 and r.get_json()["analyst"]["epsilon"] == 3.0
    r = client.patch("/v1/admin/analysts/alice", json={"disabled": True}, headers=admin())
    assert r.get_json()["analyst"]["disabled"] is True
    # a disabled analyst's key is still theirs (the gateway answers 403), never the admin's
    r = client.get("/v1/admin/analysts", headers=admin(key))
    assert r.status_code == 403

    r = client.post("/v1/admin/analysts/alice/keys", headers=admin())
    assert r.status_code == 201
    new_key = r.get_json()["api_key"]
    assert ledger.authenticate(key) is None and ledger.authenticate(new_key) is not None

    r = client.get("/v1/admin/analysts/alice", headers=admin())
    assert r.get_json()["analyst"]["queries"] == 1


def test_not_found_and_invalid_bodies(client: FlaskClient) -> None:
    r = client.patch("/v1/admin/analysts/nobody", json={"epsilon": 1.0}, headers=admin())
    assert r.status_code == 404 and error_code(r) == "not_found"
    r = client.post("/v1/admin/analysts/nobody/keys", headers=admin())
    assert r.status_code == 404
    bad_bodies: list[Any] = [
        {"name": "bob", "epsilon": 1.0},
        {"name": "bob", "epsilon": "1", "delta": 0},
        {"name": "bob", "epsilon": True, "delta": 0},
        {"name": "bob", "epsilon": -1, "delta": 0},
        {"name": "b b", "epsilon": 1, "delta": 0},
        {"name": "bob", "epsilon": 1, "delta": 1.5},
        {"name": "bob", "epsilon": 1, "delta": 0, "admin": True},
        [1, 2],
    ]
    for body in bad_bodies:
        r = client.post("/v1/admin/analysts", json=body, headers=admin())
        assert r.status_code == 400 and error_code(r) == "invalid_request", body
    r = client.post("/v1/admin/analysts", data="not json", headers=admin())
    assert r.status_code == 400
    client.post(
        "/v1/admin/analysts", json={"name": "bob", "epsilon": 1, "delta": 0}, headers=admin()
    )
    r = client.patch("/v1/admin/analysts/bob", json={"disabled": "yes"}, headers=admin())
    assert r.status_code == 400


def test_audit_log_endpoint(client: FlaskClient, ledger: Ledger) -> None:
    ledger.log_request(
        request_id="q1",
        analyst="alice",
        endpoint="/v1/query",
        sql="SELECT COUNT(*) FROM t",
        outcome="answered",
        error_code=None,
        status=200,
    )
    client.get("/v1/admin/analysts", headers=admin("wrong"))
    r = client.get("/v1/admin/audit-log?analyst=alice", headers=admin())
    assert r.status_code == 200
    [entry] = r.get_json()["entries"]
    assert entry["request_id"] == "q1" and entry["sql"] == "SELECT COUNT(*) FROM t"
    r = client.get("/v1/admin/audit-log?limit=10", headers=admin())
    entries = r.get_json()["entries"]
    # admin requests are audited too, refused ones included
    assert any(e["status"] == 401 and e["error_code"] == "unauthenticated" for e in entries)
    r = client.get("/v1/admin/audit-log?since=2999-01-01T00:00:00Z", headers=admin())
    assert r.get_json()["entries"] == []
    r = client.get("/v1/admin/audit-log?until=2000-01-01", headers=admin())
    assert r.get_json()["entries"] == []
    for bad in ("limit=0", "limit=x", "since=yesterday"):
        r = client.get(f"/v1/admin/audit-log?{bad}", headers=admin())
        assert r.status_code == 400 and error_code(r) == "invalid_request"


# -- budget periods and the global budget (issue 15) -------------------------------------


def test_analysts_get_a_period_on_create_and_patch(client: FlaskClient) -> None:
    r = client.post(
        "/v1/admin/analysts",
        json={"name": "pat", "epsilon": 1.0, "delta": 1e-6, "period": "week"},
        headers=admin(),
    )
    assert r.status_code == 201
    budget = r.get_json()["budget"]
    assert budget["period"] == "week" and budget["period_ends_at"].endswith("+00:00")
    r = client.patch("/v1/admin/analysts/pat", json={"period": "none"}, headers=admin())
    assert r.status_code == 200
    analyst = r.get_json()["analyst"]
    assert analyst["period"] == "none" and analyst["period_ends_at"] is None
    r = client.patch("/v1/admin/analysts/pat", json={"period": "year"}, headers=admin())
    assert r.status_code == 400 and error_code(r) == "invalid_request"
    assert r.get_json()["error"]["detail"]["field"] == "period"
    r = client.post(
        "/v1/admin/analysts",
        json={"name": "quinn", "epsilon": 1.0, "delta": 0.0},
        headers=admin(),
    )
    assert r.get_json()["budget"]["period"] == "none"  # the default


def test_the_global_budget_over_http(client: FlaskClient) -> None:
    r = client.get("/v1/admin/budget", headers=admin())
    assert r.status_code == 200 and r.get_json() == {"ok": True, "budget": None}
    r = client.patch("/v1/admin/budget", json={"period": "month"}, headers=admin())
    assert r.status_code == 400 and error_code(r) == "invalid_request"
    r = client.patch(
        "/v1/admin/budget",
        json={"epsilon": 5.0, "delta": 1e-6, "period": "month"},
        headers=admin(),
    )
    assert r.status_code == 200
    budget = r.get_json()["budget"]
    assert (budget["name"], budget["epsilon"], budget["period"]) == ("(global)", 5.0, "month")
    assert budget["period_ends_at"] is not None
    r = client.patch("/v1/admin/budget", json={"epsilon": 6.0}, headers=admin())
    assert r.get_json()["budget"]["epsilon"] == 6.0
    assert r.get_json()["budget"]["period"] == "month"
    listed = client.get("/v1/admin/analysts", headers=admin()).get_json()
    assert listed["global"]["epsilon"] == 6.0
    assert client.get("/v1/admin/budget", headers=admin()).get_json()["budget"] == listed["global"]
    r = client.patch("/v1/admin/budget", json={"colour": "red"}, headers=admin())
    assert r.status_code == 400
    assert client.get("/v1/admin/budget", headers=admin("wrong")).status_code == 401
