"""What grants and the audit chain cost on the hot path (issue 39).

    python -m bench.bench_access [--reps 2000] [--http-reps 400]

On a SQLite file ledger (``synchronous=full``), medians over ``--reps``:

- ``lookup``: a request's one ledger read (``Ledger.lookup``: the key, the analyst) without
  and with the grants read in it: with no grant stored (the groups are not read then,
  as when the config grants nothing), and with 20 stored grants and 3 memberships;
- ``chain``: one audit-log row's hash (``budget.audit_chain.row_hash``: canonical JSON and
  SHA-256), and an admin change written with and without its chained audit row
  (``Ledger.update_analyst``, a durable write transaction each);
- ``http``: a cached answer through the real Flask app (``POST /v1/query``, the same
  query, a cache hit: identification, the grants, planning from the plan cache, no
  data), ``--http-reps`` each, for a config without grants, with grants the caller holds
  all of, and with grants that hide one table from the caller (planned again against
  the tables they may read, from that planner's cache).

Results: stdout (markdown) and ``bench/results/bench_access.json``. Not part of
``make bench``; figures depend on the machine's load (note ``uptime``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from budget import AdminCaller, Ledger, audit_chain
from budget.schema import utcnow

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results" / "bench_access.json"
ADMIN_KEY = "bench-admin-" + "k" * 32


def median_us(fn: Callable[[], Any], reps: int) -> float:
    for _ in range(min(50, reps)):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def bench_lookup(tmp: Path, reps: int) -> dict[str, float]:
    ledger = Ledger.from_url(f"sqlite:///{tmp}/lookup.db")
    ledger.migrate()
    key = ledger.create_analyst("alice", 10.0, 1e-6)
    out = {
        "lookup_us": median_us(lambda: ledger.lookup(key), reps),
        "lookup_with_access_no_grants_us": median_us(
            lambda: ledger.lookup(key, access=True, groups=False), reps
        ),
    }
    for i in range(20):
        ledger.grant(f"table{i}", f"group{i % 5}")
    for g in ("group0", "group1", "group2"):
        ledger.add_member(g, "alice")
    out["lookup_with_access_us"] = median_us(lambda: ledger.lookup(key, access=True), reps)
    ledger.close()
    return out


def bench_chain(tmp: Path, reps: int) -> dict[str, float]:
    row = {
        "seq": 12345,
        "request_id": "f" * 32,
        "actor": "admin",
        "analyst": None,
        "endpoint": "PATCH /v1/admin/analysts/alice",
        "action": "budget.set",
        "params": audit_chain.params_text({"name": "alice", "epsilon": 3.0}),
        "sql": None,
        "outcome": "admin",
        "error_code": None,
        "status": 200,
        "created_at": utcnow(),
    }
    ledger = Ledger.from_url(f"sqlite:///{tmp}/chain.db")
    ledger.migrate()
    ledger.create_analyst("alice", 10.0, 1e-6)
    caller = AdminCaller(actor="admin", request_id="r" * 32, endpoint="bench")
    budgets = iter(range(10**9))
    n = max(50, reps // 10)  # durable writes: fewer
    out = {
        "row_hash_us": median_us(lambda: audit_chain.row_hash(row, "0" * 64), reps),
        "change_without_row_us": median_us(
            lambda: ledger.update_analyst("alice", epsilon=10.0 + next(budgets) * 1e-9), n
        ),
        "change_with_chained_row_us": median_us(
            lambda: ledger.update_analyst(
                "alice", epsilon=10.0 + next(budgets) * 1e-9, caller=caller
            ),
            n,
        ),
    }
    ledger.close()
    return out


def _config(tmp: Path, db: Path, name: str, grants: dict[str, list[str]]) -> Any:
    from gateway.core.config_load import parse_config
    from gateway.demo.hospital import config_yaml

    raw = yaml.safe_load(config_yaml(str(db), str(tmp / f"{name}-ledger.db")))
    raw["execution"] = {"timing": "off"}
    raw["audit"] = {"mode": "off"}
    raw["analysts"] = []
    for table, groups in grants.items():
        raw["tables"][table]["grants"] = groups
    return parse_config(raw)


def bench_http(tmp: Path, reps: int) -> dict[str, float]:
    from gateway.demo.hospital import build
    from gateway.http.app import create_app
    from gateway.pipeline.gateway import Gateway

    db = tmp / "hospital.db"
    build(db, patients=3000)
    cases = {
        "no_grants": {},
        "grants_caller_reads_all": {"patients": ["oncology"], "visits": ["oncology"]},
        "grants_one_table_hidden": {"patients": ["oncology"], "visits": ["cardio"]},
    }
    out: dict[str, float] = {}
    for name, grants in cases.items():
        gw = Gateway(_config(tmp, db, name, grants))
        key = gw.ledger.create_analyst("alice", 1000.0, 1e-6)
        if grants:
            gw.ledger.add_member("oncology", "alice")
        client = create_app(gw.config, gateway=gw).test_client()
        body = {"sql": "SELECT sex, COUNT(*) AS n FROM patients GROUP BY sex", "epsilon": 0.1}
        headers = {"Authorization": f"Bearer {key}"}
        first = client.post("/v1/query", json=body, headers=headers)
        assert first.status_code == 200, first.get_json()

        def hit(client: Any = client, body: Any = body, headers: Any = headers) -> None:
            r = client.post("/v1/query", json=body, headers=headers)
            assert r.status_code == 200 and r.get_json()["cached"]

        out[f"{name}_us"] = median_us(hit, reps)
        gw.ledger.close()
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=2000)
    parser.add_argument("--http-reps", type=int, default=400)
    args = parser.parse_args(argv)
    os.environ["DPGATE_ADMIN_KEY"] = ADMIN_KEY
    import logging

    logging.disable(logging.INFO)
    results: dict[str, Any] = {"load": os.getloadavg()}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        results["lookup"] = bench_lookup(tmp, args.reps)
        results["chain"] = bench_chain(tmp, args.reps)
        results["http"] = bench_http(tmp, args.http_reps)
    results["load_after"] = os.getloadavg()
    print("| part | measure | median µs |")
    print("|---|---|---|")
    for part in ("lookup", "chain", "http"):
        for measure, value in results[part].items():
            print(f"| {part} | {measure} | {value:.1f} |")
    print(f"load average before / after: {results['load']} / {results['load_after']}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
