"""Throughput: answered queries per second over HTTP against ``dpgate serve --workers N``.

The server serves PUMS (SQLite) with a fresh SQLite ledger; each client thread is its own
analyst (created in the ledger before the server starts) on a keep-alive connection.
Two closed-loop scenarios of a fixed duration each:

- ``distinct``: every request is a new query (``… WHERE income >= <i>`` with a unique i),
  so each one is a full pipeline run with a durable ledger reserve + commit;
- ``repeated``: every thread repeats one query, so all but its first request are cache
  hits (free, no ledger charge).

The load generator runs on the same machine (stdlib threads, so it takes CPU from the
server's workers on a small machine): the figures are a lower bound of the server's rate.
"""

from __future__ import annotations

import contextlib
import http.client
import itertools
import os
import signal
import socket
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.adapter import Http, create_analyst
from bench.common import BENCH_DIR, DATA_DIR, latency_summary, log
from bench.pums import setup

REPO = BENCH_DIR.parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _dpgate_bin() -> list[str]:
    import sys

    exe = Path(sys.executable).with_name("dpgate")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "gateway.cli"]


def _wait_ready(port: int, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"dpgate serve exited with code {proc.returncode}")
        with contextlib.suppress(OSError, http.client.HTTPException):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/healthz")
            if conn.getresponse().status == 200:
                return
        time.sleep(0.2)
    raise RuntimeError("dpgate serve did not become ready")


def _scenario(port: int, keys: list[str], duration: float, make_sql: Any) -> dict[str, Any]:
    stop = time.monotonic() + duration
    lock = threading.Lock()
    latencies: list[float] = []
    outcomes: Counter[str] = Counter()

    def client(i: int, key: str) -> None:
        h = Http("127.0.0.1", port, key)
        local_lat: list[float] = []
        local: Counter[str] = Counter()
        while time.monotonic() < stop:
            sql = make_sql(i)
            t = time.perf_counter()
            try:
                status, body = h.query(sql, 1.0)
            except Exception as e:
                local[f"transport:{type(e).__name__}"] += 1
                continue
            dt = time.perf_counter() - t
            if status == 200 and body.get("ok"):
                local["answered_cached" if body.get("cached") else "answered"] += 1
                local_lat.append(dt)
            else:
                local[f"{status}:{body.get('error', {}).get('code', '?')}"] += 1
        with lock:
            latencies.extend(local_lat)
            outcomes.update(local)

    started = time.monotonic()
    threads = [threading.Thread(target=client, args=(i, k)) for i, k in enumerate(keys)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.monotonic() - started
    answered = outcomes["answered"] + outcomes["answered_cached"]
    return {
        "duration_s": elapsed,
        "answered": answered,
        "answered_per_s": answered / elapsed,
        "outcomes": dict(outcomes),
        "latency": latency_summary(latencies),
    }


def run(duration: float = 20.0, workers: int = 2, clients: int = 8) -> dict[str, Any]:
    workdir = DATA_DIR / "throughput-run"
    cfg = setup(workdir)
    from gateway.config import load_config

    ledger_url = load_config(cfg).ledger.url
    keys = [create_analyst(ledger_url, f"load{i}") for i in range(clients)]
    port = _free_port()
    cmd = [
        *_dpgate_bin(),
        "serve",
        "--config",
        str(cfg),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        str(workers),
    ]
    log(f"throughput: {' '.join(cmd)}")
    logf = (workdir / "serve.log").open("wb")
    proc = subprocess.Popen(
        cmd, cwd=REPO, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        _wait_ready(port, proc)
        counter = itertools.count(1)
        distinct = _scenario(
            port,
            keys,
            duration,
            lambda i: f"SELECT COUNT(*) AS n FROM pums WHERE income >= {next(counter)}",
        )
        log(f"throughput distinct: {distinct['answered_per_s']:.1f}/s {distinct['outcomes']}")
        repeated = _scenario(
            port,
            keys,
            duration,
            lambda i: "SELECT sex, COUNT(*) AS n FROM pums WHERE age >= 18 GROUP BY sex",
        )
        log(f"throughput repeated: {repeated['answered_per_s']:.1f}/s {repeated['outcomes']}")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        logf.close()
    return {
        "workers": workers,
        "clients": clients,
        "command": " ".join(cmd),
        "distinct": distinct,
        "repeated": repeated,
    }
