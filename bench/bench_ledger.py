"""Ledger throughput: durable reserve + commit per second, and answered queries per second.

    python -m bench.bench_ledger                      # SQLite (+ PostgreSQL if a URL is set)
    python -m bench.bench_ledger --seconds 5 --postgres postgresql+psycopg://…/test
    python -m bench.bench_ledger --skip-http          # ledger level only

Two levels, each on a SQLite ledger (default ``synchronous=full``: every charge is
fsynced before it returns; outcomes are not), the same with ``?synchronous=normal`` (no
fsync at commit: safe against a killed process, not against a power cut) and, when
``--postgres`` or ``DPGATE_TEST_POSTGRES_URL`` gives one, a PostgreSQL ledger (in a fresh
schema, dropped afterwards):

- ``ledger``: reserve + commit cycles (two durable write transactions) straight on
  ``budget.Ledger``: one thread, then 2 processes × 4 threads on one analyst (every
  charge serializes on that analyst's lock: the worst case).
- ``http``: ``gunicorn -w 2`` serving a small SQLite table with the audit off; 8 client
  threads send distinct ``COUNT(*)`` queries (no cache hits), each analyst-charged,
  for ``--seconds``; answered/s counts 200 responses only.

The load generator shares the machine with the server, so figures are lower bounds.
Results: stdout (a markdown table) and ``bench/results/bench_ledger.json``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing as mp
import os
import platform
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from budget import Ledger
from mechanisms.types import PrivacyCost

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results" / "bench_ledger.json"
COST = PrivacyCost(0.01, 0.0, 0.00005)
ADMIN_KEY = "bench-admin-" + uuid.uuid4().hex


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- ledger level ----------------------------------------------------------------------


def _cycles(led: Ledger, analyst: str, seconds: float, tag: str) -> list[float]:
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds
    i = 0
    while time.perf_counter() < deadline:
        t0 = time.perf_counter()
        r = led.reserve(
            analyst,
            COST,
            query_key=f"{tag}-{i}",
            sql=f"SELECT COUNT(*) FROM t WHERE x >= {i}",
            mechanism="laplace",
            data_version="1",
        )
        led.commit(r, {"rows": [[i]]}, "answered")
        latencies.append(time.perf_counter() - t0)
        i += 1
    return latencies


def _process(url: str, analyst: str, seconds: float, threads: int, out: Any) -> None:
    led = Ledger.from_url(url)
    results: list[list[float]] = [[] for _ in range(threads)]

    def run(k: int) -> None:
        results[k] = _cycles(led, analyst, seconds, f"{os.getpid()}-{k}")

    ts = [threading.Thread(target=run, args=(k,)) for k in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    out.put([x for r in results for x in r])


def _summary(latencies: list[float], seconds: float) -> dict[str, float]:
    lat = sorted(latencies)
    return {
        "ops_per_s": round(len(lat) / seconds, 1),
        "p50_ms": round(1000 * lat[len(lat) // 2], 2) if lat else 0.0,
        "p99_ms": round(1000 * lat[min(len(lat) - 1, int(len(lat) * 0.99))], 2) if lat else 0.0,
        "n": len(lat),
    }


def bench_ledger_level(url: str, seconds: float) -> dict[str, Any]:
    led = Ledger.from_url(url)
    led.migrate()
    analyst = "bench-" + uuid.uuid4().hex[:8]
    led.create_analyst(analyst, 1e9, 1e-6)
    single = _summary(_cycles(led, analyst, seconds, "single"), seconds)
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=_process, args=(url, analyst, seconds, 4, out)) for _ in range(2)]
    for p in procs:
        p.start()
    lat = [x for _ in procs for x in out.get(timeout=seconds + 120)]
    for p in procs:
        p.join()
    multi = _summary(lat, seconds)
    status = led.budget_status(analyst)
    assert status.queries == single["n"] + multi["n"], "ledger lost or added charges"
    led.close()
    return {"single_thread": single, "2_processes_x_4_threads": multi}


# -- HTTP level ------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _request(
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


@contextmanager
def gunicorn(workdir: Path, ledger_url: str, workers: int = 2) -> Iterator[int]:
    """A ``gunicorn -w N`` dpgate on a small SQLite table; yields its port."""
    data = workdir / "data.db"
    if not data.exists():
        with sqlite3.connect(data) as db:
            db.execute("CREATE TABLE t (id INTEGER, x INTEGER)")
            db.executemany("INSERT INTO t VALUES (?, ?)", [(i, i % 100) for i in range(2000)])
    config = workdir / "dpgate.yaml"
    config.write_text(
        json.dumps(
            {
                "database": {"url": f"sqlite:///{data}"},
                "ledger": {"url": ledger_url},
                "privacy": {"mechanism": "laplace", "epsilon": 0.01, "composition": "zcdp"},
                "audit": {"mode": "off"},
                "tables": {
                    "t": {
                        "columns": {
                            "id": {"type": "integer", "lower": 0, "upper": 1_000_000},
                            "x": {"type": "integer", "lower": 0, "upper": 100},
                        }
                    }
                },
            }
        )
    )
    port = _free_port()
    env = {
        **os.environ,
        "DPGATE_CONFIG": str(config),
        "DPGATE_ADMIN_KEY": ADMIN_KEY,
        "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    exe = Path(sys.executable).with_name("gunicorn")
    proc = subprocess.Popen(
        [
            str(exe),
            "-w",
            str(workers),
            "-b",
            f"127.0.0.1:{port}",
            "--log-level",
            "warning",
            "gateway.http.app:create_app_from_env()",
        ],
        env=env,
        cwd=workdir,
        stdout=subprocess.DEVNULL,
        stderr=open(workdir / "gunicorn.log", "ab"),  # noqa: SIM115
    )
    try:
        deadline = time.time() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"gunicorn exited; see {workdir / 'gunicorn.log'}")
            try:
                if _request(port, "GET", "/healthz")[0] == 200:
                    break
            except OSError:
                pass
            if time.time() > deadline:
                raise RuntimeError("gunicorn did not become ready")
            time.sleep(0.2)
        yield port
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def bench_http(ledger_url: str, seconds: float, clients: int = 8) -> dict[str, Any]:
    with (
        tempfile.TemporaryDirectory(prefix="dpgate-bench-") as tmp,
        gunicorn(Path(tmp), ledger_url) as port,
    ):
        status, body = _request(
            port,
            "POST",
            "/v1/admin/analysts",
            {"name": "bench-" + uuid.uuid4().hex[:8], "epsilon": 1e9, "delta": 1e-6},
            ADMIN_KEY,
        )
        if status != 201:
            raise RuntimeError(f"could not create the analyst: {status} {body}")
        key = body["api_key"]
        counter = iter(range(10**9))
        lock = threading.Lock()
        outcomes: Counter[str] = Counter()
        latencies: list[float] = []
        deadline = time.perf_counter() + seconds

        def client() -> None:
            while time.perf_counter() < deadline:
                with lock:
                    i = next(counter)
                sql = f"SELECT COUNT(*) FROM t WHERE id >= {i % 1000} AND x >= {i // 1000}"
                t0 = time.perf_counter()
                try:
                    code, resp = _request(port, "POST", "/v1/query", {"sql": sql}, key)
                    outcome = "answered" if code == 200 else f"{code}:{resp['error']['code']}"
                except OSError as e:
                    outcome = type(e).__name__
                with lock:
                    outcomes[outcome] += 1
                    latencies.append(time.perf_counter() - t0)

        ts = [threading.Thread(target=client) for _ in range(clients)]
        started = time.perf_counter()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        elapsed = time.perf_counter() - started
    summary = _summary(latencies, elapsed)
    return {
        "answered_per_s": round(outcomes["answered"] / elapsed, 1),
        "p50_ms": summary["p50_ms"],
        "p99_ms": summary["p99_ms"],
        "outcomes": dict(outcomes),
        "clients": clients,
        "workers": 2,
    }


# -- main ------------------------------------------------------------------------------


@contextmanager
def postgres_schema(base: str) -> Iterator[str]:
    schema = "dpgate_bench_" + uuid.uuid4().hex[:10]
    engine = sa.create_engine(base)
    with engine.begin() as conn:
        conn.exec_driver_sql(f"CREATE SCHEMA {schema}")
    sep = "&" if "?" in base else "?"
    try:
        yield f"{base}{sep}options=-csearch_path%3D{schema}"
    finally:
        with engine.begin() as conn:
            conn.exec_driver_sql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        engine.dispose()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.bench_ledger", description=__doc__)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument(
        "--postgres",
        default=os.environ.get("DPGATE_BENCH_POSTGRES_URL")
        or os.environ.get("DPGATE_TEST_POSTGRES_URL"),
    )
    p.add_argument("--skip-http", action="store_true")
    args = p.parse_args(argv)
    results: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "seconds": args.seconds,
    }
    with tempfile.TemporaryDirectory(prefix="dpgate-bench-ledger-") as tmp:
        backends: list[tuple[str, Any]] = [
            ("sqlite", lambda: _nullctx(f"sqlite:///{tmp}/{uuid.uuid4().hex}.db")),
            (
                "sqlite-synchronous-normal",
                lambda: _nullctx(f"sqlite:///{tmp}/{uuid.uuid4().hex}.db?synchronous=normal"),
            ),
        ]
        if args.postgres:
            backends.append(("postgresql", lambda: postgres_schema(args.postgres)))
        for name, make_url in backends:
            log(f"ledger level, {name} …")
            with make_url() as url:
                results[f"ledger/{name}"] = bench_ledger_level(url, args.seconds)
            if not args.skip_http:
                log(f"http level, {name} …")
                with make_url() as url:
                    results[f"http/{name}"] = bench_http(url, args.seconds)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2))
    print("| figure | value |\n|---|---|")
    for key, value in results.items():
        if key.startswith("ledger/"):
            for mode, s in value.items():
                print(
                    f"| {key} {mode}: reserve+commit/s | {s['ops_per_s']} (p50 {s['p50_ms']} ms) |"
                )
        elif key.startswith("http/"):
            print(
                f"| {key} gunicorn -w 2: answered/s | {value['answered_per_s']} "
                f"(p50 {value['p50_ms']} ms, outcomes {value['outcomes']}) |"
            )
    return 0


@contextmanager
def _nullctx(value: str) -> Iterator[str]:
    yield value


if __name__ == "__main__":
    raise SystemExit(main())
