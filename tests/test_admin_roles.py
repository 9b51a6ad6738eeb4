"""Issue 39: named admins, each with its own key, with the role ``admin`` (everything) or
``auditor`` (reads only: 403 ``forbidden`` on every write); the env key stays the
bootstrap admin; every row of the audit log names the admin who acted."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from flask import Flask
from flask.testing import FlaskClient

from gateway.cli.admin import register_admin_commands
from gateway.http.app import create_app
from gateway.pipeline.gateway import Gateway
from tests.conftest import ADMIN_KEY
from tests.test_audit_trail import cli_config


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
def app(make_gateway: Callable[..., Gateway]) -> Flask:
    gateway = make_gateway(analysts=[])
    return create_app(gateway.config, gateway=gateway)


def _new_admin(client: FlaskClient, name: str, role: str) -> str:
    r = client.post(
        "/v1/admin/admins", json={"name": name, "role": role}, headers=bearer(ADMIN_KEY)
    )
    assert r.status_code == 201, r.get_json()
    return str(r.get_json()["api_key"])


def _write_routes(app: Flask) -> list[tuple[str, str]]:
    routes = []
    for rule in app.url_map.iter_rules():
        if not rule.rule.startswith("/v1/admin"):
            continue
        for method in sorted((rule.methods or set()) - {"GET", "HEAD", "OPTIONS"}):
            routes.append((method, rule.rule.replace("<name>", "ann")))
    return routes


def test_an_auditor_reads_and_is_forbidden_every_write(app: Flask) -> None:
    client = app.test_client()
    ok = client.post(
        "/v1/admin/analysts",
        json={"name": "ann", "epsilon": 1, "delta": 0},
        headers=bearer(ADMIN_KEY),
    )
    assert ok.status_code == 201
    key = _new_admin(client, "ivy", "auditor")
    routes = _write_routes(app)
    assert len(routes) >= 6  # analysts, analyst, keys, budget, admins, admin
    for method, path in routes:
        r = client.open(path, method=method, json={"epsilon": 5}, headers=bearer(key))
        assert r.status_code == 403, (method, path)
        assert r.get_json()["error"]["code"] == "forbidden"
    for path in (
        "/v1/admin/analysts",
        "/v1/admin/analysts/ann",
        "/v1/admin/budget",
        "/v1/admin/audit-log",
        "/v1/admin/admins",
    ):
        assert client.get(path, headers=bearer(key)).status_code == 200, path
    # nothing changed, and every attempt is in the log under the auditor's name
    status = client.get("/v1/admin/analysts/ann", headers=bearer(ADMIN_KEY)).get_json()
    assert status["analyst"]["epsilon"] == 1.0
    entries = client.get("/v1/admin/audit-log?actor=ivy", headers=bearer(ADMIN_KEY)).get_json()
    refused = [e for e in entries["entries"] if e["status"] == 403]
    assert len(refused) == len(routes)
    assert all(e["error_code"] == "forbidden" and e["outcome"] == "refused" for e in refused)
    # each refused row names the action that was attempted, as an allowed one would
    from gateway.http.admin import ACTIONS

    write_endpoints = {
        rule.endpoint.rpartition(".")[2]
        for rule in app.url_map.iter_rules()
        if rule.rule.startswith("/v1/admin")
        and (rule.methods or set()) - {"GET", "HEAD", "OPTIONS"}
    }
    assert sorted(e["action"] for e in refused) == sorted(ACTIONS[e] for e in write_endpoints)


def test_a_named_admin_acts_under_its_own_name(app: Flask) -> None:
    client = app.test_client()
    key = _new_admin(client, "root2", "admin")
    r = client.post(
        "/v1/admin/analysts", json={"name": "bo", "epsilon": 1, "delta": 0}, headers=bearer(key)
    )
    assert r.status_code == 201
    log = client.get("/v1/admin/audit-log", headers=bearer(ADMIN_KEY)).get_json()["entries"]
    creates = [(e["actor"], e["action"], e["params"]) for e in log if e["status"] == 201]
    assert creates == [
        ("root2", "analyst.create", {"name": "bo", "epsilon": 1.0, "delta": 0.0, "period": "none"}),
        ("admin", "admin.create", {"name": "root2", "role": "admin"}),
    ]
    assert key not in str(log)
    # an admin key is not an analyst's
    assert (
        client.post("/v1/query", json={"sql": "SELECT 1"}, headers=bearer(key)).status_code == 403
    )
    # demoted, then disabled: each takes effect on the next request
    r = client.patch("/v1/admin/admins/root2", json={"role": "auditor"}, headers=bearer(ADMIN_KEY))
    assert r.status_code == 200 and r.get_json()["admin"]["role"] == "auditor"
    r = client.patch("/v1/admin/analysts/bo", json={"epsilon": 2}, headers=bearer(key))
    assert r.status_code == 403
    client.patch("/v1/admin/admins/root2", json={"disabled": True}, headers=bearer(ADMIN_KEY))
    r = client.get("/v1/admin/analysts", headers=bearer(key))
    assert r.status_code == 403 and "disabled" in r.get_json()["error"]["message"]


def test_admin_names_and_roles_are_checked(app: Flask) -> None:
    client = app.test_client()
    for body in (
        {"name": "admin", "role": "admin"},
        {"name": "x", "role": "root"},
        {"name": "x"},
        {"name": "", "role": None},
        {"name": "x", "role": None},
        {"name": "-x", "role": "admin"},
    ):
        r = client.post("/v1/admin/admins", json=body, headers=bearer(ADMIN_KEY))
        assert r.status_code == 400, body
    _new_admin(client, "dup", "auditor")
    r = client.post(
        "/v1/admin/admins", json={"name": "dup", "role": "admin"}, headers=bearer(ADMIN_KEY)
    )
    assert r.status_code == 409
    r = client.patch("/v1/admin/admins/nobody", json={"role": "admin"}, headers=bearer(ADMIN_KEY))
    assert r.status_code == 404


def test_admin_commands(make_gateway: Callable[..., Gateway], tmp_path: Path) -> None:
    gateway = make_gateway(analysts=[])
    client = create_app(gateway.config, gateway=gateway).test_client()
    config = cli_config(tmp_path, gateway.config.ledger.url)

    @click.group()
    def dpgate() -> None:
        pass

    register_admin_commands(dpgate)

    def run(*args: str) -> str:
        result = CliRunner().invoke(dpgate, [*args, "--config", config])
        assert result.exit_code == 0, result.output
        return result.output

    key = run("admin", "add", "ola", "--role", "auditor", "--actor", "sam").strip().splitlines()[-1]
    assert client.get("/v1/admin/analysts", headers=bearer(key)).status_code == 200
    assert "ola  auditor" in run("admin", "list")
    run("admin", "disable", "ola")
    assert client.get("/v1/admin/analysts", headers=bearer(key)).status_code == 403
    log = gateway.ledger.audit_log(actor="cli:sam")
    assert [(e.action, e.params) for e in log] == [
        ("admin.create", {"name": "ola", "role": "auditor"})
    ]
