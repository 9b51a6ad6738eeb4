"""Scale: dpgate end-to-end latency vs the raw aggregate, and dpgate's memory, as rows grow.

For each backend (SQLite, DuckDB, PostgreSQL when reachable, ClickHouse embedded as chDB)
and each size, a fresh worker
process times, interleaved repetition by repetition (so machine load hits both alike):

- ``raw``: the analyst's aggregate executed as-is through SQLAlchemy (exact, no DP);
- ``dpgate_sql``: the statement dpgate compiles for it (clamping, rounding to the grid)
  executed directly through the same raw engine — so the ratio dpgate / raw splits into
  the cost of the DP-safe SQL and the gateway's own per-query overhead;
- ``dpgate``: the same query through ``Gateway.query`` in-process, row-level table
  (analyze → calibrate → reserve → execute → noise → commit), a fresh analyst per
  repetition so that every repetition is a cache miss with a real ledger commit;
- ``unit_sql`` and ``dpgate_unit``: the same two on the person-level table (privacy unit
  ``pid``, ``max_rows_per_unit: 1``), which adds per-person contribution bounding to the
  SQL (the unit column has no key, so the database cannot enforce it);
- ``unit3_sql``: the compiled statement for ``max_rows_per_unit: 3``;
- ``before_unit_sql`` and ``before_unit3_sql`` (``COUNT(*)`` on SQLite and DuckDB): the
  statement dpgate compiled for the same two bounded counts before issue 14 (commit
  2efccd4: a ``ROW_NUMBER()`` window ordered by the unit), so that the bounded COUNT's
  speed-up is measured in the same run, on the same data and machine.

and reports medians, every mode's ratio to raw, the peak Python heap of one gateway query
(tracemalloc) and the worker's peak RSS. The ledger is a fresh SQLite file per worker;
release timing is off (``execution.timing: off``), so the figures are the work itself,
not the deadline an answer waits for.
"""

from __future__ import annotations

import json
import math
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
from bench.common import DATA_DIR, fmt, last_line, log

QUERIES = (
    ("count", "SELECT COUNT(*) AS n FROM {t}"),
    ("group_sex", "SELECT sex, COUNT(*) AS n FROM {t} GROUP BY sex"),
    ("avg_income", "SELECT AVG(income) AS a FROM {t}"),
)
MODES = (
    "raw",
    "dpgate_sql",
    "dpgate",
    "unit_sql",
    "dpgate_unit",
    "unit3_sql",
    "before_unit_sql",
    "before_unit3_sql",
)
#: Which table each mode queries, and whether it goes through the gateway (else: the
#: statement the gateway compiles for it, executed through the raw engine).
TABLE_OF = {
    "dpgate_sql": "people",
    "dpgate": "people",
    "unit_sql": "people_unit",
    "dpgate_unit": "people_unit",
    "unit3_sql": "people_unit3",
}
THROUGH_GATEWAY = ("dpgate", "dpgate_unit")
#: The bounded COUNT as dpgate compiled it before issue 14 (commit 2efccd4, what the
#: issue measured), per backend: the baseline of its "≥ 2× faster" criterion. ``{t}`` is
#: the table, ``{k}`` the rows kept per person. Only ``COUNT(*)`` has one.
_BEFORE_WINDOW = (
    'SELECT COUNT(*) AS "m0" FROM (SELECT "pid" AS "dp_unit", ROW_NUMBER() OVER '
    '(PARTITION BY "pid" ORDER BY "pid"{nulls}) AS "dp_row_rank" FROM "{{t}}") AS b '
    'WHERE "dp_row_rank" <= {{k}}'
)
BEFORE_SQL = {
    "sqlite": _BEFORE_WINDOW.format(nulls=" NULLS LAST"),
    "duckdb": _BEFORE_WINDOW.format(nulls=""),
}
BEFORE_ROWS_PER_UNIT = {"before_unit_sql": 1, "before_unit3_sql": 3}


