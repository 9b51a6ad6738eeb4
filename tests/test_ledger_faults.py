"""Ledger faults answered truthfully (issue 36): a SQLite ledger on a full disk, and a
PostgreSQL ledger whose connections are cut and come back. Every failure is a 503 —
never a 500 — whose ``detail.charged`` agrees with the ledger; ``/readyz`` fails while
the ledger cannot be written and recovers; an outcome the ledger missed is written once
it is back, so no charge stays ``pending``; the ledger's charges equal what the clients
were told they were charged.

The full disk is a small tmpfs (needs the right to mount one; skipped otherwise). The
PostgreSQL outage is a TCP proxy in front of the shared server that drops every
connection and refuses new ones for a while: the server itself is never touched.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from flask.testing import FlaskClient

from gateway.http.app import create_app
from gateway.pipeline.gateway import Gateway
from tests.conftest import (
    ADMIN_KEY,
    POSTGRES_URL,
    demo_config_dict,
    drop_postgres_schema,
    postgres_schema_url,
)


@pytest.fixture
def gateway_on(
    demo_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Callable[[str], Gateway]:
    """A Gateway on a copy of the demo data with its ledger at a given URL, auditing."""
    from gateway.core.config_load import parse_config

    monkeypatch.setenv("DPGATE_ADMIN_KEY", ADMIN_KEY)

    def build(ledger_url: str) -> Gateway:
        db = tmp_path / "hospital.db"
        db.write_bytes(demo_db.read_bytes())
        raw = demo_config_dict(db, tmp_path / "unused.db", audit={"mode": "refuse"})
        raw["ledger"] = {"url": ledger_url}
        return Gateway(parse_config(raw))

    return build


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 3 MB tmpfs: a disk that fills up."""
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs CAP_SYS_ADMIN)")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def fill(disk: Path) -> Path:
    """Fill ``disk`` to the last byte; returns the filler file."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_CREAT | os.O_WRONLY)
    try:
        for size in (65536, 4096, 512, 1):
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, b"\0" * size)
    finally:
        os.close(fd)
    return filler


def ask(client: FlaskClient, key: str, n: int) -> tuple[int, dict[str, Any]]:
    """The ``n``-th request: one region (the auditor sees no differencing), each with its
    own ε (no free cache hit)."""
    resp = client.post(
        "/v1/query",
        json={"sql": "SELECT COUNT(*) FROM patients WHERE age > 40", "epsilon": 0.01 + n * 1e-5},
        headers={"Authorization": f"Bearer {key}"},
    )
    return resp.status_code, resp.get_json()


def told_charged(status: int, body: dict[str, Any]) -> bool:
    """What the client was told: answered, or an error whose detail says charged."""
    if status == 200:
        return True
    assert status != 500, body
    return body["error"]["detail"].get("charged") is True


def ledger_charges(gateway: Gateway, analyst: str) -> tuple[int, int]:
    """The analyst's charges that still count, and those left pending."""
    entries = [e for e in gateway.ledger.history(analyst, limit=100_000) if e.outcome != "refused"]
    counted = [e for e in entries if e.outcome != "refunded"]
    return len(counted), sum(e.outcome == "pending" for e in entries)


def test_a_full_sqlite_ledger_disk_answers_503s_that_say_what_was_charged(
    small_disk: Path, gateway_on: Callable[[str], Gateway]
) -> None:
    gateway = gateway_on(f"sqlite:///{small_disk}/ledger.db")
    client = create_app(gateway.config, gateway=gateway).test_client()
    key = gateway.ledger.create_analyst("alice", 1000.0, 1e-6)
    told = []
    for i in range(5):
        status, body = ask(client, key, i)
        assert status == 200, body
        told.append(True)
    filler = fill(small_disk)
    refused_ready = client.get("/readyz")
    assert refused_ready.status_code == 503
    assert refused_ready.json["error"]["code"] == "ledger_unavailable"
    statuses = []
    # Then room for a few pages at a time: a charge may fit where its outcome does not.
    for i in range(40):
        if i >= 10:
            filler.unlink()
            filler = fill(small_disk)
            os.truncate(filler, max(0, filler.stat().st_size - 4096 * (i - 9)))
        status, body = ask(client, key, 10 + i)
        statuses.append(status)
        if status != 200:
            assert status == 503 and body["error"]["code"] == "ledger_unavailable", body
            assert isinstance(body["error"]["detail"].get("charged"), bool), body
        told.append(told_charged(status, body))
    assert 503 in statuses
    filler.unlink()
    ready = client.get("/readyz")
    assert ready.status_code == 200, ready.json  # and the missed outcomes are written
    status, body = ask(client, key, 99)
    assert status == 200, body
    told.append(True)
    counted, pending = ledger_charges(gateway, "alice")
    assert pending == 0
    assert counted == sum(told)


