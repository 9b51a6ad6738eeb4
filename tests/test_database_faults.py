"""The protected database lost and back (issue 36), under concurrent queries: a SQLite
file removed (its pooled connections closed, as when they are recycled) and put back,
then locked by a writer and released; a PostgreSQL database whose sessions are
terminated and which is dropped and created again. No HTTP 500: a query that could not
reach the database is a 503 that says nothing was charged (and is refunded), one that
reached it and failed is a 503 that says it was charged; every ``detail.charged``
agrees with the ledger, the ledger's charges are exactly the ones the clients were told
of (each query has its own ε), no charge stays ``pending``, and queries are answered
again once the database is back — without a restart.

Real databases only: the demo data in a SQLite file, and in a scratch PostgreSQL
database this test creates and drops (never the shared ``test`` database).
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from flask import Flask

from gateway.core.config_load import parse_config
from gateway.http.app import create_app
from gateway.pipeline.gateway import Gateway
from tests.conftest import ADMIN_KEY, POSTGRES_URL, demo_config_dict

SQL = "SELECT COUNT(*) FROM patients WHERE age > 40"
#: A statement blocked by a lock is cut here (charged: it reached the database).
STATEMENT_TIMEOUT_MS = 300
#: How long a recreated PostgreSQL database may take to answer again.
RESUME_S = 60.0


class Load:
    """Four clients asking one region at their own ε each until ``stop``."""

    def __init__(self, app: Flask, key: str) -> None:
        self.app, self.key = app, key
        self.results: list[tuple[float, int, dict[str, Any]]] = []
        self.stop = threading.Event()
        self.pool = ThreadPoolExecutor(4)
        self.futures = [self.pool.submit(self._run, w) for w in range(4)]

    def _run(self, worker: int) -> None:
        client = self.app.test_client()
        i = 0
        while not self.stop.is_set():
            epsilon = round(0.01 + (100_000 * worker + i) * 1e-7, 9)
            resp = client.post(
                "/v1/query",
                json={"sql": SQL, "epsilon": epsilon},
                headers={"Authorization": f"Bearer {self.key}"},
            )
            self.results.append((epsilon, resp.status_code, resp.get_json()))
            i += 1

    def finish(self) -> list[tuple[float, int, dict[str, Any]]]:
        self.stop.set()
        for f in self.futures:
            f.result()
        self.pool.shutdown()
        return self.results


def check_truthful(gateway: Gateway, results: list[tuple[float, int, dict[str, Any]]]) -> None:
    """No 500; each error is a 503 saying whether it was charged; the ledger agrees."""
    statuses = [s for _, s, _ in results]
    assert 500 not in statuses, [b for _, s, b in results if s == 500][:3]
    told: list[float] = []
    for epsilon, status, body in results:
        if status == 200:
            told.append(epsilon)
            continue
        assert status == 503 and body["error"]["code"] == "database_unavailable", body
        charged = body["error"]["detail"].get("charged")
        assert isinstance(charged, bool), body
        if charged:
            told.append(epsilon)
    entries = gateway.ledger.history("alice", limit=100_000)
    assert not [e for e in entries if e.outcome == "pending"]
    counted = [e for e in entries if e.outcome not in ("refused", "refunded")]
    assert sorted(round(e.cost.epsilon, 9) for e in counted) == sorted(told)
    refunded = [e for e in entries if e.outcome == "refunded"]
    uncharged = [b for _, s, b in results if s == 503 and not b["error"]["detail"]["charged"]]
    assert len(refunded) == len(uncharged)


@pytest.fixture
def build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Callable[[str], Gateway]:
    monkeypatch.setenv("DPGATE_ADMIN_KEY", ADMIN_KEY)

    def gateway_on(database_url: str) -> Gateway:
        raw = demo_config_dict(tmp_path / "unused.db", tmp_path / "ledger.db")
        raw["database"] = {"url": database_url, "statement_timeout_ms": STATEMENT_TIMEOUT_MS}
        raw["audit"] = {**raw.get("audit", {}), "mode": "refuse"}
        return Gateway(parse_config(raw))

    return gateway_on


def test_a_sqlite_database_removed_and_locked_answers_truthful_503s(
    demo_db: Path, tmp_path: Path, build: Callable[[str], Gateway]
) -> None:
    db = tmp_path / "hospital.db"
    shutil.copy(demo_db, db)
    gateway = build(f"sqlite:///{db}")
    key = gateway.ledger.create_analyst("alice", 1000.0, 1e-6)
    app = create_app(gateway.config, gateway=gateway)
    ready = app.test_client()
    load = Load(app, key)
    try:
        load.stop.wait(1.0)
        # Removed: the file is gone; pooled connections are closed as a recycle would.
        moved = tmp_path / "moved.db"
        os.rename(db, moved)
        gateway.engine.dispose()
        load.stop.wait(1.0)
        removed = ready.get("/readyz")
        os.rename(moved, db)
        load.stop.wait(1.0)
        back = ready.get("/readyz")
        # Locked: a writer holds an exclusive lock for longer than a statement may wait.
        writer = sqlite3.connect(db, isolation_level=None)
        writer.execute("PRAGMA journal_mode = DELETE")
        writer.execute("BEGIN EXCLUSIVE")
        load.stop.wait(1.5)
        writer.execute("ROLLBACK")
        writer.close()
        load.stop.wait(1.0)
    finally:
        results = load.finish()
    assert removed.status_code == 503 and back.status_code == 200
    codes = {(s, (b.get("error") or {}).get("detail", {}).get("charged")) for _, s, b in results}
    assert (503, False) in codes  # removed: nothing reached the database, refunded
    assert (503, True) in codes  # locked: the statement was sent, then cut
    assert results[-1][1] == 200, results[-1]  # answered again, no restart
    check_truthful(gateway, results)


def _copy_demo(demo_db: Path, url: str) -> None:
    """The demo tables and rows, into the (empty) PostgreSQL database at ``url``."""
    source = sa.create_engine(f"sqlite:///{demo_db}")
    target = sa.create_engine(url)
    meta = sa.MetaData()
    meta.reflect(source)
    with source.connect() as src, target.begin() as dst:
        for table in meta.sorted_tables:
            columns = [
                sa.Column(c.name, sa.Boolean() if c.name == "smoker" else c.type)
                for c in table.columns
            ]
            copy = sa.Table(table.name, sa.MetaData(), *columns)
            copy.create(dst)
            rows = [dict(r._mapping) for r in src.execute(sa.select(table))]
            for r in rows:
                if "smoker" in r:
                    r["smoker"] = None if r["smoker"] is None else bool(r["smoker"])
            if rows:
                dst.execute(copy.insert(), rows)
    source.dispose()
    target.dispose()


@pytest.fixture
def scratch_database(demo_db: Path) -> Iterator[tuple[str, Callable[[], None], Callable[[], None]]]:
    """A PostgreSQL database of its own holding the demo data: its URL, ``drop`` (its
    sessions terminated, then dropped) and ``recreate`` (created and loaded again)."""
    if not POSTGRES_URL:
        pytest.skip("set DPGATE_TEST_POSTGRES_URL to run PostgreSQL tests")
    name = "dpgate_fault_" + uuid.uuid4().hex[:10]
    admin = sa.create_engine(POSTGRES_URL, isolation_level="AUTOCOMMIT")
    url = sa.engine.make_url(POSTGRES_URL).set(database=name).render_as_string(False)

    def drop() -> None:
        with admin.connect() as conn:
            conn.exec_driver_sql(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                f"WHERE datname = '{name}' AND pid <> pg_backend_pid()"
            )
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def recreate() -> None:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        _copy_demo(demo_db, url)
        # as an admin restoring a database would: statistics and hint bits set now, not
        # by the first statements, which otherwise ran past the statement timeout for
        # half a minute on a slow 2-core machine under the suite's load (2026-11-28)
        loaded = sa.create_engine(url, isolation_level="AUTOCOMMIT")
        with loaded.connect() as conn:
            conn.exec_driver_sql("VACUUM ANALYZE")
        loaded.dispose()

    recreate()
    try:
        yield url, drop, recreate
    finally:
        drop()
        admin.dispose()


@pytest.mark.postgres
def test_a_postgres_database_dropped_and_back_answers_truthful_503s(
    scratch_database: tuple[str, Callable[[], None], Callable[[], None]],
    build: Callable[[str], Gateway],
) -> None:
    url, drop, recreate = scratch_database
    gateway = build(url)
    key = gateway.ledger.create_analyst("alice", 1000.0, 1e-6)
    app = create_app(gateway.config, gateway=gateway)
    ready = app.test_client()
    load = Load(app, key)
    try:
        load.stop.wait(1.0)
        drop()  # every session terminated, mid-statement or idle, then the database gone
        load.stop.wait(1.5)
        lost = ready.get("/readyz")
        recreate()
        back_at = len(load.results)
        # answers resume once it is back: how soon depends on the server — on a 2-core
        # machine a recreated database's statements ran past the 300 ms statement timeout
        # for up to ~5 s (2026-11-27, on the code before that day's changes too), so the
        # 1.5 s this test gave it failed in 5 of 7 runs
        waited = time.monotonic()
        while time.monotonic() - waited < RESUME_S and not any(
            s == 200 for _, s, _ in load.results[back_at:]
        ):
            load.stop.wait(0.1)
        back = ready.get("/readyz")
    finally:
        results = load.finish()
    assert lost.status_code == 503 and back.status_code == 200, (lost.json, back.json)
    codes = {(s, (b.get("error") or {}).get("detail", {}).get("charged")) for _, s, b in results}
    assert (503, False) in codes  # no database to connect to: refunded
    assert any(s == 200 for _, s, _ in results[back_at:]), results[-5:]
    check_truthful(gateway, results)
