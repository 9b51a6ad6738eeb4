"""`dpgate serve --workers 2` as operators run it: a real server in a subprocess.

Each server starts once per module, on a free loopback port, with a small SQLite
deployment in a temporary directory; requests are few and bounded.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import budget

pytestmark = pytest.mark.slow

ADMIN_KEY = "admin-key-for-serve-tests-0123456789"
PRIVATE_NOTE = "private-note-"  # a protected column the config does not publish
SCHEMATHESIS_EXAMPLES = int(os.environ.get("DPGATE_TEST_SCHEMATHESIS_EXAMPLES", "15"))

CONFIG = """
database: {{url: "sqlite:///data.db"}}
ledger: {{url: "sqlite:///ledger.db"}}
privacy: {{epsilon: 0.1, max_epsilon_per_query: 1.0}}
audit: {{mode: "off"}}  # quoted: YAML reads a bare off as false
{limits}
tables:
  patients:
    privacy_unit: patient_id
    columns:
      patient_id: {{type: integer}}
      age: {{type: integer, lower: 0, upper: 120}}
      sex: {{type: text, values: [F, M]}}
      disease: {{type: text, values: [Crohn, Influenza, Meningitis]}}
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_deployment(root: Path, limits: str = "") -> Path:
    db = sqlite3.connect(root / "data.db")
    db.execute(
        "CREATE TABLE patients (patient_id INTEGER, age INTEGER, sex TEXT, disease TEXT, note TEXT)"
    )
    diseases = ["Crohn", "Influenza", "Meningitis"]
    db.executemany(
        "INSERT INTO patients VALUES (?, ?, ?, ?, ?)",
        [
            (i, (i * 37) % 100, "FM"[i % 2], diseases[i % 3], f"{PRIVATE_NOTE}{i:04d}")
            for i in range(300)
        ],
    )
    db.commit()
    db.close()
    path = root / "dpgate.yaml"
    path.write_text(CONFIG.format(limits=limits))
    return path


@dataclass
class Server:
    """A `dpgate serve` subprocess, its port and its log file."""

    root: Path
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path
    analyst_key: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def call(
        self, method: str, path: str, body: Any = None, key: str | None = None
    ) -> tuple[int, dict[str, str], Any]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if key:
            req.add_header("Authorization", f"Bearer {key}")
        try:
            with urllib.request.urlopen(req, timeout=15) as r:
                raw, status, headers = r.read(), r.status, dict(r.headers)
        except urllib.error.HTTPError as e:
            raw, status, headers = e.read(), e.code, dict(e.headers)
        ctype = headers.get("Content-Type", "")
        return status, headers, json.loads(raw) if "json" in ctype else raw.decode()

    def log_lines(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    out.append(json.loads(line))
        return out

    def metric(self, name: str, **labels: str) -> float:
        _, _, text = self.call("GET", "/metrics")
        total = 0.0
        for line in text.splitlines():
            m = re.match(r"^(\w+)(?:\{(.*)\})? (\S+)$", line)
            if m and m.group(1) == name:
                got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
                if all(got.get(k) == v for k, v in labels.items()):
                    total += float(m.group(3))
        return total


def serve_command(config: Path, port: int, workers: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "gateway.cli",
        "serve",
        "--config",
        str(config),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        str(workers),
    ]


def start(
    root: Path, config: Path, *, workers: int = 2, env: dict[str, str] | None = None
) -> Server:
    port = free_port()
    log_path = root / "server.log"
    log = log_path.open("wb")
    process = subprocess.Popen(
        serve_command(config, port, workers),
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=root,
        env={**os.environ, "DPGATE_ADMIN_KEY": ADMIN_KEY, **(env or {})},
    )
    server = Server(root=root, port=port, process=process, log_path=log_path)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"dpgate serve exited early:\n{log_path.read_text()}")
        try:
            if server.call("GET", "/readyz")[0] == 200:
                return server
        except OSError:
            pass
        time.sleep(0.2)
    stop(server)
    raise AssertionError(f"dpgate serve did not become ready:\n{log_path.read_text()}")


