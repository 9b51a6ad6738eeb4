"""Synthetic PUMS-shaped tables of N rows in SQLite, DuckDB, PostgreSQL and ClickHouse.

Rows are a deterministic function of the row number x (multiplicative hashing, integer
arithmetic only), so the three backends hold identical data and the exact answers agree.
Generation happens inside each database (recursive CTE / ``range`` / ``generate_series``),
never row by row from Python, and the result is cached:

- SQLite: ``bench/.data/scale_v3_<N>.sqlite``
- DuckDB: ``bench/.data/scale_v3_<N>.duckdb``
- PostgreSQL: table ``dpgate_bench_v3_<N>`` in the database of ``DPGATE_BENCH_PG_URL``
  (default ``postgresql+psycopg://postgres@127.0.0.1:5432/test``)
- ClickHouse (chDB, embedded): table ``dpgate_bench_v1_<N>`` in the data directory
  ``bench/.data/scale_v1_chdb`` (MergeTree), built in a process of its own (one process
  holds one chDB data directory, and the timing worker opens it after)

A database is rebuilt only when its row count is not N.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass

import sqlalchemy as sa

from bench.common import DATA_DIR, last_line, log

VERSION = "v3"
PG_URL = os.environ.get("DPGATE_BENCH_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
BACKENDS = ("sqlite", "duckdb", "postgresql", "clickhouse")
#: Set in the process that builds the ClickHouse table (see ``ensure``).
_CHDB_BUILDER = "DPGATE_BENCH_CHDB_BUILDER"

# Column expressions over the row number x (a 64-bit integer ≥ 1); all products stay
# below 2^63 for x ≤ 10^9. Domains: age 0–100, sex 0/1, educ 1–16, race 1–6,
# income 0–500000, married 0/1 — the PUMS columns and bounds.
EXPRS = {
    "pid": "x",
    "age": "(x * 7919) % 101",
    "sex": "((x * 2654435761) % 1000003) % 2",
    "educ": "1 + ((x * 40503) % 65537) % 16",
    "race": "1 + ((x * 69069) % 1000033) % 6",
    "income": "((x * 1103515245 + 12345) % 2147483648) % 500001",
    "married": "((x * 22695477 + 1) % 4294967291) % 2",
}
SELECT_LIST = ", ".join(f"{e} AS {c}" for c, e in EXPRS.items())
# The declared value lists as CHECK constraints, as a production table would hold its
# domain: dpgate then reads them from the catalogue and filters nothing on those columns
# (gateway/sql/constraints.py). The bounded columns' ranges likewise: on PostgreSQL and
# DuckDB (integral storage) a SUM then reads them unclamped. v2 had the value lists
# only, v1 no constraints.
CHECKS = {
    "age": " CHECK (age BETWEEN 0 AND 100)",
    "income": " CHECK (income BETWEEN 0 AND 500000)",
    "sex": " CHECK (sex IN (0, 1))",
    "educ": f" CHECK (educ IN ({', '.join(str(i) for i in range(1, 17))}))",
    "race": " CHECK (race IN (1, 2, 3, 4, 5, 6))",
    "married": " CHECK (married IN (0, 1))",
}


@dataclass(frozen=True)
class ScaleTable:
    backend: str
    rows: int
    url: str  # SQLAlchemy URL the raw timings and dpgate both use
    table: str


def table_name(rows: int) -> str:
    return f"dpgate_bench_{VERSION}_{rows}"


def target(backend: str, rows: int) -> ScaleTable:
    name = table_name(rows)
    if backend == "sqlite":
        path = DATA_DIR / f"scale_{VERSION}_{rows}.sqlite"
        return ScaleTable(backend, rows, f"sqlite:///{path}", name)
    if backend == "duckdb":
        path = DATA_DIR / f"scale_{VERSION}_{rows}.duckdb"
        return ScaleTable(backend, rows, f"duckdb:///{path}", name)
    if backend == "postgresql":
        return ScaleTable(backend, rows, PG_URL, name)
    if backend == "clickhouse":
        return ScaleTable(backend, rows, f"chdb:///{DATA_DIR / f'scale_{VERSION}_chdb'}", name)
    raise ValueError(f"unknown backend {backend!r}")


def postgres_reachable() -> bool:
    try:
        engine = sa.create_engine(PG_URL, connect_args={"connect_timeout": 3})
        with engine.connect() as c:
            c.execute(sa.text("SELECT 1"))
        engine.dispose()
        return True
    except Exception:
        return False


def _count(engine: sa.Engine, table: str) -> int | None:
    try:
        with engine.connect() as c:
            return int(c.execute(sa.text(f"SELECT COUNT(*) FROM {table}")).scalar_one())
    except Exception:
        return None


#: Bytes a generated row takes in each backend's files under DATA_DIR (measured at 10M
#: rows: SQLite 228 MB, DuckDB 46 MB, chDB 254 MB for its 1M and 10M tables together);
#: PostgreSQL's rows live in the server's own data directory.
BYTES_PER_ROW = {"sqlite": 24, "duckdb": 5, "clickhouse": 24}
#: Free space kept beyond a table's estimate (journals, temporary sorts, the JSON).
DISK_MARGIN = 256 * 2**20


class NoRoom(RuntimeError):
    """Not enough free disk under DATA_DIR to generate a table: said before writing."""


def check_room(backend: str, rows: int) -> None:
    """Raise ``NoRoom`` when DATA_DIR's file system cannot hold ``rows`` more rows of
    ``backend`` (with ``DISK_MARGIN`` to spare): a run on a small disk then reports
    which table did not fit, instead of failing half-way through writing it."""
    need = BYTES_PER_ROW.get(backend, 0) * rows
    if not need:
        return
    free = shutil.disk_usage(DATA_DIR).free
    if free < need + DISK_MARGIN:
        raise NoRoom(
            f"{backend} {rows:,} rows need about {(need + DISK_MARGIN) / 2**20:,.0f} MB free "
            f"under {DATA_DIR} (DPGATE_BENCH_DATA); {free / 2**20:,.0f} MB are"
        )


def ensure(backend: str, rows: int) -> ScaleTable:
    """Build the table if it is missing or has the wrong size (when the disk can hold
    it: ``check_room``); return where it is."""
    t = target(backend, rows)
    DATA_DIR.mkdir(parents=True, exist_ok=True)
    if backend == "clickhouse":
        return _ensure_clickhouse(t)
    engine = sa.create_engine(t.url)
    try:
        if _count(engine, t.table) == rows:
            return t
        check_room(backend, rows)
        log(f"generating {rows:,} rows in {backend} ({t.table}) …")
        started = time.perf_counter()
        cols = ", ".join(f"{c} BIGINT NOT NULL{CHECKS.get(c, '')}" for c in EXPRS)
        with engine.begin() as c:
            c.execute(sa.text(f"DROP TABLE IF EXISTS {t.table}"))
            c.execute(sa.text(f"CREATE TABLE {t.table} ({cols})"))
            if backend == "sqlite":
                c.execute(
                    sa.text(
                        f"INSERT INTO {t.table} "
                        f"WITH RECURSIVE s(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM s "
                        f"WHERE x < {rows}) SELECT {SELECT_LIST} FROM s"
                    )
                )
            elif backend == "duckdb":
                c.execute(
                    sa.text(
                        f"INSERT INTO {t.table} SELECT {SELECT_LIST} "
                        f"FROM (SELECT range AS x FROM range(1, {rows + 1}))"
                    )
                )
            else:
                c.execute(
                    sa.text(
                        f"INSERT INTO {t.table} SELECT {SELECT_LIST} "
                        f"FROM generate_series(1::bigint, {rows}::bigint) AS g(x)"
                    )
                )
        if backend == "postgresql":
            # Set hint bits and statistics now, so that the first timed scan does not.
            with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
                c.execute(sa.text(f"VACUUM ANALYZE {t.table}"))
        elif backend == "sqlite":
            with engine.begin() as c:
                c.execute(sa.text(f"ANALYZE {t.table}"))
        log(f"  {backend} {rows:,} rows in {time.perf_counter() - started:.1f}s")
        return t
    finally:
        engine.dispose()


def _ensure_clickhouse(t: ScaleTable) -> ScaleTable:
    if os.environ.get(_CHDB_BUILDER) != "1":
        proc = subprocess.run(
            [sys.executable, "-m", "bench.datagen", "clickhouse", str(t.rows)],
            stderr=subprocess.PIPE,
            text=True,
            check=False,
            env={**os.environ, _CHDB_BUILDER: "1"},
        )
        sys.stderr.write(proc.stderr)  # its log lines, after it ends
        if proc.returncode != 0:  # its last line: the exception (a NoRoom, say)
            raise RuntimeError(last_line(proc.stderr))
        return t
    from gateway.sql.engines import chdb_dbapi

    conn = chdb_dbapi.connect(t.url.removeprefix("chdb:///"), readonly=False)
    cursor = conn.cursor()
    try:
        cursor.execute(f"SELECT count() FROM system.tables WHERE name = '{t.table}'")
        if cursor.fetchall()[0][0]:
            cursor.execute(f"SELECT count() FROM {t.table}")
            if cursor.fetchall()[0][0] == t.rows:
                return t
        check_room("clickhouse", t.rows)
        log(f"generating {t.rows:,} rows in clickhouse ({t.table}) …")
        started = time.perf_counter()
        cols = ", ".join(f"{c} Int64" for c in EXPRS)
        cursor.execute(f"DROP TABLE IF EXISTS {t.table}")
        cursor.execute(f"CREATE TABLE {t.table} ({cols}) ENGINE = MergeTree ORDER BY tuple()")
        cursor.execute(
            f"INSERT INTO {t.table} SELECT {SELECT_LIST} "
            f"FROM (SELECT toInt64(number) + 1 AS x FROM numbers({t.rows}))"
        )
        cursor.execute(f"OPTIMIZE TABLE {t.table} FINAL")
        log(f"  clickhouse {t.rows:,} rows in {time.perf_counter() - started:.1f}s")
        return t
    finally:
        conn.close()


if __name__ == "__main__":
    import sys

    sizes = [int(s) for s in sys.argv[2:]] or [100_000]
    backends = BACKENDS if sys.argv[1:2] in ([], ["all"]) else tuple(sys.argv[1].split(","))
    for n in sizes:
        for b in backends:
            if b == "postgresql" and not postgres_reachable():
                log("PostgreSQL not reachable: skipped")
                continue
            ensure(b, n)
