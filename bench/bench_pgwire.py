"""The PostgreSQL front end's per-query overhead against HTTP (issue 18's goal: ≤ 1 ms).

    python -m bench.bench_pgwire [--n 400]

One process serves a fresh copy of the demo (release timing off, audit off) twice: over
HTTP (the Flask app under waitress, one keep-alive connection) and over the PostgreSQL
protocol (``WireServer``, one psycopg connection, extended protocol). The same
cached query (free, no database: the pipeline's own work is the same small, fixed amount
on both sides) is sent ``n`` times through each, interleaved repetition by repetition so
load hits both alike; the overhead is the difference of the medians.
"""

from __future__ import annotations

import argparse
import http.client
import json
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import yaml

SQL = "SELECT sex, COUNT(*) AS n FROM patients WHERE age >= 40 GROUP BY sex"


def run(n: int = 400) -> dict[str, Any]:
    import psycopg
    import waitress.server

    from gateway.core.config_load import parse_config
    from gateway.core.plan import QueryRequest
    from gateway.demo.hospital import build, config_yaml
    from gateway.http.app import create_app
    from gateway.pgwire.server import WireServer
    from gateway.pipeline.gateway import Gateway

    work = Path(tempfile.mkdtemp(prefix="dpgate-bench-pgwire-"))
    try:
        build(work / "h.db", patients=3000)
        raw = yaml.safe_load(config_yaml(str(work / "h.db"), str(work / "ledger.db")))
        raw["execution"] = {"timing": "off"}
        raw["audit"] = {"mode": "off"}
        raw["postgres_wire"] = {"port": 0}
        raw.pop("analysts", None)
        config = parse_config(raw)
        gateway = Gateway(config)
        key = gateway.ledger.create_analyst("bench", 1000.0, 1e-6)
        wire = WireServer(config, gateway)
        _, pg_port = wire.bind("127.0.0.1")
        threading.Thread(target=wire.serve_forever, daemon=True).start()
        http_server = waitress.server.create_server(
            create_app(config, gateway=gateway), host="127.0.0.1", port=0, threads=4
        )
        http_port = http_server.effective_port  # type: ignore[union-attr]
        threading.Thread(target=http_server.run, daemon=True).start()

        body = json.dumps({"sql": SQL})
        headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
        client = http.client.HTTPConnection("127.0.0.1", http_port)
        conn = psycopg.connect(
            host="127.0.0.1",
            port=pg_port,
            user="bench",
            password=key,
            dbname="dpgate",
            sslmode="disable",
            autocommit=True,
        )
        request = QueryRequest(sql=SQL, epsilon=0.1, delta=1e-7, mechanism="laplace")

        def over_http() -> None:
            client.request("POST", "/v1/query", body=body, headers=headers)
            response = client.getresponse()
            response.read()
            assert response.status == 200

        def over_wire() -> None:
            rows = conn.execute(SQL).fetchall()
            assert len(rows) == 2

        def in_process() -> None:
            gateway.query("bench", request)

        for fn in (over_http, over_wire, in_process):  # the first answer is charged once
            for _ in range(10):
                fn()
        times: dict[str, list[float]] = {"http": [], "wire": [], "in_process": []}
        for _ in range(n):
            for name, fn in (("http", over_http), ("wire", over_wire), ("in_process", in_process)):
                t = time.perf_counter()
                fn()
                times[name].append((time.perf_counter() - t) * 1000)
        conn.close()
        client.close()
        http_server.close()
        wire.shutdown()
        medians = {k: statistics.median(v) for k, v in times.items()}
        return {
            "n": n,
            "median_ms": medians,
            "p90_ms": {k: statistics.quantiles(v, n=10)[-1] for k, v in times.items()},
            "wire_minus_http_ms": medians["wire"] - medians["http"],
            "wire_minus_in_process_ms": medians["wire"] - medians["in_process"],
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.bench_pgwire")
    parser.add_argument("--n", type=int, default=400)
    print(json.dumps(run(parser.parse_args().n), indent=1))


if __name__ == "__main__":
    main()
