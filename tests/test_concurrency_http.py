"""Budgets over HTTP against a real multi-process server, and crash safety.

A real ``gunicorn -w 2`` serves a small SQLite table; the ledger is a SQLite file or a
PostgreSQL schema (when DPGATE_TEST_POSTGRES_URL is set).

- 32 concurrent clients send 4N distinct queries for an analyst whose budget fits exactly
  N: exactly N are answered, the rest are ``budget_exhausted``, and the ledger's spent
  is the sum of its rows.
- kill -9 of the whole server while clients stream queries, then a restart: every answer
  a client received is in the ledger, and spent == Σ ledger.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from budget import Ledger, cks_epsilon

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
ADMIN_KEY = "test-admin-" + uuid.uuid4().hex
N = 16
CLIENTS = 32
EPSILON = 0.1
DELTA_BUDGET = 1e-6

GUNICORN = str(Path(sys.executable).with_name("gunicorn"))
APP = "gateway.http.app:create_app_from_env()"

pytest.importorskip("gateway.http.app")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def request(
    port: int, method: str, path: str, body: Any = None, key: str | None = None
) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    try:
        conn.request(method, path, None if body is None else json.dumps(body), headers)
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read() or b"null")
    finally:
        conn.close()


def write_config(workdir: Path, ledger_url: str) -> Path:
    data = workdir / "data.db"
    if not data.exists():
        with sqlite3.connect(data) as db:
            db.execute("CREATE TABLE t (id INTEGER, x INTEGER)")
            db.executemany("INSERT INTO t VALUES (?, ?)", [(i, i % 100) for i in range(500)])
    config = workdir / "dpgate.yaml"
    config.write_text(
        json.dumps(
            {
                "database": {"url": f"sqlite:///{data}"},
                "ledger": {"url": ledger_url},
                "privacy": {"mechanism": "laplace", "epsilon": EPSILON, "composition": "zcdp"},
                "audit": {"mode": "off"},
                "tables": {
                    "t": {
                        "columns": {
                            "id": {"type": "integer", "lower": 0, "upper": 100_000},
                            "x": {"type": "integer", "lower": 0, "upper": 100},
                        }
                    }
                },
            }
        )
    )
    return config


@contextmanager
def server(workdir: Path, ledger_url: str) -> Iterator[tuple[int, subprocess.Popen[bytes]]]:
    """``gunicorn -w 2`` serving dpgate, in its own process group; yields (port, process)."""
    config = write_config(workdir, ledger_url)
    port = _free_port()
    env = {
        **os.environ,
        "DPGATE_CONFIG": str(config),
        "DPGATE_ADMIN_KEY": ADMIN_KEY,
        "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    log = open(workdir / "gunicorn.log", "ab")  # noqa: SIM115
    proc = subprocess.Popen(
        [GUNICORN, "-w", "2", "-b", f"127.0.0.1:{port}", APP],
        env=env,
        cwd=workdir,
        stdout=log,
        stderr=log,
        start_new_session=True,
    )
    try:
        deadline = time.time() + 60
        while True:
            assert proc.poll() is None, (workdir / "gunicorn.log").read_text()[-3000:]
            try:
                if request(port, "GET", "/healthz")[0] == 200:
                    break
            except OSError:
                pass
            assert time.time() < deadline, "the server did not start"
            time.sleep(0.1)
        yield port, proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        log.close()


def create_analyst(port: int, name: str, epsilon: float) -> str:
    status, body = request(
        port,
        "POST",
        "/v1/admin/analysts",
        {"name": name, "epsilon": epsilon, "delta": DELTA_BUDGET},
        ADMIN_KEY,
    )
    assert status == 201, body
    return str(body["api_key"])


def ledger_totals(url: str, analyst: str) -> tuple[float, int, dict[str, str]]:
    """Σρ of charges minus refunds, the charges not refunded, and each charge's outcome."""
    engine = sa.create_engine(url)
    with engine.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT l.kind, l.rho, l.reservation_id, l.settles FROM dpgate_ledger l "
                "JOIN dpgate_analysts a ON a.id = l.analyst_id WHERE a.name = :name"
            ),
            {"name": analyst},
        ).all()
    engine.dispose()
    outcome: dict[str, str] = {}
    rho = 0.0
    for kind, r, rid, settles in rows:
        rho += r
        if kind == "charge":
            outcome.setdefault(rid, "pending")
        else:
            outcome[settles] = kind
    live = sum(1 for o in outcome.values() if o != "refund")
    return rho, live, outcome