def test_a_full_disk_is_not_ready_though_the_wal_has_room_for_the_probe(
    small_disk: Path, gateway_on: Callable[[str], Gateway]
) -> None:
    """A checkpointed WAL is rewound, not grown: the probe's one write fits in the space
    the WAL already holds on a full disk, and the next charge, which grows the file, would
    not. The disk's free space says so."""
    gateway = gateway_on(f"sqlite:///{small_disk}/ledger.db")
    client = create_app(gateway.config, gateway=gateway).test_client()
    key = gateway.ledger.create_analyst("alice", 1000.0, 1e-6)
    for i in range(5):
        assert ask(client, key, i)[0] == 200
    gateway.ledger.flush()
    with gateway.ledger.engine.connect() as conn:
        conn.exec_driver_sql("PRAGMA wal_checkpoint(RESTART)")
    filler = fill(small_disk)
    with gateway.ledger.engine.connect() as conn:
        conn.exec_driver_sql("PRAGMA wal_checkpoint(RESTART)")
    refused = client.get("/readyz")
    assert refused.status_code == 503, refused.json
    assert refused.json["error"]["code"] == "ledger_unavailable", refused.json
    filler.unlink()
    assert client.get("/readyz").status_code == 200


def test_a_charge_committed_as_the_ledger_failed_is_refunded_once_it_is_back(
    gateway_on: Callable[[str], Gateway], tmp_path: Path
) -> None:
    """A COMMIT whose answer is lost: the server has the charge, the request was told
    nothing was charged (and nothing ran). Once the ledger answers again the charge is
    refunded, so what the client was told is true and nothing stays pending."""
    import budget

    gateway = gateway_on(f"sqlite:///{tmp_path}/ledger.db")
    client = create_app(gateway.config, gateway=gateway).test_client()
    key = gateway.ledger.create_analyst("alice", 1000.0, 1e-6)
    real = gateway.ledger.write
    lost = []

    def write(fn: Callable[..., Any], **kw: Any) -> Any:
        result = real(fn, **kw)
        if fn.__name__ == "charge" and not lost:
            lost.append(fn)
            raise budget.LedgerUnavailable("server closed the connection after COMMIT")
        return result

    gateway.ledger.write = write  # type: ignore[method-assign]
    status, body = ask(client, key, 0)
    assert status == 503 and body["error"]["detail"]["charged"] is False, body
    assert lost and ledger_charges(gateway, "alice") == (1, 1)  # there, and pending
    assert client.get("/readyz").status_code == 200
    assert ledger_charges(gateway, "alice") == (0, 0)  # refunded: nothing counts
    status, body = ask(client, key, 1)
    assert status == 200, body


class CuttableProxy:
    """A TCP proxy to ``target`` that can drop every connection and refuse new ones."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.up = threading.Event()
        self.up.set()
        self.sockets: list[socket.socket] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if not self.up.is_set():
                client.close()
                continue
            try:
                server = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self.lock:
                self.sockets += [client, server]
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        self.up.clear()
        with self.lock:
            for s in self.sockets:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
            self.sockets.clear()

    def restore(self) -> None:
        self.up.set()

    def close(self) -> None:
        self.cut()
        self.listener.close()


@pytest.mark.postgres
def test_a_postgres_ledger_lost_and_back_answers_no_500s(
    gateway_on: Callable[[str], Gateway],
) -> None:
    if not POSTGRES_URL:
        pytest.skip("set DPGATE_TEST_POSTGRES_URL to run PostgreSQL tests")
    import sqlalchemy as sa

    url, schema = postgres_schema_url(POSTGRES_URL)
    real = sa.engine.make_url(url)
    proxy = CuttableProxy((real.host or "127.0.0.1", real.port or 5432))
    proxied = real.set(host="127.0.0.1", port=proxy.port)
    try:
        gateway = gateway_on(proxied.render_as_string(hide_password=False))
        app = create_app(gateway.config, gateway=gateway)
        key = gateway.ledger.create_analyst("alice", 1000.0, 1e-6)
        results: list[tuple[int, dict[str, Any]]] = []
        stop = threading.Event()

        def load(worker: int) -> None:
            client = app.test_client()
            i = 0
            while not stop.is_set():
                results.append(ask(client, key, 1000 * worker + i))
                i += 1

        with ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(load, w) for w in range(4)]
            stop.wait(1.5)
            proxy.cut()
            stop.wait(1.5)
            outage = app.test_client().get("/readyz")
            proxy.restore()
            stop.wait(1.5)
            stop.set()
            for f in futures:
                f.result()
        assert outage.status_code == 503
        statuses = [s for s, _ in results]
        assert 500 not in statuses, [b for s, b in results if s == 500][:3]
        assert 503 in statuses and 200 in statuses
        for status, body in results:
            if status != 200:
                assert status == 503, body
                assert isinstance(body["error"]["detail"].get("charged"), bool), body
        assert app.test_client().get("/readyz").status_code == 200
        counted, pending = ledger_charges(gateway, "alice")
        assert pending == 0
        assert counted == sum(told_charged(s, b) for s, b in results)
    finally:
        proxy.close()
        drop_postgres_schema(POSTGRES_URL, schema)
