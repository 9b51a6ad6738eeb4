"""What an operator scrapes from ``/metrics`` tells a tight deadline from an outage, and
shows the waits that queue requests: a deadline miss, a query queued on its audit
scope's lock and a burst that exhausts the ledger's connection pool each land in a
metric of their own (docs/operations.md, "Alerts")."""

from __future__ import annotations

import shutil
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from gateway.core.config_load import parse_config
from gateway.pipeline.gateway import Gateway
from tests.conftest import ADMIN_KEY, demo_config_dict
from tests.test_ops import metric

SQL = "SELECT COUNT(*) FROM patients"
HOLD_S = 0.4  # how long the test holds what a request then waits for


def _many_patients(db: Path) -> None:
    """200k more rows: the COUNT's bounded statement cannot finish in 1 ms."""
    with sqlite3.connect(db) as conn:
        columns = [r[1] for r in conn.execute("PRAGMA table_info(patients)")]
        values = ", ".join(c if c != "patient_id" else "patient_id + 1000000 * k" for c in columns)
        conn.execute(
            "WITH RECURSIVE n(k) AS (SELECT 1 UNION ALL SELECT k + 1 FROM n WHERE k < 66) "
            f"INSERT INTO patients ({', '.join(columns)}) SELECT {values} FROM patients, n"
        )


def _scrape(client: Any) -> str:
    return str(client.get("/metrics").get_data(as_text=True))