def parallel(clients: int, work: Callable[[int], None]) -> None:
    start = threading.Barrier(clients)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        start.wait()
        try:
            work(i)
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_concurrent_clients_never_overspend_over_http(ledger_url: str, tmp_path: Path) -> None:
    rho_query = EPSILON**2 / 2
    with server(tmp_path, ledger_url) as (port, _):
        # zcdp converts Σρ at the δ left after partition selection's half (accountants)
        budget_eps = cks_epsilon(N * rho_query, DELTA_BUDGET / 2) * (1 + 1e-12)
        key = create_analyst(port, "alice", budget_eps)
        outcomes: Counter[str] = Counter()
        answered_ids: list[str] = []
        lock = threading.Lock()
        per_client = 4 * N // CLIENTS

        def work(i: int) -> None:
            for j in range(per_client):
                sql = f"SELECT COUNT(*) FROM t WHERE id >= {i * per_client + j}"
                status, body = request(port, "POST", "/v1/query", {"sql": sql}, key)
                with lock:
                    if status == 200:
                        outcomes["answered"] += 1
                        answered_ids.append(body["query_id"])
                    else:
                        outcomes[f"{status} {body['error']['code']}"] += 1

        parallel(CLIENTS, work)
        assert outcomes == {"answered": N, "403 budget_exhausted": 3 * N}
        status, body = request(port, "GET", "/v1/budget", key=key)
        assert status == 200
        budget = body["budget"]
    rho, live, outcome = ledger_totals(ledger_url, "alice")
    assert live == N == budget["queries"]
    assert rho == pytest.approx(budget["rho_spent"]) == pytest.approx(N * rho_query)
    assert budget["rho_spent"] <= budget["rho_budget"] * (1 + 1e-10)
    assert all(outcome[q] == "answered" for q in answered_ids)


def test_kill_9_mid_stream_loses_no_charge(ledger_url: str, tmp_path: Path) -> None:
    received: list[str] = []
    lock = threading.Lock()
    with server(tmp_path, ledger_url) as (port, proc):
        key = create_analyst(port, "bob", 1000.0)
        stop = threading.Event()

        def stream(i: int) -> None:
            j = 0
            while not stop.is_set():
                sql = f"SELECT COUNT(*) FROM t WHERE id >= {i * 100_000 // 8 + j}"
                j += 1
                try:
                    status, body = request(port, "POST", "/v1/query", {"sql": sql}, key)
                except (OSError, http.client.HTTPException, json.JSONDecodeError):
                    continue  # the server died under this request: no answer received
                if status == 200:
                    with lock:
                        received.append(body["query_id"])

        threads = [threading.Thread(target=stream, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        deadline = time.time() + 60
        while len(received) < 40 and time.time() < deadline:
            time.sleep(0.01)
        os.killpg(proc.pid, signal.SIGKILL)  # master and workers, mid-stream
        proc.wait()
        stop.set()
        for t in threads:
            t.join()
    assert len(received) >= 40
    with server(tmp_path, ledger_url) as (port, _):
        status, body = request(port, "GET", "/v1/budget", key=key)
        assert status == 200
        budget = body["budget"]
        status, _ = request(port, "POST", "/v1/query", {"sql": "SELECT COUNT(*) FROM t"}, key)
        assert status == 200
    rho, live, outcome = ledger_totals(ledger_url, "bob")
    print("outcomes after the crash:", Counter(outcome.values()), "received:", len(received))
    missing = [q for q in received if q not in outcome]
    assert missing == [], "answers were received whose charge is not in the ledger"
    assert all(outcome[q] in ("answered", "pending") for q in received)
    assert live == budget["queries"] + 1
    assert rho == pytest.approx(budget["rho_spent"] + EPSILON**2 / 2)
    led = Ledger.from_url(ledger_url)
    assert led.budget_status("bob").rho_spent == pytest.approx(rho)
    led.close()