def stop(server: Server) -> int:
    """SIGTERM, as an orchestrator stops it; returns the exit status."""
    if server.process.poll() is None:
        server.process.send_signal(signal.SIGTERM)
    try:
        return server.process.wait(timeout=40)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait()
        return -9


def make_analyst(config_dir: Path, name: str = "alice") -> str:
    """An analyst created straight in the ledger, so setup sends no HTTP request."""
    ledger = budget.Ledger.from_url(f"sqlite:///{config_dir / 'ledger.db'}")
    ledger.migrate()
    key = ledger.create_analyst(name, 50.0, 1e-5)
    ledger.close()
    return key


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("serve")
    config = write_deployment(root)
    key = make_analyst(root)
    srv = start(root, config)
    srv.analyst_key = key
    yield srv
    assert stop(srv) == 0, srv.log_path.read_text()[-3000:]


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("limited")
    config = write_deployment(root, "limits: {address_per_minute: 40, analyst_per_minute: 25}")
    key = make_analyst(root)
    srv = start(root, config)
    srv.analyst_key = key
    yield srv
    assert stop(srv) == 0, srv.log_path.read_text()[-3000:]


def test_openapi_property_tests_find_no_server_error_and_no_spec_violation(server: Server) -> None:
    schemathesis = Path(sys.executable).parent / "schemathesis"
    if not schemathesis.exists():
        pytest.skip("schemathesis is not installed")
    for key in (server.analyst_key, ADMIN_KEY):
        result = subprocess.run(
            [
                str(schemathesis),
                "run",
                f"{server.url}/openapi.json",
                "--checks",
                "not_a_server_error,status_code_conformance,content_type_conformance,"
                "response_schema_conformance,response_headers_conformance",
                "--max-examples",
                str(SCHEMATHESIS_EXAMPLES),
                "--phases",
                "examples,coverage,fuzzing",
                "--workers",
                "1",
                "--seed",
                "20261123",
                "--request-timeout",
                "15",
                "--no-shrink",
                "--header",
                f"Authorization: Bearer {key}",
            ],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=server.root,
        )
        assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    # The admin pass reuses names it read from responses: it may have rotated alice's
    # key, disabled her or cut her budget. Put her back for the other tests.
    admin = {"key": ADMIN_KEY}
    status, _, body = server.call("POST", "/v1/admin/analysts/alice/keys", **admin)
    assert status == 201, body
    server.analyst_key = body["api_key"]
    patch = {"disabled": False, "epsilon": 50.0, "delta": 1e-5}
    assert server.call("PATCH", "/v1/admin/analysts/alice", patch, **admin)[0] == 200
    # It may also have granted tables to groups of its own making, which closes them to
    # everyone else (a last grant cannot be revoked under access.default: open): make
    # alice a member of one group of each such table.
    status, _, body = server.call("GET", "/v1/admin/grants", **admin)
    assert status == 200, body
    for table in body["tables"]:
        if table["readable_by"] == "groups":
            group = urllib.parse.quote(table["groups"][0], safe="")
            path = f"/v1/admin/groups/{group}/members"
            status, _, added = server.call("POST", path, {"analyst": "alice"}, **admin)
            assert status in (200, 201, 409), added


def test_metrics_add_up_across_workers(server: Server) -> None:
    before = server.metric("dpgate_http_requests_total", endpoint="/v1/budget", status="200")
    answered = server.metric("dpgate_queries_total", analyst="alice", outcome="answered")

    def budget_call(_: int) -> str:
        status, headers, _ = server.call("GET", "/v1/budget", key=server.analyst_key)
        assert status == 200
        return headers["X-Request-Id"]

    # Bursts of 40 until both workers have served part of one: which worker accepts a
    # new connection is the kernel's race (balancing keep-alive clients has its own test).
    ids: set[str] = set()
    pids: set[int] = set()
    for _ in range(10):
        with ThreadPoolExecutor(8) as pool:
            ids |= set(pool.map(budget_call, range(40)))
        pids = {line["pid"] for line in server.log_lines() if line.get("request_id") in ids}
        if len(pids) == 2:
            break
    assert len(pids) == 2, "both workers should have served part of the bursts"
    sql = "SELECT sex, COUNT(*) AS n FROM patients GROUP BY sex"
    for eps in (0.1, 0.2, 0.3):
        status, _, body = server.call(
            "POST", "/v1/query", {"sql": sql, "epsilon": eps}, key=server.analyst_key
        )
        assert status == 200, body

    # Whichever worker answers the scrape, it reports the sum over both.
    for _ in range(6):
        after = server.metric("dpgate_http_requests_total", endpoint="/v1/budget", status="200")
        assert after - before == len(ids)
        assert (
            server.metric("dpgate_queries_total", analyst="alice", outcome="answered") - answered
            == 3
        )
    assert server.metric("dpgate_epsilon_charged_total", analyst="alice") >= 0.6 - 1e-9