def test_deadline_miss_audit_lock_wait_and_ledger_burst_each_have_their_metric(
    demo_db: Path, tmp_path: Path, ledger_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:

    monkeypatch.setenv("DPGATE_ADMIN_KEY", ADMIN_KEY)
    db = tmp_path / "many.db"
    shutil.copy(demo_db, db)
    _many_patients(db)
    raw = demo_config_dict(
        db, tmp_path / "unused.db", execution={"timing": "deadline", "deadline_ms": 1}
    )
    raw["ledger"] = {"url": ledger_url}
    raw["audit"] = {**raw.get("audit", {}), "mode": "refuse"}
    gateway = Gateway(parse_config(raw))
    try:
        _miss_wait_and_burst(gateway, ledger_url)
    finally:
        # the ledger's writers done before the fixture drops its schema (a PostgreSQL
        # ledger: a DROP SCHEMA racing a queued outcome's insert deadlocked, once in CI)
        gateway.ledger.close()


def _miss_wait_and_burst(gateway: Gateway, ledger_url: str) -> None:
    from gateway.http.app import create_app

    key = gateway.ledger.create_analyst("alice", 10.0, 1e-6)
    client = create_app(gateway.config, gateway=gateway).test_client()
    auth = {"Authorization": f"Bearer {key}"}
    before = _scrape(client)

    # 1. A deadline miss: charged, the analyst's usual 503 — and no backend error.
    miss = client.post("/v1/query", json={"sql": SQL, "epsilon": 0.1}, headers=auth)
    assert miss.status_code == 503 and miss.json["error"]["detail"].get("charged") is True
    # 2. A query queued on alice's audit lock, held here for HOLD_S.
    answers: list[int] = []

    def ask(sql: str) -> None:
        r = client.post("/v1/query", json={"sql": sql, "epsilon": 0.1}, headers=auth)
        answers.append(r.status_code)

    with gateway.ledger.scope_lock("alice"):
        queued = threading.Thread(target=ask, args=("SELECT COUNT(*) FROM patients WHERE 1=1",))
        queued.start()
        time.sleep(HOLD_S)
    queued.join(30)
    assert answers, "the queued query never finished"
    # 3. A ledger burst: every pooled connection taken, then a request needs one.
    burst = ledger_url.startswith("postgresql")
    if burst:
        engine = gateway.ledger.engine
        pool = engine.pool
        capacity = pool.size() + pool._max_overflow  # type: ignore[attr-defined]
        held = [engine.connect() for _ in range(capacity)]
        in_burst = _scrape(client)
        done: list[int] = []
        reader = threading.Thread(
            target=lambda: done.append(client.get("/v1/budget", headers=auth).status_code)
        )
        reader.start()
        time.sleep(HOLD_S)
        for conn in held:
            conn.close()
        reader.join(30)
        assert done == [200]
    after = _scrape(client)

    def delta(name: str, **labels: str) -> float:
        return metric(after, name, **labels) - metric(before, name, **labels)

    assert delta("dpgate_deadline_misses_total", table="patients") >= 1
    assert delta("dpgate_statements_past_deadline_total", table="patients") >= 1
    assert delta("dpgate_statement_failures_total", cause="timeout") >= 1
    assert delta("dpgate_backend_errors_total", backend="database") == 0  # not an outage
    assert delta("dpgate_audit_lock_wait_seconds_count") >= 2
    assert delta("dpgate_audit_lock_wait_seconds_sum") >= HOLD_S * 0.9
    assert metric(after, "dpgate_build_info") == 1
    if burst:
        assert metric(in_burst, "dpgate_ledger_pool_in_use") >= capacity
        assert metric(in_burst, "dpgate_ledger_pool_capacity") >= capacity
        assert delta("dpgate_ledger_pool_wait_seconds_sum") >= HOLD_S * 0.9
        assert metric(after, "dpgate_ledger_pool_in_use") < capacity


def test_an_unreachable_database_is_still_a_backend_error(
    make_gateway: Callable[..., Gateway], tmp_path: Path
) -> None:
    """The outage alert keeps firing for an outage: a database that cannot be reached
    (refunded) counts in dpgate_backend_errors_total{backend="database"}."""
    from gateway.http.app import create_app

    gateway = make_gateway()
    key = gateway.ledger.create_analyst("alice", 10.0, 1e-6)
    client = create_app(gateway.config, gateway=gateway).test_client()
    before = _scrape(client)
    gateway.engine.dispose()
    (Path(str(gateway.config.database.url).removeprefix("sqlite:///"))).unlink()
    r = client.post(
        "/v1/query", json={"sql": SQL, "epsilon": 0.1}, headers={"Authorization": f"Bearer {key}"}
    )
    assert r.status_code == 503
    assert not r.json["error"]["detail"].get("charged")
    after = _scrape(client)
    assert metric(after, "dpgate_backend_errors_total", backend="database") - metric(
        before, "dpgate_backend_errors_total", backend="database"
    ) == pytest.approx(1)


def test_a_late_answer_says_where_the_work_after_its_statement_went(
    demo_db: Path,
    tmp_path: Path,
    ledger_url: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An answer ready only after its release moment (a `release` miss: it leaves late)
    is logged with how late it was and the phases after its statement — noise, the turn,
    the post-audit, the record — each also in ``dpgate_statement_phase_seconds``, so that
    an operator sees which of them outran the time kept for them."""
    from gateway.http.app import create_app
    from gateway.pipeline.audit_policy import AuditPolicy

    monkeypatch.setenv("DPGATE_ADMIN_KEY", ADMIN_KEY)
    raw = demo_config_dict(demo_db, tmp_path / "unused.db", execution={"timing": "deadline"})
    raw["ledger"] = {"url": ledger_url}
    gateway = Gateway(parse_config(raw))
    key = gateway.ledger.create_analyst("alice", 10.0, 1e-6)
    client = create_app(gateway.config, gateway=gateway).test_client()
    auth = {"Authorization": f"Bearer {key}"}
    before = _scrape(client)
    after_audit = AuditPolicy.after

    def slow_post_audit(self: AuditPolicy, *args: Any, **kwargs: Any) -> Any:
        time.sleep(HOLD_S)  # far past the time kept after a COUNT's statement
        return after_audit(self, *args, **kwargs)

    monkeypatch.setattr(AuditPolicy, "after", slow_post_audit)
    with caplog.at_level("WARNING", logger="dpgate"):
        late = client.post("/v1/query", json={"sql": SQL, "epsilon": 0.1}, headers=auth)
    assert late.status_code == 200  # late, not failed: nothing about it depends on the rows
    said = [r.getMessage() for r in caplog.records if "after its release moment" in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in caplog.records]
    assert "kept after its statement" in said[0]
    post_audit = float(said[0].split("post audit ")[1].split(" ms")[0])
    assert post_audit >= HOLD_S * 1000 * 0.9
    assert "noise " in said[0] and "turn " in said[0] and "record " in said[0]
    after = _scrape(client)

    def delta(name: str, **labels: str) -> float:
        return metric(after, name, **labels) - metric(before, name, **labels)

    assert delta("dpgate_deadline_misses_total", stage="release", table="patients") == 1
    for phase in ("noise", "turn", "post_audit", "record"):
        assert delta("dpgate_statement_phase_seconds_count", phase=phase) == 1
    assert delta("dpgate_statement_phase_seconds_sum", phase="post_audit") >= HOLD_S * 0.9
