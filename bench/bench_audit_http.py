"""The audit's price in HTTP latency, as its history grows (issue 32's target: with 300
answered queries of one analyst in its history, the median latency of a new answered
query with ``audit.mode: refuse`` at most 1 ms above the same with the audit off; after
1,000, the audit adds at most 5 ms).

    python -m bench.bench_audit_http [--probes 60] [--marks 300 1000]

Starts ``dpgate serve --workers 1`` on the demo (12,000 patients, release timing off)
twice — audit ``refuse`` and ``off`` — and sends one analyst's distinct counts over
random age × income boxes on a coarse grid (5 years, 5,000) over one keep-alive
connection; the refused ones (a box that differs from earlier ones by a small group)
are counted, not timed. At each mark (that
many answered queries in the history) the next ``--probes`` answered queries are timed;
refusals are counted, not timed. Both servers see the same query sequence.
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.bench_latency import post, start_server
from bench.common import RESULTS_DIR


def run(audit: str, root: Path, sqls: list[str], marks: list[int], probes: int) -> dict[str, Any]:
    """Per mark: the median and p90 (ms) of ``probes`` answered queries sent once the
    history holds that many answered ones."""
    proc, port, key = start_server(root, audit)
    out: dict[str, Any] = {}
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        answered = refused = 0
        queue = iter(sqls)
        for mark in marks:
            while answered < mark:
                sql = next(queue, None)
                if sql is None:
                    out["exhausted_at"] = answered
                    return out
                if post(conn, key, sql).get("ok"):
                    answered += 1
                else:
                    refused += 1
            times = []
            while len(times) < probes:
                sql = next(queue, None)
                if sql is None:
                    out["exhausted_at"] = answered
                    return out
                t = time.perf_counter()
                body = post(conn, key, sql)
                elapsed = time.perf_counter() - t
                if body.get("ok"):
                    times.append(elapsed * 1000)
                    answered += 1
                else:
                    refused += 1
            times.sort()
            out[str(mark)] = {
                "median_ms": statistics.median(times),
                "p90_ms": times[int(0.9 * (len(times) - 1))],
                "refused_so_far": refused,
            }
            print(f"audit {audit}, {mark} answered: {out[str(mark)]}", flush=True)
        conn.close()
    finally:
        proc.terminate()
        proc.wait(10)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--probes", type=int, default=60)
    parser.add_argument("--marks", type=int, nargs="+", default=[300, 1000])
    args = parser.parse_args()
    rng = random.Random(11)
    boxes = [
        (a, b, x, y)
        for a in range(0, 100, 5)
        for b in range(a + 10, 101, 5)
        for x in range(0, 60_000, 5_000)
        for y in range(x + 10_000, 80_001, 5_000)
    ]
    rng.shuffle(boxes)
    sqls = [
        f"SELECT COUNT(*) FROM patients WHERE age BETWEEN {a} AND {b} "
        f"AND income >= {x} AND income < {y}"
        for a, b, x, y in boxes
    ]
    root = Path(tempfile.mkdtemp(prefix="dpgate-audit-http-"))
    results = {
        audit: run(audit, root, sqls, args.marks, args.probes) for audit in ("off", "refuse")
    }
    print("| answered in history | audit off median ms | audit refuse median ms | added |")
    print("|---|---|---|---|")
    for mark in args.marks:
        if str(mark) not in results["off"] or str(mark) not in results["refuse"]:
            print(f"| {mark} | not reached: {results} |")
            continue
        off, on = results["off"][str(mark)], results["refuse"][str(mark)]
        added = on["median_ms"] - off["median_ms"]
        print(f"| {mark} | {off['median_ms']:.2f} | {on['median_ms']:.2f} | {added:+.2f} |")
    RESULTS_DIR.mkdir(exist_ok=True)
    (RESULTS_DIR / "bench_audit_http.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