def test_keep_alive_connections_are_shared_evenly_between_the_workers(server: Server) -> None:
    """Twelve clients that keep their connections: six per worker, not whichever worker
    won each accept (one process holding most keep-alive clients serves them on one
    core; gateway/server/serve_workers.py)."""
    conns: list[tuple[http.client.HTTPConnection, str]] = []
    try:
        for _ in range(12):
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=15)
            conn.request(
                "GET", "/v1/budget", headers={"Authorization": f"Bearer {server.analyst_key}"}
            )
            response = conn.getresponse()
            response.read()
            assert response.status == 200
            conns.append((conn, response.headers["X-Request-Id"]))
        ids = {request_id for _, request_id in conns}
        deadline = time.monotonic() + 10
        while True:
            pid_of = {
                line["request_id"]: line["pid"]
                for line in server.log_lines()
                if line.get("request_id") in ids
            }
            if len(pid_of) == len(ids) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        held = Counter(pid_of[request_id] for _, request_id in conns)
        assert sorted(held.values()) == [6, 6], held
    finally:
        for conn, _ in conns:
            conn.close()


def test_logs_carry_the_failed_request_id_and_no_protected_value(server: Server) -> None:
    status, headers, body = server.call(
        "POST", "/v1/query", {"sql": "SELECT COUNT(*) FROM nowhere"}, key=server.analyst_key
    )
    assert status == 400 and body["error"]["code"] == "unknown_table"
    request_id = headers["X-Request-Id"]
    assert body["error"]["detail"]["request_id"] == request_id
    status, _, released = server.call(
        "POST",
        "/v1/query",
        {"sql": "SELECT disease, COUNT(*) AS n, SUM(age) AS s FROM patients GROUP BY disease"},
        key=server.analyst_key,
    )
    assert status == 200, released

    deadline = time.monotonic() + 5
    while True:
        lines = server.log_lines()
        failed = [line for line in lines if line.get("request_id") == request_id]
        if failed or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert len(failed) == 1
    assert failed[0]["error_code"] == "unknown_table"
    assert failed[0]["status"] == 400
    assert failed[0]["analyst"] == "alice"
    assert failed[0]["sql"] == "SELECT COUNT(*) FROM nowhere"
    text = server.log_path.read_text()
    assert PRIVATE_NOTE not in text
    assert server.analyst_key not in text and ADMIN_KEY not in text
    # The released (noisy) cells are in the response only, not in the logs.
    assert json.dumps(released["rows"]) not in text


def wait_for_fresh_window(seconds_needed: float) -> None:
    """Start a burst early enough in a rate-limit minute that it ends inside it."""
    left = 60 - time.time() % 60
    if left < seconds_needed:
        time.sleep(left + 0.5)


