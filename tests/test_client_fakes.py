"""A scripted stand-in for the gateway's HTTP API, for unit tests of the client only.

It speaks the public contract (docs/design.md, "HTTP contract") from canned answers;
the acceptance tests in ``test_client_e2e.py`` run against the real server.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import pytest

Answer = tuple[int, Any]
Handler = Callable[[dict[str, Any]], Answer]

SCHEMA = {
    "ok": True,
    "tables": [
        {
            "name": "patients",
            "schema": "main",
            "privacy_unit": "patient_id",
            "columns": [
                {"name": "patient_id", "type": "integer"},
                {"name": "age", "type": "integer", "lower": 0, "upper": 120},
                {"name": "sex", "type": "text", "values": ["F", "M"]},
                {"name": "glucose", "type": "real", "lower": 2.0, "upper": 20.0},
                {"name": "admitted", "type": "date", "nullable": False},
                {"name": "smoker", "type": "boolean"},
            ],
        },
        {"name": "visits", "columns": [{"name": "n", "type": "integer"}]},
    ],
}

BUDGET = {
    "ok": True,
    "analyst": "alice",
    "epsilon_total": 10.0,
    "epsilon_spent": 1.5,
    "epsilon_remaining": 8.5,
    "delta_total": 1e-6,
    "delta_spent": 0.0,
    "delta_remaining": 1e-6,
    "composition": "zcdp",
}


def released(columns: list[tuple[str, str]], rows: list[list[Any]], **extra: Any) -> Answer:
    body = {
        "ok": True,
        "query_id": "q-1",
        "cached": False,
        "columns": [{"name": n, "type": t} for n, t in columns],
        "rows": rows,
        "accuracy": {n: {"ci95_halfwidth": 5.99, "stddev": 2.04} for n, t in columns[-1:]},
        "privacy": {"mechanism": "laplace", "epsilon": 0.5, "delta": 0.0, "rho": 0.125},
        "budget": {
            "epsilon_spent": 2.0,
            "epsilon_remaining": 8.0,
            "delta_spent": 0.0,
            "delta_remaining": 1e-6,
        },
    }
    body.update(extra)
    return 200, body


def error(status: int, code: str, message: str, **detail: Any) -> Answer:
    return status, {
        "ok": False,
        "status": status,
        "error": {"code": code, "message": message, "detail": detail},
    }


@dataclass
class FakeGateway:
    """Routes (method, path) to canned answers and records every request it got."""

    url: str = ""
    routes: dict[tuple[str, str], Handler | Answer] = field(default_factory=dict)
    requests: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.routes.setdefault(("GET", "/v1/schema"), (200, SCHEMA))
        self.routes.setdefault(("GET", "/v1/budget"), (200, BUDGET))
        self.routes.setdefault(
            ("POST", "/v1/query"),
            released([("disease", "text"), ("n", "integer")], [["Crohn", 312]]),
        )

    @property
    def last(self) -> dict[str, Any]:
        return self.requests[-1]

    def app(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        length = int(environ.get("CONTENT_LENGTH") or 0)
        raw = environ["wsgi.input"].read(length) if length else b""
        request = {
            "method": environ["REQUEST_METHOD"],
            "path": environ["PATH_INFO"],
            "authorization": environ.get("HTTP_AUTHORIZATION"),
            "body": json.loads(raw) if raw else None,
        }
        self.requests.append(request)
        route = self.routes.get((request["method"], request["path"]))
        if route is None:
            status, body = error(404, "not_found", "no such endpoint")
        elif callable(route):
            status, body = route(request)
        else:
            status, body = route
        text = body if isinstance(body, str) else json.dumps(body)
        content_type = "text/html" if isinstance(body, str) else "application/json"
        start_response(f"{status} X", [("Content-Type", content_type)])
        return [text.encode()]


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def gateway() -> Iterator[FakeGateway]:
    fake = FakeGateway()
    server: WSGIServer = make_server("127.0.0.1", 0, fake.app, handler_class=_Quiet)
    fake.url = f"http://127.0.0.1:{server.server_port}"
    thread = threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        server.shutdown()
        server.server_close()


def test_the_fake_speaks_the_error_shape(gateway: FakeGateway) -> None:
    import urllib.error
    import urllib.request

    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(gateway.url + "/nope")
    assert json.loads(caught.value.read())["error"]["code"] == "not_found"