def _available_mb() -> str:
    """The machine's available memory in MB (Linux ``/proc/meminfo``), or ``?``."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return f"{int(line.split()[1]) // 1024:,}"
    except (OSError, ValueError, IndexError):
        pass
    return "?"


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
        timing="off",
    )
    rss_start = _rss_mb()
    gw = InProcess(cfg)
    # The raw engine opens the database as dpgate does where it matters (DuckDB allows one
    # configuration per file and process: read-only).
    raw_kw = {"connect_args": {"read_only": True}} if backend == "duckdb" else {}
    if backend == "clickhouse":  # chDB's own driver: through its (read-only) opening
        from gateway.sql.engines import clickhouse

        raw_engine = clickhouse.open_engine(sa.engine.make_url(t.url))
    else:
        raw_engine = sa.create_engine(t.url, **raw_kw)

    def run_raw(sql: str) -> None:
        with raw_engine.connect() as c:
            c.execute(sa.text(sql)).fetchall()

    timings: dict[str, dict[str, list[float]]] = {q: {m: [] for m in MODES} for q, _ in QUERIES}
    errors: dict[str, str] = {}
    analysts = [gw.new_analyst() for _ in range(reps + 1)]
    compiled_sql = {
        (q, mode): gw.compiled_sql(sql.format(t=TABLE_OF[mode]))
        for q, sql in QUERIES
        for mode in MODES
        if mode.endswith("_sql") and mode not in BEFORE_ROWS_PER_UNIT
    }
    if backend in BEFORE_SQL:
        for mode, k in BEFORE_ROWS_PER_UNIT.items():
            compiled_sql[("count", mode)] = BEFORE_SQL[backend].format(t=t.table, k=k)

    def run_mode(mode: str, qname: str, sql: str, analyst: Any) -> float | None:
        key = f"{qname}/{mode}"
        if key in errors:
            return None
        started = time.perf_counter()
        if mode == "raw":
            run_raw(sql.format(t=t.table))
        elif mode not in THROUGH_GATEWAY:
            compiled = compiled_sql.get((qname, mode))
            if compiled is None:
                if mode not in BEFORE_ROWS_PER_UNIT:  # a baseline only some queries have
                    errors[key] = "compiled SQL unavailable"
                return None
            try:
                run_raw(compiled)
            except Exception as e:  # a statement the engine cannot run: its figure only
                errors[key] = f"{type(e).__name__}: {e}"[:300]
                return None
        else:
            ans = gw.query(analyst, sql.format(t=TABLE_OF[mode]))
            if not ans.ok:
                errors[key] = ans.error or "refused"
                return None
            if ans.cached:
                errors[key] = "unexpected cache hit"
        return time.perf_counter() - started

    # Warm-up (page cache, buffer pools, connection pools, sqlglot caches): not timed. Every
    # mode reads the same table, so the slow bounded modes are left out of it.
    for qname, sql in QUERIES:
        for mode in ("raw", "dpgate_sql", "dpgate"):
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
            "compiled_sql": compiled_sql.get((qname, "dpgate_sql")),
            "compiled_unit_sql": compiled_sql.get((qname, "unit_sql")),
            "compiled_unit3_sql": compiled_sql.get((qname, "unit3_sql")),
            "ratio_dpgate_unit_raw": _ratio(med["dpgate_unit"], med["raw"]),
            "ratio_unit_sql_raw": _ratio(med["unit_sql"], med["raw"]),
            "ratio_unit3_sql_raw": _ratio(med["unit3_sql"], med["raw"]),
            "speedup_unit_sql": _ratio(med["before_unit_sql"], med["unit_sql"]),
            "speedup_unit3_sql": _ratio(med["before_unit3_sql"], med["unit3_sql"]),
        }
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


#: Acceptance at 10M rows (issue 14): the AVG statement within 15% of the raw AVG on
#: PostgreSQL, and the person-bounded COUNT at least twice as fast as the baseline on
#: SQLite and DuckDB.
AVG_SQL_TARGET = 1.15
BOUNDED_SPEEDUP_TARGET = 2.0
ACCEPTANCE_ROWS = 10_000_000

Row = tuple[str, str, str, str, bool | None]


def summary_rows(scale: dict[str, Any], baseline: dict[str, Any] | None = None) -> list[Row]:
    """The scale part's lines of the bench table: (part, figure, value, target, met).

    ``baseline``: the ``scale`` part of an earlier results JSON; each bounded figure is
    then also given as a speed-up over the same backend, size and query there."""
    rows: list[Row] = []
    if scale.get("failed"):
        rows.append(("scale", "run", f"failed: {scale['failed'][:120]}", "", None))
    runs = [x for x in scale.get("runs", []) if not x.get("failed")]
    for x in scale.get("runs", []):
        if x.get("failed"):
            rows.append(
                (
                    "scale",
                    f"{x['backend']} {x['rows']:,} rows",
                    f"failed: {last_line(x['failed'])[:160]} (more in the JSON)",
                    "",
                    None,
                )
            )
    before = {
        (b["backend"], b["rows"]): b
        for b in (baseline or {}).get("runs", [])
        if not b.get("failed")
    }
    top = max((x["rows"] for x in runs), default=0)
    for x in runs:
        at_top = x["rows"] == top and top >= ACCEPTANCE_ROWS
        where = f"{x['backend']} {x['rows']:,} rows"
        for qname, q in x["queries"].items():
            med = q["median_ms"]
            ratio = q["ratio_dpgate_raw"]
            if ratio is None:
                value = f"dpgate failed: {x['errors'].get(qname + '/dpgate', '?')[:80]}"
            else:
                value = f"{fmt(ratio)}× ({fmt(med['dpgate'])} vs raw {fmt(med['raw'])} ms)"
            sratio = q.get("ratio_dpgate_sql_raw")
            if sratio is not None and ratio is not None:
                value += (
                    f"; its compiled SQL alone {fmt(sratio)}× raw, gateway overhead "
                    f"{fmt(q['overhead_ms'])} ms"
                )
            rows.append(
                (
                    "scale",
                    f"{where}, {qname}: dpgate / raw",
                    value,
                    "≤ 1.1× at 10M rows" if at_top else "",
                    (ratio <= 1.1) if (at_top and ratio is not None) else None,
                )
            )
            if qname == "avg_income" and x["backend"] == "postgresql" and at_top:
                rows.append(
                    (
                        "scale",
                        f"{where}, avg_income: compiled SQL / raw",
                        f"{fmt(sratio)}×" if sratio is not None else "n/a",
                        f"≤ {AVG_SQL_TARGET}×",
                        (sratio <= AVG_SQL_TARGET) if sratio is not None else None,
                    )
                )
            rows.append(_bounded_row(x, qname, q, before.get((x["backend"], x["rows"])), at_top))
    rows += engine_comparison(runs)
    by_backend: dict[str, list[dict[str, Any]]] = {}
    for x in runs:
        by_backend.setdefault(x["backend"], []).append(x)
    for backend, xs in by_backend.items():
        xs.sort(key=lambda x: x["rows"])
        heaps = " → ".join(f"{fmt(max(x['heap_peak_mb'].values() or [math.nan]))} MB" for x in xs)
        rss = " → ".join(f"{fmt(x['rss_mb']['peak'])} MB" for x in xs)
        sizes = " → ".join(f"{x['rows']:,}" for x in xs)
        rows.append(
            (
                "scale",
                f"{backend}: gateway peak Python heap per query / worker peak RSS ({sizes} rows)",
                f"{heaps} / {rss}",
                "flat as rows grow",
                None,
            )
        )
    return rows


def engine_comparison(runs: list[dict[str, Any]]) -> list[Row]:
    """ClickHouse (chDB) against DuckDB at the largest size both ran: per query, each
    engine's compiled statement against its own raw aggregate, and ClickHouse's times
    over DuckDB's (issue 19)."""
    by = {(x["backend"], x["rows"]): x for x in runs}
    sizes = [n for (b, n) in by if b == "clickhouse" and ("duckdb", n) in by]
    if not sizes:
        return []
    n = max(sizes)
    ch, duck = by[("clickhouse", n)], by[("duckdb", n)]
    out: list[Row] = []
    for qname, q in ch["queries"].items():
        d = duck["queries"].get(qname)
        if d is None:
            continue
        parts = []
        for label, mode in (
            ("raw", "raw"),
            ("compiled", "dpgate_sql"),
            ("bounded", "unit_sql"),
            ("dpgate", "dpgate"),
        ):
            c_ms, d_ms = q["median_ms"].get(mode), d["median_ms"].get(mode)
            parts.append(f"{label} {fmt(c_ms)} vs {fmt(d_ms)} ms ({fmt(_ratio(c_ms, d_ms))}×)")
        parts.append(
            f"compiled / raw: clickhouse {fmt(q['ratio_dpgate_sql_raw'])}×, "
            f"duckdb {fmt(d['ratio_dpgate_sql_raw'])}×"
        )
        out.append(
            ("scale", f"clickhouse vs duckdb {n:,} rows, {qname}", "; ".join(parts), "", None)
        )
    return out


