"""The audit's CPU per answered query, in process (issue 32's price without HTTP).

    python -m bench.audit_cpu [--mark 300] [--probes 100] [--profile]

Builds the demo (12,000 patients) once and two ``Gateway``s on it (release timing off),
one with ``audit.mode: off`` and one with ``refuse``, each with a fresh ledger and the
analyst ``bench``. The ``rollups`` workload of ``bench.bench_audit_http`` goes to both,
query by query (which goes first alternates), until the auditing one has answered
``--mark``; then the next ``--probes`` answered queries are timed with
``time.process_time()`` around ``Gateway.query`` on both, and each query's audit-off
CPU is subtracted from its audit-on CPU: the median of those differences is what the
audit adds, with the statement's own time (the same query, the same rows) taken out
within each pair. ``--profile`` prints the 40 costliest functions (cumulative) of the
auditing side's probes under cProfile. Pin it to one CPU (``taskset -c 1``) and run it
more than once: this machine's speed drifts by tens of percent between runs.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.bench_audit_http import rollup_queries
from bench.bench_latency import demo_config


def _gateway(root: Path, audit: str) -> tuple[Any, str]:
    from gateway.core.config_load import load_config
    from gateway.pipeline.gateway import Gateway

    config, _ = demo_config(root, audit)
    return Gateway(load_config(config)), "bench"


def run(root: Path, mark: int, probes: int, profile: bool) -> dict[str, Any]:
    """Both modes side by side: each query goes to both gateways (alternating which goes
    first), and each probe's CPU is compared within its pair."""
    from gateway.core.errors import GatewayError
    from gateway.core.plan import QueryRequest

    gateways = {mode: _gateway(root, mode) for mode in ("off", "refuse")}
    sqls = iter(rollup_queries(random.Random(1)))
    refused = 0

    def ask(mode: str, sql: str) -> tuple[bool, float]:
        gateway, analyst = gateways[mode]
        request = QueryRequest(sql=sql, epsilon=1.0, delta=0.0, mechanism="laplace")
        started = time.process_time()
        try:
            gateway.query(analyst, request)
        except GatewayError:
            return False, time.process_time() - started
        return True, time.process_time() - started

    def both(sql: str, turn: int) -> dict[str, tuple[bool, float]]:
        order = ("off", "refuse") if turn % 2 else ("refuse", "off")
        return {mode: ask(mode, sql) for mode in order}

    answered = 0
    while answered < mark:
        out = both(next(sqls), answered)
        answered += out["refuse"][0]
        refused += not out["refuse"][0]
    profiler = cProfile.Profile() if profile else None
    cpu: dict[str, list[float]] = {"off": [], "refuse": []}
    added: list[float] = []
    for turn in range(10 * probes):
        if len(added) >= probes:
            break
        sql = next(sqls)
        if profiler is not None:
            profiler.enable()
            ok, spent = ask("refuse", sql)
            profiler.disable()
            out = {"refuse": (ok, spent), "off": ask("off", sql)}
        else:
            out = both(sql, turn)
        if not out["refuse"][0]:
            refused += 1
            continue
        for mode in cpu:
            cpu[mode].append(out[mode][1] * 1000)
        added.append(1000 * (out["refuse"][1] - out["off"][1]))
    if profiler is not None:
        text = io.StringIO()
        stats = pstats.Stats(profiler, stream=text).sort_stats("cumulative")
        stats.print_stats(40)
        print(text.getvalue())
    for gateway, _ in gateways.values():
        gateway.engine.dispose()
        gateway.ledger.close()
    return {
        "off_median_ms": round(statistics.median(cpu["off"]), 3),
        "refuse_median_ms": round(statistics.median(cpu["refuse"]), 3),
        "added_median_ms": round(statistics.median(added), 3),
        "refused": refused,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mark", type=int, default=300)
    parser.add_argument("--probes", type=int, default=100)
    parser.add_argument("--profile", action="store_true", help="cProfile the refuse side")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="dpgate-audit-cpu-"))
    print(json.dumps(run(root, args.mark, args.probes, args.profile)))


if __name__ == "__main__":
    main()
