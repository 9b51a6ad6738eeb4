"""The admin endpoints inside the real app (create_app): the admin manages analysts and
budgets over HTTP and the analyst endpoints see the effect at once."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from flask.testing import FlaskClient

if TYPE_CHECKING:
    from gateway.pipeline.gateway import Gateway

SQL = "SELECT COUNT(*) FROM patients WHERE age > {}"


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def admin_headers() -> dict[str, str]:
    return bearer(os.environ["DPGATE_ADMIN_KEY"])


def envelope(resp: Any, status: int, code: str) -> dict[str, Any]:
    body: dict[str, Any] = resp.get_json()
    assert resp.status_code == status, body
    assert body["ok"] is False and body["status"] == status
    assert body["error"]["code"] == code
    return body


def test_admin_manages_an_analyst_end_to_end(client: FlaskClient) -> None:
    resp = client.post(
        "/v1/admin/analysts",
        json={"name": "carol", "epsilon": 10.0, "delta": 1e-6},
        headers=admin_headers(),
    )
    assert resp.status_code == 201
    key = resp.get_json()["api_key"]
    assert (
        client.post("/v1/query", json={"sql": SQL.format(30)}, headers=bearer(key)).status_code
        == 200
    )

    # disabled: refused on every analyst endpoint, with nothing charged
    resp = client.patch(
        "/v1/admin/analysts/carol", json={"disabled": True}, headers=admin_headers()
    )
    assert resp.get_json()["analyst"]["disabled"] is True
    envelope(
        client.post("/v1/query", json={"sql": SQL.format(31)}, headers=bearer(key)),
        403,
        "forbidden",
    )
    envelope(client.get("/v1/budget", headers=bearer(key)), 403, "forbidden")
    client.patch("/v1/admin/analysts/carol", json={"disabled": False}, headers=admin_headers())
    budget = client.get("/v1/budget", headers=bearer(key)).get_json()["budget"]
    assert budget["queries"] == 1

    # rotation: the old key stops working at once
    resp = client.post("/v1/admin/analysts/carol/keys", headers=admin_headers())
    new_key = resp.get_json()["api_key"]
    envelope(client.get("/v1/budget", headers=bearer(key)), 401, "unauthenticated")
    assert client.get("/v1/budget", headers=bearer(new_key)).status_code == 200

    # lowering the budget below what is spent: the next query is budget_exhausted
    client.patch("/v1/admin/analysts/carol", json={"epsilon": 0.01}, headers=admin_headers())
    body = envelope(
        client.post("/v1/query", json={"sql": SQL.format(32)}, headers=bearer(new_key)),
        403,
        "budget_exhausted",
    )
    assert "remaining" in body["error"]["message"]
    listed = client.get("/v1/admin/analysts", headers=admin_headers()).get_json()["analysts"]
    assert [a["queries"] for a in listed if a["name"] == "carol"] == [1]


def test_admin_auth_in_the_app(client: FlaskClient, analyst_key: str) -> None:
    envelope(client.get("/v1/admin/analysts"), 401, "unauthenticated")
    envelope(client.get("/v1/admin/analysts", headers=bearer("nope")), 401, "unauthenticated")
    envelope(client.get("/v1/admin/analysts", headers=bearer(analyst_key)), 403, "forbidden")
    envelope(
        client.post("/v1/admin/analysts/alice/keys", headers=bearer(analyst_key)), 403, "forbidden"
    )
    body = envelope(
        client.patch("/v1/admin/analysts/nobody", json={"epsilon": 1}, headers=admin_headers()),
        404,
        "not_found",
    )
    assert "request_id" in body["error"]["detail"]
    envelope(
        client.post(
            "/v1/admin/analysts",
            json={"name": "alice", "epsilon": 1, "delta": 0},
            headers=admin_headers(),
        ),
        409,
        "conflict",
    )


def test_admin_routes_are_in_the_openapi_document(client: FlaskClient) -> None:
    paths = client.get("/openapi.json").get_json()["paths"]
    assert {"post", "get"} <= set(paths["/v1/admin/analysts"])
    assert "patch" in paths["/v1/admin/analysts/{name}"]
    assert "post" in paths["/v1/admin/analysts/{name}/keys"]
    assert "get" in paths["/v1/admin/audit-log"]


def test_every_request_is_in_the_audit_log(
    client: FlaskClient, analyst_key: str, gateway: Gateway
) -> None:
    client.post("/v1/query", json={"sql": SQL.format(40)}, headers=bearer(analyst_key))
    client.post("/v1/query", json={"sql": "SELEC nonsense"}, headers=bearer(analyst_key))
    client.post("/v1/query", json={"sql": SQL.format(41)}, headers=bearer("wrong"))
    entries = client.get("/v1/admin/audit-log", headers=admin_headers()).get_json()["entries"]
    statuses = sorted(e["status"] for e in entries if e["endpoint"].endswith("/v1/query"))
    assert statuses == [200, 400, 401]