def _bounded_row(
    x: dict[str, Any], qname: str, q: dict[str, Any], base: dict[str, Any] | None, at_top: bool
) -> Row:
    """One line for the person-bounded tables: each bounded mode's ratio to raw and, for
    ``COUNT(*)`` on SQLite and DuckDB, the speed-up of the compiled bounded statements
    over the ones dpgate compiled before issue 14, timed in the same run (the issue's
    acceptance at 10M rows: at least 2× for both ≤ 1 and ≤ 3 rows per person). With
    ``base`` (an earlier results JSON) the gateway's bounded time is compared with it."""
    med = q["median_ms"]
    parts = []
    for mode, label in (
        ("dpgate_unit", "dpgate, ≤ 1 row per person"),
        ("unit_sql", "its SQL"),
        ("unit3_sql", "SQL for ≤ 3 rows"),
    ):
        r = _ratio(med.get(mode), med["raw"])
        if r is None:
            err = x["errors"].get(f"{qname}/{mode}", "not run")
            parts.append(f"{label} failed: {err[:60]}")
        else:
            parts.append(f"{label} {fmt(r)}× raw ({fmt(med[mode])} ms)")
    speedups = []
    for mode, before, label in (
        ("unit_sql", "before_unit_sql", "≤ 1 row"),
        ("unit3_sql", "before_unit3_sql", "≤ 3 rows"),
    ):
        then = med.get(before)
        if then is None and f"{qname}/{before}" not in x["errors"]:
            continue  # no baseline statement for this query or backend
        speedup = _ratio(then, med.get(mode))
        # A baseline statement the engine could not run at all is slower than any time;
        # a bounded statement of today that failed meets nothing.
        speedups.append(
            med.get(mode) is not None and (speedup is None or speedup >= BOUNDED_SPEEDUP_TARGET)
        )
        failure = x["errors"].get(f"{qname}/{before}", "?")[:60]
        parts.append(
            f"{label}: {fmt(speedup)}× faster than before issue 14 ({fmt(then)} ms)"
            if speedup is not None
            else f"{label}: before issue 14 failed: {failure}"
        )
    if base is not None:
        then = base.get("queries", {}).get(qname, {}).get("median_ms", {}).get("dpgate_unit")
        earlier = _ratio(then, med.get("dpgate_unit"))
        parts.append(
            f"{fmt(earlier)}× faster than the baseline JSON ({fmt(then)} ms)"
            if earlier is not None
            else "baseline JSON has no figure"
        )
    check = at_top and qname == "count" and x["backend"] in BEFORE_SQL and bool(speedups)
    return (
        "scale",
        f"{x['backend']} {x['rows']:,} rows, {qname}: per-person bounded / raw",
        "; ".join(parts),
        f"≥ {BOUNDED_SPEEDUP_TARGET}× faster than before issue 14 (same run)" if check else "",
        all(speedups) if check else None,
    )


def run(sizes: list[int], backends: list[str], reps_for: dict[int, int]) -> dict[str, Any]:
    results = []
    for backend in backends:
        if backend == "postgresql" and not datagen.postgres_reachable():
            log("scale: PostgreSQL not reachable, skipped")
            continue
        for rows in sizes:
            try:
                datagen.ensure(backend, rows)
            except Exception as e:  # one backend's data (a DuckDB file locked by another
                # process, say) must not lose the figures of the others
                log(f"scale: {backend} {rows:,} rows: no data ({type(e).__name__})")
                results.append({"backend": backend, "rows": rows, "failed": f"{e}"[:3000]})
                continue
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
                failure = proc.stderr[-3000:]
                if proc.returncode < 0:  # the kernel's OOM killer sends SIGKILL, silently
                    failure += (
                        f"\nthe worker was killed by signal {-proc.returncode}; "
                        f"{_available_mb()} MB of memory are available now (DuckDB's "
                        "worker peaks near 1.8 GB at 10M rows)"
                    )
                log(f"scale worker failed: {failure}")
                results.append({"backend": backend, "rows": rows, "failed": failure})
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