def test_a_burst_above_the_limits_gets_exactly_the_overflow_refused(limited: Server) -> None:
    wait_for_fresh_window(25)
    analyst_before = limited.metric("dpgate_rate_limited_total", scope="analyst")
    address_before = limited.metric("dpgate_rate_limited_total", scope="address")

    def get(path: str, key: str | None) -> tuple[int, dict[str, str], Any]:
        return limited.call("GET", path, key=key)

    with ThreadPoolExecutor(10) as pool:
        # 30 requests as alice: the address is at 30 of 40, alice at 30 of 25.
        as_alice = list(pool.map(lambda _: get("/v1/budget", limited.analyst_key), range(30)))
        # 20 more from the same address: 50 of 40.
        anonymous = list(pool.map(lambda _: get("/v1/schema", None), range(20)))

    def refused(results: list[tuple[int, dict[str, str], Any]], scope: str) -> int:
        n = 0
        for status, headers, body in results:
            if status == 429:
                assert body["error"]["code"] == "rate_limited"
                assert body["error"]["detail"]["scope"] == scope
                assert 1 <= int(headers["Retry-After"]) <= 60
                n += 1
        return n

    assert [s for s, _, _ in as_alice].count(200) == 25
    assert refused(as_alice, "analyst") == 5
    assert refused(anonymous, "address") == 10
    assert [s for s, _, _ in anonymous].count(401) == 10
    assert limited.metric("dpgate_rate_limited_total", scope="analyst") - analyst_before == 5
    assert limited.metric("dpgate_rate_limited_total", scope="address") - address_before == 10
    # Probes are never limited.
    assert get("/healthz", None)[0] == 200 and get("/readyz", None)[0] == 200


def test_an_invalid_config_is_reported_before_the_port_is_bound(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("database: {url: 3}\nlimits: {address_per_minute: 0}\ntables: {}\n")
    port = free_port()
    result = subprocess.run(serve_command(bad, port, 2), capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    for problem in (
        "database.url: must be a non-empty string",
        "ledger: missing (required)",
        "limits.address_per_minute: must be ≥ 1",
        "tables: declare at least one table",
    ):
        assert problem in result.stderr
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0


def test_waitress_fallback_serves_and_stops_on_sigterm(tmp_path: Path) -> None:
    config = write_deployment(tmp_path)
    srv = start(tmp_path, config, workers=1, env={"DPGATE_SERVER": "waitress"})
    try:
        status, headers, _ = srv.call("GET", "/healthz")
        assert status == 200 and headers["X-Request-Id"]
        assert "gunicorn" not in srv.log_path.read_text().lower()
    finally:
        assert stop(srv) == 0


def test_sigterm_lets_the_request_in_flight_finish(tmp_path: Path) -> None:
    srv = start(tmp_path, write_deployment(tmp_path), workers=1)
    with socket.create_connection(("127.0.0.1", srv.port), timeout=20) as conn:
        conn.sendall(b"GET /healthz HTTP/1.1\r\nHost: dpgate\r\n")  # not finished yet
        time.sleep(0.5)
        srv.process.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        conn.sendall(b"Connection: close\r\n\r\n")
        response = b""
        while chunk := conn.recv(65536):
            response += chunk
    assert response.startswith(b"HTTP/1.1 200"), response[:200]
    assert srv.process.wait(timeout=40) == 0


def test_a_broken_installation_is_reported_before_the_port_is_bound(tmp_path: Path) -> None:
    config = write_deployment(tmp_path)
    port = free_port()
    code = (
        "from gateway.server.serve import run; "
        f"run({str(config)!r}, port={port}, workers=2, app_factory='gateway.nowhere:create_app')"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert "cannot load the application gateway.nowhere:create_app" in result.stderr
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0


def _live_workers(server: Server) -> list[int]:
    booted = re.findall(r"Booting worker with pid: (\d+)", server.log_path.read_text())
    live = []
    for pid in map(int, booted):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:  # exited (a test stopped it, gunicorn replaced it)
            continue
        if int(stat.rpartition(")")[2].split()[1]) == server.process.pid:
            live.append(pid)
    return live


def test_with_a_worker_per_cpu_each_worker_runs_on_a_cpu_of_its_own(server: Server) -> None:
    """gateway/server/serve_workers.py::pin_worker: the two workers of this server are pinned
    to one CPU each when the server may use two CPUs, and left free with more."""
    if not hasattr(os, "sched_getaffinity") or not Path("/proc/self/stat").exists():
        pytest.skip("CPU affinity is Linux's")
    cpus = sorted(os.sched_getaffinity(0))  # what the server inherited from this process
    workers = _live_workers(server)
    assert len(workers) == 2
    placed = [sorted(os.sched_getaffinity(pid)) for pid in workers]
    if len(cpus) == 2:
        assert sorted(placed) == [[cpus[0]], [cpus[1]]]
    else:  # one CPU (nothing to spread), or more CPUs than workers (C work may spill)
        assert placed == [cpus, cpus]
