"""CPU to refuse hostile input (issue 36: at most 100 ms per request): the largest
bodies and SQL texts each input limit sees, and the costliest ones just inside a limit
that a later pass refuses, sent through the app's test client (the whole request path:
JSON, request checks, tokens, parser, analyzer) and over the PostgreSQL wire (a wire
server in a thread of this process: the CPU counted is the round trip's, client
included), best and worst of ``--repeats``.

The startup heap is frozen first, as the servers do (``gateway.ops.heap``): without that,
a full collection of the ~125,000 objects every process starts with lands on whichever
request triggers it, 40–120 ms whatever the input.

    python -m bench.refusal_cpu [--repeats 20] [--no-wire]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from gateway.core.config_load import parse_config
from gateway.demo.hospital import build, config_yaml
from gateway.http.app import create_app
from gateway.ops.heap import freeze_startup_heap
from gateway.pipeline.gateway import Gateway

WHERE = "SELECT COUNT(*) FROM patients WHERE "
GROUP_KEYS = ", ".join(f"age + {i}" for i in range(250))
CASES = {
    "99k parentheses": {"sql": WHERE + "(" * 99_000},
    "24k NOT": {"sql": WHERE + "NOT " * 24_000 + "age > 1"},
    "96 kB AND chain": {"sql": WHERE + " AND ".join(["age > 1"] * 8000)},
    # Under the token cap: refused by the count of ANDs and ORs, before the parser.
    "1,990-term AND chain": {"sql": WHERE + " AND ".join(["age > 1"] * 1990)},
    # At the count of ANDs: parsed, refused by the tree's size (max_statement_nodes).
    "512-term AND chain": {"sql": WHERE + " AND ".join(["age > 1"] * 512)},
    # Parsed, refused by the tree's depth (max_tree_depth).
    "1,990-term + chain": {"sql": WHERE + " + ".join(["age"] * 1990) + " > 1"},
    "1,300-term HAVING + chain": {
        "sql": "SELECT sex, COUNT(*) FROM patients GROUP BY sex HAVING "
        + " + ".join(["COUNT(*)"] * 1300)
        + " > 1"
    },
    # Parsed, refused by the longest list (max_list_items).
    "COALESCE of 3,990 arguments": {
        "sql": WHERE + "COALESCE(" + ",".join(["age"] * 3990) + ") > 1"
    },
    "1,590 SUMs": {"sql": "SELECT " + ", ".join(["SUM(age)"] * 1590) + " FROM patients"},
    "3,900 GROUP BY keys": {
        "sql": "SELECT COUNT(*) FROM patients GROUP BY " + ", ".join(["sex"] * 3900)
    },
    # Inside every tree limit: refused by the analyzer's later passes.
    "250 GROUP BY keys, then an unknown column": {
        "sql": f"SELECT {GROUP_KEYS}, COUNT(*) FROM patients GROUP BY {GROUP_KEYS}, nosuch"
    },
    "3 IN lists of 1,000, then an unknown column": {
        "sql": WHERE
        + " AND ".join(["age IN (" + ",".join(["1"] * 1000) + ")"] * 3)
        + " AND nosuch = 1"
    },
    "CASE of 250 WHENs": {
        "sql": "SELECT SUM(CASE "
        + " ".join(f"WHEN age = {i} THEN {i}" for i in range(250))
        + " END) FROM patients"
    },
    "49k-value IN list": {"sql": WHERE + "age IN (" + ",".join(["1"] * 49_000) + ")"},
    "99k-char string": {"sql": WHERE + "city = '" + "x" * 99_000 + "'"},
    "7,000 junk tokens": {"sql": WHERE + " ".join(["#>"] * 7_000)},
    "CASE 60 deep": {"sql": WHERE + "CASE WHEN " * 60 + "age > 1" + " THEN TRUE END" * 60},
    "ABS 40 deep": {"sql": WHERE + "ABS(" * 40 + "age" + ")" * 40 + " > 1"},
    "99k-digit number in SQL": {"sql": WHERE + "age > " + "9" * 99_000},
    "4,000-digit ε": {"sql": "SELECT COUNT(*) FROM patients", "epsilon": 10**4000},
}
RAW = {
    "1 MB of [": "[" * 999_000,
    "1 MB nested 500 deep": "[" * 500 + "0," * 498_000 + "0" + "]" * 500,
    "1 MB number": '{"sql": "SELECT 1", "epsilon": ' + "1" * 999_000 + "}",
}


def _cpu_ms(samples: list[float]) -> dict[str, float]:
    return {"min": round(1000 * min(samples), 1), "max": round(1000 * max(samples), 1)}


def run(repeats: int = 20, wire: bool = True) -> dict[str, Any]:
    logging.disable(logging.CRITICAL)
    root = Path(tempfile.mkdtemp(prefix="dpgate-refusal-"))
    build(root / "h.db", patients=1000)
    raw = yaml.safe_load(config_yaml(str(root / "h.db"), str(root / "ledger.db")))
    raw["postgres_wire"] = {"port": 0}
    os.environ.setdefault("DPGATE_ADMIN_KEY", "admin-" + "k" * 40)
    gateway = Gateway(parse_config(raw))
    key = gateway.ledger.create_analyst("alice", 10.0, 1e-6)
    client = create_app(gateway.config, gateway=gateway).test_client()
    server = port = None
    if wire:
        from gateway.pgwire.server import WireServer

        server = WireServer(gateway.config, gateway)
        _, port = server.bind("127.0.0.1")
        threading.Thread(target=server.serve_forever, daemon=True).start()
    freeze_startup_heap()
    bodies = {**{n: json.dumps(b) for n, b in CASES.items()}, **RAW}
    out: dict[str, Any] = {"load_average": [round(x, 1) for x in os.getloadavg()]}
    for name, body in bodies.items():
        cpu = []
        for _ in range(repeats):
            began = time.process_time()
            resp = client.post(
                "/v1/query",
                data=body,
                headers={"Authorization": f"Bearer {key}"},
                content_type="application/json",
            )
            cpu.append(time.process_time() - began)
        code = (resp.get_json() or {}).get("error", {}).get("code")
        out[name] = {"status": resp.status_code, "code": code, "http_cpu_ms": _cpu_ms(cpu)}
        case = CASES.get(name, {})
        sql = case.get("sql")
        if port is not None and isinstance(sql, str) and len(case) == 1:  # SQL is the input
            out[name]["wire_sqlstate"], out[name]["wire_cpu_ms"] = _over_the_wire(
                port, key, sql, repeats
            )
    if server is not None:
        server.shutdown()
    out["load_average_after"] = [round(x, 1) for x in os.getloadavg()]
    out["epsilon_charged"] = gateway.charges.status("alice").epsilon_spent
    return out


def _over_the_wire(port: int, key: str, sql: str, repeats: int) -> tuple[str, dict[str, float]]:
    import psycopg

    cpu = []
    state = ""
    with psycopg.connect(
        host="127.0.0.1", port=port, user="alice", password=key, dbname="dpgate",
        sslmode="disable", autocommit=True,
    ) as conn:  # fmt: skip
        for _ in range(repeats):
            began = time.process_time()
            try:
                conn.execute(sql, prepare=False)
                state = "answered"
            except psycopg.Error as e:
                state = e.sqlstate or "?"
            cpu.append(time.process_time() - began)
    return state, _cpu_ms(cpu)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.refusal_cpu")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--no-wire", action="store_true")
    args = parser.parse_args()
    result = run(args.repeats, wire=not args.no_wire)
    print(json.dumps(result, indent=2, ensure_ascii=False))
    assert result["epsilon_charged"] == 0.0, "a refusal was charged"
