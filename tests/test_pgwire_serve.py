"""`dpgate serve` with `postgres_wire:`: the PostgreSQL front end runs beside the HTTP
workers, shares their ledger and metrics, and stops with them."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest
import yaml

from gateway.pipeline.gateway import Gateway
from tests.conftest import ADMIN_KEY, demo_config_dict


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _readyz(port: int) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=15) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except OSError:
        return None


def test_readyz_waits_for_the_wire_front_end_to_serve(
    make_gateway: Callable[..., Gateway], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not ready before the address is known, nor while the port is bound but not served
    (the kernel would complete a TCP handshake then); ready once connections are served."""
    from gateway.http.app import create_app
    from gateway.pgwire.probe import ADDRESS_FILE_ENV
    from gateway.pgwire.server import WireServer

    address = tmp_path / "address"
    monkeypatch.setenv(ADDRESS_FILE_ENV, str(address))
    gateway = make_gateway(postgres_wire={"port": 0})
    client = create_app(gateway.config, gateway=gateway).test_client()
    r = client.get("/readyz")
    assert r.status_code == 503 and r.json["error"]["detail"]["checks"]["postgres_wire"] is False
    server = WireServer(gateway.config, gateway)
    host, port = server.bind("127.0.0.1")
    address.write_text(f"{host} {port}\n")
    try:
        assert client.get("/readyz").status_code == 503  # bound, not yet accepting
        threading.Thread(target=server.serve_forever, daemon=True).start()
        r = client.get("/readyz")
        assert r.status_code == 200, r.json
        assert r.json["checks"] == {"database": True, "ledger": True, "postgres_wire": True}
    finally:
        server.shutdown()


def test_dpgate_serve_runs_the_postgres_front_end(demo_db: Path, tmp_path: Path) -> None:
    import budget

    db = tmp_path / "hospital.db"
    shutil.copy(demo_db, db)
    http_port, pg_port = _free_port(), _free_port()
    raw = demo_config_dict(db, tmp_path / "ledger.db", postgres_wire={"port": pg_port})
    config = tmp_path / "dpgate.yaml"
    config.write_text(yaml.safe_dump(raw))
    ledger = budget.Ledger.from_url(f"sqlite:///{tmp_path / 'ledger.db'}")
    ledger.migrate()
    key = ledger.create_analyst("alice", 10.0, 1e-6)
    ledger.close()
    log = (tmp_path / "serve.log").open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "gateway.cli", "serve", "--config", str(config),
         "--port", str(http_port), "--workers", "1"],
        stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path,
        env={**os.environ, "DPGATE_ADMIN_KEY": ADMIN_KEY},
    )  # fmt: skip
    try:
        # /readyz says 200 only once the wire front end answers: a client that trusts
        # it connects at once, without polling the port itself.
        deadline = time.monotonic() + 60
        while _readyz(http_port) != 200:
            assert process.poll() is None, (tmp_path / "serve.log").read_text()
            assert time.monotonic() < deadline, (tmp_path / "serve.log").read_text()
            time.sleep(0.3)
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/readyz", timeout=15) as r:
            assert json.loads(r.read())["checks"]["postgres_wire"] is True
        with psycopg.connect(
            host="127.0.0.1", port=pg_port, user="alice", password=key, dbname="dpgate",
            sslmode="disable", autocommit=True,
        ) as conn:  # fmt: skip
            rows = conn.execute("SELECT sex, COUNT(*) AS n FROM patients GROUP BY sex").fetchall()
            assert {r[0] for r in rows} == {"F", "M"}
        # The HTTP workers' /metrics include the wire process's samples (one shared dir).
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=15) as r:
            text = r.read().decode()
        assert 'dpgate_queries_total{analyst="alice",outcome="answered"} 1.0' in text
        assert 'endpoint="pgwire:query"' in text
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            pytest.fail("dpgate serve did not stop on SIGTERM")
    deadline = time.monotonic() + 10
    while _listening(pg_port) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _listening(pg_port)  # the front end stopped with the server
