"""The OpenAPI document is generated from the routes and cannot drift from them."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import jsonschema_rs
import pytest
from flask import Flask, jsonify

from gateway.core.errors import ALL_ERRORS, BudgetExhausted
from gateway.http.openapi import build_spec, document, undocumented_routes


def toy_app() -> Flask:
    app = Flask("toy")

    @app.get("/v1/things/<name>")
    @document(
        summary="one thing",
        auth="admin",
        responses={200: {"type": "object"}},
        errors=[BudgetExhausted],
    )
    def thing(name: str) -> Any:
        return jsonify({})

    @app.route("/v1/both", methods=["GET", "POST"])
    @document(summary="read", method="GET")
    def both() -> Any:
        return jsonify({})

    return app


def validator(spec: dict[str, Any], schema: dict[str, Any]) -> Any:
    """A JSON Schema validator for one of the spec's schemas, its $refs bundled in."""

    def local(node: Any) -> Any:
        return json.loads(json.dumps(node).replace("#/components/schemas/", "#/$defs/"))

    return jsonschema_rs.validator_for(
        {**local(schema), "$defs": local(spec["components"]["schemas"])}
    )


def test_paths_methods_and_parameters_come_from_the_url_map() -> None:
    spec = build_spec(toy_app())
    assert spec["openapi"].startswith("3.1")
    op = spec["paths"]["/v1/things/{name}"]["get"]
    assert op["parameters"] == [
        {
            "name": "name",
            "in": "path",
            "required": True,
            "schema": {"type": "string", "minLength": 1, "pattern": "^[^/]+$"},
        }
    ]
    assert op["security"] == [{"bearerAuth": []}]
    # Declared errors plus the ones every such operation can answer with.
    assert set(op["responses"]) == {"200", "401", "403", "404", "429", "500", "503"}
    forbidden = op["responses"]["403"]["content"]["application/json"]["schema"]
    assert forbidden["allOf"][1]["properties"]["error"]["properties"]["code"]["enum"] == [
        "budget_exhausted",
        "forbidden",
    ]
    assert "Retry-After" in op["responses"]["429"]["headers"]
    # A stopping `dpgate serve` answers any request with it (gateway/server/serve_workers.py).
    stopping = op["responses"]["503"]
    assert stopping["description"] == "shutting_down"
    assert "Retry-After" in stopping["headers"]


def test_an_undocumented_route_is_reported() -> None:
    app = toy_app()
    assert undocumented_routes(app) == ["POST /v1/both"]
    assert set(build_spec(app)["paths"]["/v1/both"]) == {"get"}


def test_the_envelope_schema_names_every_error_code() -> None:
    spec = build_spec(toy_app())
    codes = spec["components"]["schemas"]["ErrorCode"]["enum"]
    assert codes == [e.code for e in ALL_ERRORS]
    envelope = validator(spec, {"$ref": "#/components/schemas/Error"})
    for cls in ALL_ERRORS:
        assert envelope.is_valid(cls("message").to_dict())
    assert not envelope.is_valid({"ok": True})


# -- the real app ---------------------------------------------------------------------


@pytest.fixture
def app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Flask:
    from gateway.core.config_load import load_config
    from gateway.http.app import create_app

    monkeypatch.setenv("DPGATE_ADMIN_KEY", "admin-key-for-tests-0123456789")
    db = sqlite3.connect(tmp_path / "data.db")
    db.execute("CREATE TABLE patients (patient_id INTEGER, age INTEGER, disease TEXT)")
    db.executemany("INSERT INTO patients VALUES (?, ?, ?)", [(i, i % 90, "Flu") for i in range(50)])
    db.commit()
    db.close()
    (tmp_path / "dpgate.yaml").write_text(
        """
database: {url: "sqlite:///data.db"}
ledger: {url: "sqlite:///ledger.db"}
tables:
  patients:
    privacy_unit: patient_id
    columns:
      patient_id: {type: integer}
      age: {type: integer, lower: 0, upper: 120}
      disease: {type: text, values: [Flu, Cold]}
"""
    )
    app: Flask = create_app(load_config(tmp_path / "dpgate.yaml"))
    return app


def test_every_route_of_the_real_app_is_documented(app: Flask) -> None:
    assert undocumented_routes(app) == []
    spec = app.test_client().get("/openapi.json").json
    served = {str(rule.rule) for rule in app.url_map.iter_rules() if rule.endpoint != "static"}
    documented = {p.replace("{", "<").replace("}", ">") for p in spec["paths"]}
    assert served == documented
    for path in ["/v1/query", "/v1/budget", "/v1/schema", "/v1/queries", "/healthz", "/readyz"]:
        assert path in spec["paths"]
    json.dumps(spec)  # serialisable as is


def test_error_responses_of_the_real_app_match_their_documented_schema(app: Flask) -> None:
    client = app.test_client()
    spec = client.get("/openapi.json").json

    def check(method: str, path: str, rule: str, **kw: Any) -> None:
        response = getattr(client, method)(path, **kw)
        documented = spec["paths"][rule][method]["responses"]
        assert str(response.status_code) in documented, (path, response.status_code)
        schema = documented[str(response.status_code)]["content"]["application/json"]["schema"]
        errors = [str(e) for e in validator(spec, schema).iter_errors(response.json)]
        assert errors == [], (path, response.json)

    check("post", "/v1/query", "/v1/query", json={"sql": "SELECT COUNT(*) FROM patients"})
    check("get", "/v1/budget", "/v1/budget", headers={"Authorization": "Bearer nope"})
    auth = {"Authorization": "Bearer admin-key-for-tests-0123456789"}
    check("get", "/v1/admin/analysts/nobody", "/v1/admin/analysts/{name}", headers=auth)
    check("get", "/readyz", "/readyz")
