"""Scale: dpgate end-to-end latency vs the raw aggregate, and dpgate's memory, as rows grow.

For each backend (SQLite, DuckDB, PostgreSQL when reachable) and each size, a fresh worker
process times, interleaved repetition by repetition (so machine load hits both alike):

- ``raw``: the analyst's aggregate executed as-is through SQLAlchemy (exact, no DP);
- ``dpgate_sql``: the statement dpgate compiles for it (clamping, rounding to the grid)
  executed directly through the same raw engine — so the ratio dpgate / raw splits into
  the cost of the DP-safe SQL and the gateway's own per-query overhead;
- ``dpgate``: the same query through ``Gateway.query`` in-process, row-level table
  (analyze → calibrate → reserve → execute → noise → commit), a fresh analyst per
  repetition so that every repetition is a cache miss with a real ledger commit;
- ``dpgate_unit``: the same on the person-level table (privacy unit ``pid``,
  ``max_rows_per_unit: 1``), which adds per-person contribution bounding to the SQL.

and reports medians, the dpgate/raw ratio, the peak Python heap of one gateway query
(tracemalloc) and the worker's peak RSS. The ledger is a fresh SQLite file per worker.
"""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

from bench import datagen
from bench.adapter import InProcess, scale_tables, write_config
from bench.common import DATA_DIR, log

QUERIES = (
    ("count", "SELECT COUNT(*) AS n FROM {t}"),
    ("group_sex", "SELECT sex, COUNT(*) AS n FROM {t} GROUP BY sex"),
    ("avg_income", "SELECT AVG(income) AS a FROM {t}"),
)
MODES = ("raw", "dpgate_sql", "dpgate", "dpgate_unit")


def _rss_mb() -> float:
    # ru_maxrss is in KiB on Linux.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def worker(backend: str, rows: int, reps: int) -> dict[str, Any]:
    import sqlalchemy as sa

    t = datagen.target(backend, rows)
    workdir = DATA_DIR / "scale-run" / f"{backend}-{rows}"
    workdir.mkdir(parents=True, exist_ok=True)
    ledger = workdir / "ledger.db"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{ledger}{suffix}").unlink(missing_ok=True)
    cfg = write_config(
        workdir / "dpgate.yaml",
        database_url=t.url,
        ledger_url=f"sqlite:///{ledger}",
        tables=scale_tables(t.table),
    )
    rss_start = _rss_mb()
    gw = InProcess(cfg)
    # The raw engine opens the database as dpgate does where it matters (DuckDB allows one
    # configuration per file and process: read-only).
    raw_kw = {"connect_args": {"read_only": True}} if backend == "duckdb" else {}
    raw_engine = sa.create_engine(t.url, **raw_kw)

    def run_raw(sql: str) -> None:
        with raw_engine.connect() as c:
            c.execute(sa.text(sql)).fetchall()

    timings: dict[str, dict[str, list[float]]] = {q: {m: [] for m in MODES} for q, _ in QUERIES}
    errors: dict[str, str] = {}
    analysts = [gw.new_analyst() for _ in range(reps + 1)]
    compiled_sql = {q: gw.compiled_sql(sql.format(t="people")) for q, sql in QUERIES}

    def run_mode(mode: str, qname: str, sql: str, analyst: Any) -> float | None:
        key = f"{qname}/{mode}"
        if key in errors:
            return None
        started = time.perf_counter()
        if mode == "raw":
            run_raw(sql.format(t=t.table))
        elif mode == "dpgate_sql":
            compiled = compiled_sql.get(qname)
            if compiled is None:
                errors[key] = "compiled SQL unavailable"
                return None
            run_raw(compiled)
        else:
            table = "people" if mode == "dpgate" else "people_unit"
            ans = gw.query(analyst, sql.format(t=table))
            if not ans.ok:
                errors[key] = ans.error or "refused"
                return None
            if ans.cached:
                errors[key] = "unexpected cache hit"
        return time.perf_counter() - started

    # Warm-up (page cache, buffer pools, connection pools, sqlglot caches): not timed.
    for qname, sql in QUERIES:
        for mode in MODES:
            run_mode(mode, qname, sql, analysts[0])
    rss_warm = _rss_mb()
    for i in range(reps):
        for qname, sql in QUERIES:
            order = MODES if i % 2 == 0 else tuple(reversed(MODES))
            for mode in order:
                dt = run_mode(mode, qname, sql, analysts[i + 1])
                if dt is not None:
                    timings[qname][mode].append(dt)

    # Peak Python heap of one gateway query (tracemalloc slows Python: measured apart).
    heap: dict[str, float] = {}
    extra = gw.new_analyst()
    for qname, sql in QUERIES:
        tracemalloc.start()
        gw.query(extra, sql.format(t="people"))
        heap[qname] = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()

    gw.close()
    raw_engine.dispose()
    out: dict[str, Any] = {
        "backend": backend,
        "rows": rows,
        "reps": reps,
        "queries": {},
        "errors": errors,
        "rss_mb": {"start": rss_start, "after_warmup": rss_warm, "peak": _rss_mb()},
        "heap_peak_mb": heap,
    }
    for qname, _ in QUERIES:
        med = {m: (statistics.median(v) * 1e3 if v else None) for m, v in timings[qname].items()}
        out["queries"][qname] = {
            "median_ms": med,
            "all_ms": {m: [x * 1e3 for x in v] for m, v in timings[qname].items()},
            "ratio_dpgate_raw": _ratio(med["dpgate"], med["raw"]),
            "ratio_dpgate_sql_raw": _ratio(med["dpgate_sql"], med["raw"]),
            "overhead_ms": (
                med["dpgate"] - med["dpgate_sql"]
                if med["dpgate"] is not None and med["dpgate_sql"] is not None
                else None
            ),
            "compiled_sql": compiled_sql.get(qname),
            "ratio_dpgate_unit_raw": _ratio(med["dpgate_unit"], med["raw"]),
        }
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def run(sizes: list[int], backends: list[str], reps_for: dict[int, int]) -> dict[str, Any]:
    results = []
    for backend in backends:
        if backend == "postgresql" and not datagen.postgres_reachable():
            log("scale: PostgreSQL not reachable, skipped")
            continue
        for rows in sizes:
            datagen.ensure(backend, rows)
            reps = reps_for.get(rows, 5)
            log(f"scale: {backend} {rows:,} rows, {reps} reps")
            job = json.dumps({"backend": backend, "rows": rows, "reps": reps})
            proc = subprocess.run(
                [sys.executable, "-m", "bench.scale", "--worker", job],
                capture_output=True,
                text=True,
                check=False,
                env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
            )
            if proc.returncode != 0:
                log(f"scale worker failed: {proc.stderr[-3000:]}")
                results.append({"backend": backend, "rows": rows, "failed": proc.stderr[-3000:]})
                continue
            results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return {"runs": results}


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        job = json.loads(sys.argv[2])
        print(json.dumps(worker(job["backend"], job["rows"], job["reps"])))
    else:
        sizes = [int(s) for s in sys.argv[1:]] or [100_000]
        print(json.dumps(run(sizes, list(datagen.BACKENDS), {}), indent=1))
