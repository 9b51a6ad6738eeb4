"""Operations layer in one process: request ids, logs, metrics, readiness, rate limits.

The app here is a stand-in with the same contract as gateway.http.app (a Gateway in
``app.extensions["dpgate"]``, a GatewayError handler that adds the request record's id), so
these tests pin the operations layer on its own; tests/test_serve.py runs the real
thing under gunicorn.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from flask import Flask, g, jsonify

import budget
from gateway.core.errors import (
    BudgetExhausted,
    DatabaseUnavailable,
    GatewayError,
    LedgerUnavailable,
    RateLimited,
)
from gateway.http.ops import check_rate_limit, install_operations
from gateway.ops.logs import ACCESS_LOGGER
from gateway.ops.ratelimit import RateLimiter
from gateway.pipeline.identity import Principal

SECRET_VALUE = "Meningitis-4242"  # stands for a value read from protected rows


class FakeGateway:
    def __init__(self, ledger: budget.Ledger, limits: SimpleNamespace) -> None:
        self.ledger = ledger
        self.config = SimpleNamespace(limits=limits, ledger=SimpleNamespace(url="unused"))
        self.checks = {"database": True, "ledger": True}

    def ready(self) -> dict[str, bool]:
        return dict(self.checks)


def make_app(tmp_path: Path, *, address: int | None = None, analyst: int | None = None) -> Flask:
    ledger = budget.Ledger.from_url(f"sqlite:///{tmp_path / 'ledger.db'}")
    app = Flask("ops_test")
    app.extensions["dpgate"] = FakeGateway(
        ledger, SimpleNamespace(address_per_minute=address, analyst_per_minute=analyst)
    )

    @app.errorhandler(GatewayError)
    def render(err: GatewayError) -> Any:
        body = err.to_dict()
        body["error"]["detail"]["request_id"] = g.record.request_id
        return jsonify(body), err.status

    @app.post("/v1/query")
    def query() -> Any:
        rec = g.record
        rec.principal = Principal("alice", is_admin=False)
        check_rate_limit("alice")
        rec.sql = "SELECT disease, COUNT(*) FROM patients GROUP BY disease"
        if app.config.get("FAIL"):
            raise app.config["FAIL"]
        rec.outcome = "answered"
        rec.epsilon_spent = app.config.get("CHARGE", 0.25)
        return jsonify({"ok": True, "rows": [[SECRET_VALUE, 12]]})

    install_operations(app)
    return app


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        from gateway.ops.logs import JsonFormatter

        self.lines.append(json.loads(JsonFormatter().format(record)))


@pytest.fixture
def access_log() -> Iterator[Lines]:
    handler = Lines()
    logger = logging.getLogger(ACCESS_LOGGER)
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)


def metric(text: str, name: str, **labels: str) -> float:
    """The sum of the samples matching ``labels`` in Prometheus text (0 if none)."""
    total = 0.0
    for line in text.splitlines():
        m = re.match(r"^(\w+)(?:\{(.*)\})? (\S+)$", line)
        if not m or m.group(1) != name:
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        if all(got.get(k) == v for k, v in labels.items()):
            total += float(m.group(3))
    return total


def test_every_response_has_a_request_id_and_errors_carry_it(
    tmp_path: Path, access_log: Lines
) -> None:
    app = make_app(tmp_path)
    client = app.test_client()
    ok = client.get("/healthz")
    assert re.fullmatch(r"[0-9a-f]{32}", ok.headers["X-Request-Id"])
    app.config["FAIL"] = BudgetExhausted("the query does not fit the budget")
    failed = client.post("/v1/query", json={"sql": "…"})
    assert failed.status_code == 403
    rid = failed.headers["X-Request-Id"]
    assert failed.json["error"]["detail"]["request_id"] == rid
    assert rid != ok.headers["X-Request-Id"]
    line = next(e for e in access_log.lines if e.get("request_id") == rid)
    assert line["error_code"] == "budget_exhausted"
    assert line["status"] == 403
    assert line["analyst"] == "alice"
    assert line["sql"].startswith("SELECT disease")
    assert line["path"] == "/v1/query"
    assert line["duration_ms"] >= 0


def test_logs_never_carry_released_rows(tmp_path: Path, access_log: Lines) -> None:
    client = make_app(tmp_path).test_client()
    response = client.post("/v1/query", json={"sql": "…"})
    assert SECRET_VALUE in response.get_data(as_text=True)
    assert access_log.lines
    assert all(SECRET_VALUE not in json.dumps(line) for line in access_log.lines)
    assert access_log.lines[-1]["query_outcome"] == "answered"
    assert access_log.lines[-1]["epsilon_spent"] == 0.25


def test_the_access_log_shows_the_charge_rounded_for_display(
    tmp_path: Path, access_log: Lines
) -> None:
    """A charge that floating-point sums leave as 0.7000000000000001 (0.1 * 7) is logged
    as the 0.7 the budget shows (12 significant digits, as budget figures in JSON)."""
    app = make_app(tmp_path)
    app.config["CHARGE"] = 0.1 * 7
    assert app.config["CHARGE"] != 0.7
    app.test_client().post("/v1/query", json={"sql": "…"})
    assert access_log.lines[-1]["epsilon_spent"] == 0.7


def test_metrics_count_requests_queries_refusals_and_backend_errors(tmp_path: Path) -> None:
    app = make_app(tmp_path)
    client = app.test_client()
    before = client.get("/metrics").get_data(as_text=True)
    client.post("/v1/query", json={})
    app.config["FAIL"] = BudgetExhausted("no")
    client.post("/v1/query", json={})
    app.config["FAIL"] = DatabaseUnavailable("down")
    client.post("/v1/query", json={})
    after = client.get("/metrics").get_data(as_text=True)

    def delta(name: str, **labels: str) -> float:
        return metric(after, name, **labels) - metric(before, name, **labels)

    assert delta("dpgate_queries_total", analyst="alice", outcome="answered") == 1
    assert delta("dpgate_queries_total", analyst="alice", outcome="budget_exhausted") == 1
    assert delta("dpgate_epsilon_charged_total", analyst="alice") == pytest.approx(0.25)
    assert delta("dpgate_backend_errors_total", backend="database") == 1
    assert delta("dpgate_http_requests_total", endpoint="/v1/query", status="403") == 1
    assert delta("dpgate_http_request_duration_seconds_count", endpoint="/v1/query") == 3
    assert "alice" in after and "Bearer" not in after


def test_metric_labels_stay_bounded_whatever_clients_send(tmp_path: Path) -> None:
    client = make_app(tmp_path).test_client()
    for i in range(3):
        client.open(f"/random/path/{i}", method=f"BREW{i}")
    text = client.get("/metrics").get_data(as_text=True)
    assert "BREW" not in text and "/random/path" not in text
    assert metric(text, "dpgate_http_requests_total", endpoint="<unmatched>", method="OTHER") >= 3


def test_readiness_reports_which_backend_is_down(tmp_path: Path) -> None:
    app = make_app(tmp_path)
    client = app.test_client()
    assert client.get("/readyz").json == {"ok": True, "checks": {"database": True, "ledger": True}}
    gateway: FakeGateway = app.extensions["dpgate"]
    gateway.checks["ledger"] = False
    r = client.get("/readyz")
    assert r.status_code == 503 and r.json["error"]["code"] == "ledger_unavailable"
    gateway.checks["database"] = False
    r = client.get("/readyz")
    assert r.status_code == 503 and r.json["error"]["code"] == "database_unavailable"
    assert r.json["error"]["detail"]["request_id"] == r.headers["X-Request-Id"]
    assert client.get("/healthz").status_code == 200  # liveness is the process only


def test_address_limit_refuses_exactly_the_overflow_with_retry_after(tmp_path: Path) -> None:
    client = make_app(tmp_path, address=5).test_client()
    statuses = [client.post("/v1/query", json={}).status_code for _ in range(8)]
    assert statuses.count(200) == 5 and statuses.count(429) == 3
    r = client.post("/v1/query", json={})
    assert r.json["error"]["code"] == "rate_limited"
    assert r.json["error"]["detail"]["scope"] == "address"
    assert 1 <= int(r.headers["Retry-After"]) <= 60
    assert r.json["error"]["detail"]["retry_after"] == int(r.headers["Retry-After"])
    # Probes and scrapes are never limited.
    assert all(client.get(p).status_code == 200 for p in ["/healthz", "/metrics"] * 5)


def test_analyst_limit_applies_after_authentication(tmp_path: Path) -> None:
    client = make_app(tmp_path, analyst=3).test_client()
    statuses = [client.post("/v1/query", json={}).status_code for _ in range(5)]
    assert statuses == [200, 200, 200, 429, 429]


def exactness(engine: Any) -> None:
    """6 workers, 10 hits each, a limit of 37, the table not created yet: 23 refusals."""
    now = [time.time() // 60 * 60 + 1.5]
    limiters = [
        RateLimiter(engine, address_per_minute=None, analyst_per_minute=37, clock=lambda: now[0])
        for _ in range(6)
    ]
    bob, carol = f"bob-{uuid.uuid4().hex}", f"carol-{uuid.uuid4().hex}"
    refused: list[int] = []

    def burst(limiter: RateLimiter) -> None:
        for _ in range(10):
            try:
                limiter.hit("analyst", bob)
            except RateLimited as e:
                refused.append(e.detail["retry_after"])

    threads = [threading.Thread(target=burst, args=(limiter,)) for limiter in limiters]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(refused) == 60 - 37
    assert set(refused) == {59}  # 58.5 s left in the window, rounded up
    limiters[0].hit("analyst", carol)  # counted separately
    now[0] += 60
    limiters[1].hit("analyst", bob)  # a new window


def test_limiter_is_exact_under_concurrency_and_resets_each_minute(tmp_path: Path) -> None:
    exactness(budget.Ledger.from_url(f"sqlite:///{tmp_path / 'ledger.db'}").engine)


@pytest.mark.postgres
def test_limiter_is_exact_under_concurrency_on_postgresql(postgres_url: str) -> None:
    from sqlalchemy import text

    ledger = budget.Ledger.from_url(postgres_url)
    with ledger.engine.begin() as conn:
        conn.execute(text("DROP TABLE IF EXISTS dpgate_rate_limits"))
    try:
        exactness(ledger.engine)
    finally:
        ledger.close()


def test_limiter_fails_closed_without_its_ledger(tmp_path: Path) -> None:
    from sqlalchemy import create_engine

    engine = create_engine(f"sqlite:///{tmp_path / 'missing' / 'ledger.db'}")
    limiter = RateLimiter(engine, address_per_minute=1, analyst_per_minute=None)
    with pytest.raises(LedgerUnavailable):
        limiter.hit("address", "127.0.0.1")
