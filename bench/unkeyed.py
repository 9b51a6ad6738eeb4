"""A table without a unit key at 257K rows (issue 33): what its per-unit bounds cost,
before and after the index `dpgate config check` names, and with the read bound set to
the row bound (``max_rows_read_per_unit: 5``: no second window).

    python -m bench.unkeyed [--patients 111000] [--reps 3]

The demo's `visits` (one to eight rows per patient, no key on `patient_id`) built with
enough patients for about 257,000 rows, on SQLite and — when $DPGATE_BENCH_POSTGRES_URL
(or $DPGATE_TEST_POSTGRES_URL) names a server — on PostgreSQL. For five queries the
statement dpgate compiles (the real compiler, the catalogue's facts) is run directly on
the database, without the gateway: a plain scan of the table for scale, then the
statement without an index on `patient_id`, then with one (`CREATE INDEX … (patient_id)`).
Each figure is the median of ``reps`` runs, with the machine's load average next to it;
on SQLite also the CPU time of the statement (it runs in this thread), which a loaded
machine does not stretch as it does the wall time. The engine's plan says whether it
still sorts the whole table (SQLite: "USE TEMP B-TREE"; PostgreSQL: "Sort" against
"Incremental Sort"); ``windows`` counts the statement's window functions and
``deadline_ms`` is what the cost model gives it alone (built-in per-row costs, 8 declared
rows per patient, margin 2).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa
import yaml

from bench.common import RESULTS_DIR, log

QUERIES = {
    "count": "SELECT COUNT(*) FROM visits",
    "avg": "SELECT AVG(cost) FROM visits",
    "group by": "SELECT department, COUNT(*) FROM visits GROUP BY department",
    "where + group by": (
        "SELECT department, COUNT(*) FROM visits WHERE year >= 2022 GROUP BY department"
    ),
    "where + avg": "SELECT AVG(cost) FROM visits WHERE year >= 2022",
}
#: The read bound of the variant without a second window: the demo's max_rows_per_unit.
READ_EQUALS_ROWS = 5
SCAN = "SELECT COUNT(*), SUM(cost) FROM {table}"
#: A Sort node of a PostgreSQL plan (not an Incremental Sort, not a "Sort Key:" line).
FULL_SORT = re.compile(r"(^|->\s+)Sort\s+\(")


def _compiled(
    url: str, schema: str | None, root: Path, patients: int, read: int | None = None
) -> dict[str, tuple[str, float | None]]:
    """The statement dpgate compiles for each query on that database, and the deadline
    the cost model gives it alone (``read``: the table's ``max_rows_read_per_unit``)."""
    import budget
    from gateway.core.config_load import parse_config
    from gateway.demo.hospital import config_yaml
    from gateway.pipeline.gateway import Gateway

    raw = yaml.safe_load(config_yaml("unused.db", str(root / "ledger.db")))
    raw["database"]["url"] = url
    visits = raw["tables"]["visits"]
    visits.pop("references", None)
    visits["rows"] = 8 * patients
    if read is not None:
        visits["max_rows_read_per_unit"] = read
    if schema:
        visits["schema"] = schema
    raw["tables"] = {"visits": visits}
    ledger = budget.Ledger.from_url(f"sqlite:///{root / 'measure-ledger.db'}")
    gw = Gateway(parse_config(raw), ledger=ledger)
    table = gw.config.tables["visits"]
    out: dict[str, tuple[str, float | None]] = {}
    try:
        for name, sql in QUERIES.items():
            plan = gw.analyze(sql)
            compiled = gw.compile(plan).sql
            out[name] = (compiled, gw.timing.deadline_ms(plan, table, compiled))
        return out
    finally:
        gw.engine.dispose()
        ledger.engine.dispose()


def _time(run: Any, sql: str, reps: int) -> float:
    return _times(run, sql, reps)[0]


def _times(run: Any, sql: str, reps: int) -> tuple[float, float]:
    """Median wall and CPU (this thread's) milliseconds of ``reps`` runs."""
    run(sql)  # warm-up
    wall, cpu = [], []
    for _ in range(reps):
        t, c = time.perf_counter(), time.thread_time()
        run(sql)
        wall.append((time.perf_counter() - t) * 1000)
        cpu.append((time.thread_time() - c) * 1000)
    return statistics.median(wall), statistics.median(cpu)


def _sqlite(db: Path, root: Path, reps: int, patients: int) -> dict[str, Any]:
    variants = {
        "": _compiled(f"sqlite:///{db}", None, root, patients),
        " (read bound 5)": _compiled(f"sqlite:///{db}", None, root, patients, READ_EQUALS_ROWS),
    }
    con = sqlite3.connect(db)

    def run(sql: str) -> None:
        con.execute(sql).fetchall()

    def sorts(sql: str) -> int:
        return sum("TEMP B-TREE" in r[3] for r in con.execute("EXPLAIN QUERY PLAN " + sql))

    rows = con.execute("SELECT COUNT(*) FROM visits").fetchone()[0]
    scan_ms, scan_cpu_ms = _times(run, SCAN.format(table="visits"), reps)
    out: dict[str, Any] = {"rows": rows, "scan_ms": scan_ms, "scan_cpu_ms": scan_cpu_ms}
    for label, ddl in (("no index", None), ("index", "CREATE INDEX v_unit ON visits(patient_id)")):
        if ddl:
            con.execute(ddl)
            con.commit()
        figures: dict[str, Any] = {}
        for suffix, statements in variants.items():
            for name, (sql, deadline) in statements.items():
                if suffix and "where" not in name:
                    continue  # the read bound changes only the statements with a WHERE
                ms, cpu_ms = _times(run, sql, reps)
                figures[name + suffix] = {
                    "ms": ms,
                    "cpu_ms": cpu_ms,
                    "sorts": sorts(sql),
                    "windows": sql.upper().count(" OVER ("),
                    "deadline_ms": deadline,
                    "load": os.getloadavg()[0],
                }
        out[label] = figures
    con.execute("DROP INDEX v_unit")
    con.commit()
    con.close()
    return out


def _postgres(url: str, db: Path, root: Path, reps: int, patients: int) -> dict[str, Any]:
    schema = f"bench_unkeyed_{os.getpid()}"
    engine = sa.create_engine(url)
    source = sqlite3.connect(db)
    with engine.begin() as conn:
        conn.exec_driver_sql(f"CREATE SCHEMA {schema}")
        conn.exec_driver_sql(
            f"CREATE TABLE {schema}.visits (visit_id integer PRIMARY KEY, patient_id integer "
            "NOT NULL, year integer NOT NULL, department text NOT NULL, length_of_stay "
            "integer NOT NULL, cost double precision NOT NULL)"
        )
        cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        with cursor.copy(f"COPY {schema}.visits FROM STDIN") as copy:
            for row in source.execute("SELECT * FROM visits"):
                copy.write_row(row)
        conn.exec_driver_sql(f"ANALYZE {schema}.visits")
    source.close()
    try:
        statements = {n: sql for n, (sql, _) in _compiled(url, schema, root, patients).items()} | {
            f"{n} (read bound {READ_EQUALS_ROWS})": sql
            for n, (sql, _) in _compiled(url, schema, root, patients, READ_EQUALS_ROWS).items()
            if "where" in n
        }
        with engine.connect() as conn:

            def run(sql: str) -> None:
                conn.exec_driver_sql(sql).fetchall()

            def sorts(sql: str) -> int:
                plan = [r[0] for r in conn.exec_driver_sql("EXPLAIN " + sql)]
                return sum(bool(FULL_SORT.search(line)) for line in plan)

            out: dict[str, Any] = {
                "scan_ms": _time(run, SCAN.format(table=f"{schema}.visits"), reps)
            }
            for label, ddl in (
                ("no index", None),
                ("index", f"CREATE INDEX ON {schema}.visits (patient_id)"),
            ):
                if ddl:
                    conn.exec_driver_sql(ddl)
                    conn.exec_driver_sql(f"ANALYZE {schema}.visits")
                    conn.commit()
                out[label] = {
                    name: {
                        "ms": _time(run, sql, reps),
                        "full_sorts": sorts(sql),
                        "load": os.getloadavg()[0],
                    }
                    for name, sql in statements.items()
                }
        return out
    finally:
        with engine.begin() as conn:
            conn.exec_driver_sql(f"DROP SCHEMA {schema} CASCADE")
        engine.dispose()


def run(patients: int = 111_000, reps: int = 3) -> dict[str, Any]:
    from gateway.demo.hospital import build

    root = Path(tempfile.mkdtemp(prefix="dpgate-unkeyed-"))
    db = root / "hospital.db"
    log(f"unkeyed: building the demo with {patients:,} patients")
    build(db, patients=patients)
    result: dict[str, Any] = {"load_before": os.getloadavg()[0]}
    result["sqlite"] = _sqlite(db, root, reps, patients)
    url = os.environ.get("DPGATE_BENCH_POSTGRES_URL") or os.environ.get("DPGATE_TEST_POSTGRES_URL")
    if url:
        result["postgresql"] = _postgres(url, db, root, reps, patients)
    result["load_after"] = os.getloadavg()[0]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--patients", type=int, default=111_000)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    result = run(args.patients, args.reps)
    print(json.dumps(result, indent=2))
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    (RESULTS_DIR / "unkeyed.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
