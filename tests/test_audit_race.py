"""Both halves of a differencing pair, sent at the same moment to 2 real worker processes.

``dpgate serve --workers 2`` on the demo data; the ledger is a SQLite file or a PostgreSQL
schema (with DPGATE_TEST_POSTGRES_URL). In each of 100 trials a fresh analyst sends the
two halves of a pair from two threads released by one barrier:

    COUNT(*) WHERE disease = 'Influenza'
    COUNT(*) WHERE disease = 'Influenza' AND zip <> Z      (Z: one Influenza patient)

Each alone is harmless; both answered determine one person. Without serialisation each
worker audits its half against knowledge that lacks the other (16 of 40 pairs got through
before). With the per-scope lock (budget/locks.py) the second half is audited after the
first is recorded, and refused. Release timing is off here: it is not what this tests.

False-alarm rate: with the lock working, a pair is answered only if the second half's
post-audit lets a group of one through: the difference of two discrete Laplace noises of
scale 1 (ε = 1) must exceed k − 1 + q. At k = 12 (set here; the attack corpus covers the
default k = 5) and q = 11.0 (the 99.9% Chernoff margin) that is ≥ 22: probability ≤ 1.5e-9
per trial (exact distribution), ≤ 1.5e-7 for any of the 100 trials.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import ADMIN_KEY, demo_config_dict

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
TRIALS = 100
EPSILON = 1.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _request(port: int, path: str, body: Any = None, key: str | None = None) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    try:
        conn.request(
            "GET" if body is None else "POST",
            path,
            None if body is None else json.dumps(body),
            headers,
        )
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read() or b"null")
    finally:
        conn.close()


@pytest.fixture
def served(demo_db: Path, ledger_url: str, tmp_path: Path) -> Iterator[int]:
    """``dpgate serve --workers 2`` on a copy of the demo data; yields its port."""
    db = tmp_path / "hospital.db"
    shutil.copy(demo_db, db)
    raw = demo_config_dict(db, tmp_path / "unused-ledger.db")
    raw["ledger"] = {"url": ledger_url}
    raw["audit"] = {**raw["audit"], "min_group_size": 12}
    raw["execution"] = {"timing": "off"}
    config = tmp_path / "dpgate.yaml"
    config.write_text(yaml.safe_dump(raw, allow_unicode=True))
    port = _free_port()
    env = {
        **os.environ,
        "DPGATE_ADMIN_KEY": ADMIN_KEY,
        "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    log = open(tmp_path / "server.log", "ab")  # noqa: SIM115
    command = [sys.executable, "-m", "gateway.cli", "serve", "--config", str(config)]
    command += ["--host", "127.0.0.1", "--port", str(port), "--workers", "2"]
    proc = subprocess.Popen(
        command, env=env, cwd=tmp_path, stdout=log, stderr=log, start_new_session=True
    )
    try:
        deadline = time.time() + 90
        while True:
            assert proc.poll() is None, (tmp_path / "server.log").read_text()[-3000:]
            try:
                if _request(port, "/readyz")[0] == 200:
                    break
            except OSError:
                pass
            assert time.time() < deadline, "the server did not start"
            time.sleep(0.2)
        yield port
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        log.close()


def _zip_with_one(demo_db: Path, disease: str) -> str:
    with sqlite3.connect(demo_db) as conn:
        (z,) = conn.execute(
            "SELECT zip FROM patients GROUP BY zip HAVING SUM(disease = ?) = 1 ORDER BY zip",
            (disease,),
        ).fetchone()
    return str(z)


def test_concurrent_halves_of_a_pair_are_never_both_answered(served: int, demo_db: Path) -> None:
    z = _zip_with_one(demo_db, "Influenza")
    halves = [
        "SELECT COUNT(*) FROM patients WHERE disease = 'Influenza'",
        f"SELECT COUNT(*) FROM patients WHERE disease = 'Influenza' AND zip <> '{z}'",
    ]
    answered_pairs = 0
    refused = 0
    for trial in range(TRIALS):
        status, body = _request(
            served,
            "/v1/admin/analysts",
            {"name": f"racer{trial}", "epsilon": 100.0, "delta": 1e-6},
            ADMIN_KEY,
        )
        assert status == 201, body
        key = body["api_key"]
        barrier = threading.Barrier(2)
        statuses: list[int] = [0, 0]

        def send(
            i: int,
            key: str = key,
            barrier: threading.Barrier = barrier,
            statuses: list[int] = statuses,
        ) -> None:
            barrier.wait()
            status, body = _request(
                served, "/v1/query", {"sql": halves[i], "epsilon": EPSILON}, key
            )
            assert status == 200 or body["error"]["code"] == "audit_refused", body
            statuses[i] = status

        threads = [threading.Thread(target=send, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        answered_pairs += statuses == [200, 200]
        refused += statuses.count(403)
    assert answered_pairs == 0, f"{answered_pairs} of {TRIALS} pairs answered"
    assert refused >= TRIALS
