"""What the safe join path costs (issue 31): one join query compiled each way dpgate can
compile it, timed on the same data.

    python -m bench.bench_joins [--rows 1000000] [--repeat 5] [--backends sqlite,duckdb,postgres]

`patients` (a unit per row: an INTEGER PRIMARY KEY) references a public `zips` lookup
(1,000 keys) through `zip`. Each variant is the statement `compile_plan` writes with the
given catalogue facts (``JoinKeys``), timed as the median of ``--repeat`` runs after one
warm-up:

- ``trusted``: the key unique and the unit unique (no cut, no per-unit window) — what
  dpgate compiled before issue 31 for a unique key, and still compiles where the shortcut
  is proven (SQLite's rowid key from an INTEGER column; PostgreSQL and DuckDB with the same
  storage type and collation on both sides);
- ``canonical`` (SQLite): keys compared as ``CASE WHEN typeof(k) = 'integer' …`` and the
  lookup cut by that value — every SQLite join whose key is not the rowid;
- ``cut``: the lookup cut by its key as stored, the unit still unique (PostgreSQL and DuckDB
  with the same types on both sides but no unique key);
- ``bounded``: nothing proven — cut, and every unit's rows bounded after the join (other
  storage types or collations; ClickHouse and Spark always).

PostgreSQL runs when ``DPGATE_TEST_POSTGRES_URL`` is set (tables in a schema of their own,
dropped afterwards).
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import sqlalchemy as sa

from gateway.core.config_load import parse_config
from gateway.core.plan import QueryPlan
from gateway.sql.analyze import analyze
from gateway.sql.compile import compile_plan
from gateway.sql.join_keys import JoinKeys

QUERIES = {
    "count by region": "SELECT z.region, COUNT(*) FROM patients p JOIN zips z ON p.zip = z.zip "
    "GROUP BY z.region",
    "avg age, left join": "SELECT AVG(p.age) FROM patients p LEFT JOIN zips z ON p.zip = z.zip "
    "WHERE z.region = 'r3'",
}
REF = ("patients", "zip")
VARIANTS = {
    "trusted": (JoinKeys(unique=frozenset({REF}), consistent=frozenset({REF})), True),
    "canonical": (JoinKeys(), True),
    "cut": (JoinKeys(consistent=frozenset({REF})), True),
    "bounded": (JoinKeys(), False),
}


def _tables(schema: str | None) -> dict[str, object]:
    extra = {"schema": schema} if schema else {}
    return {
        "patients": {
            **extra,
            "privacy_unit": "pid",
            "columns": {
                "pid": {"type": "integer", "nullable": False},
                "zip": {"type": "integer"},
                "age": {"type": "integer", "lower": 0, "upper": 120},
            },
            "references": {"zip": "zips.zip"},
        },
        "zips": {
            **extra,
            "public": True,
            "key": "zip",
            "columns": {"zip": {"type": "integer"}, "region": {"type": "text"}},
        },
    }


def _sqlite(rows: int, root: Path) -> str:
    path = root / "joins.db"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE zips (zip INTEGER PRIMARY KEY, region TEXT)")
    db.execute("CREATE TABLE patients (pid INTEGER PRIMARY KEY, zip INTEGER, age INTEGER)")
    db.executemany("INSERT INTO zips VALUES (?, ?)", [(z, f"r{z % 10}") for z in range(1000)])
    db.executemany(
        "INSERT INTO patients VALUES (?, ?, ?)",
        ((p, (p * 7919) % 1000, p % 100) for p in range(1, rows + 1)),
    )
    db.commit()
    db.close()
    return f"sqlite:///{path}"


def _duckdb(rows: int, root: Path) -> str:
    import duckdb

    path = root / "joins.duckdb"
    db = duckdb.connect(str(path))
    db.execute("CREATE TABLE zips (zip INTEGER PRIMARY KEY, region VARCHAR)")
    db.execute("INSERT INTO zips SELECT range, 'r' || (range % 10) FROM range(1000)")
    db.execute(
        "CREATE TABLE patients AS SELECT range::INTEGER AS pid, "
        "((range * 7919) % 1000)::INTEGER AS zip, (range % 100)::INTEGER AS age "
        f"FROM range(1, {rows + 1})"
    )
    db.execute("ALTER TABLE patients ADD PRIMARY KEY (pid)")
    db.close()
    return f"duckdb:///{path}"


def _postgres(rows: int, url: str, schema: str) -> None:
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
        conn.execute(
            sa.text(f'CREATE TABLE "{schema}".zips (zip integer PRIMARY KEY, region text)')
        )
        conn.execute(
            sa.text(
                f'INSERT INTO "{schema}".zips '
                "SELECT g, 'r' || (g % 10) FROM generate_series(0, 999) g"
            )
        )
        conn.execute(
            sa.text(
                f'CREATE TABLE "{schema}".patients AS SELECT g AS pid, '
                "((g::bigint * 7919) % 1000)::integer AS zip, "
                f"g % 100 AS age FROM generate_series(1, {rows}) g"
            )
        )
        conn.execute(sa.text(f'ALTER TABLE "{schema}".patients ADD PRIMARY KEY (pid)'))
        conn.execute(sa.text(f'ANALYZE "{schema}".patients'))
    engine.dispose()


def _time(url: str, dialect: str, schema: str | None, repeat: int) -> dict[tuple[str, str], float]:
    config = parse_config(
        {
            "database": {"url": url},
            "ledger": {"url": "sqlite:///unused.db"},
            "tables": _tables(schema),
        }
    )
    engine = sa.create_engine(url)
    out: dict[tuple[str, str], float] = {}
    try:
        with engine.connect() as conn:
            for qname, sql in QUERIES.items():
                plan = analyze(sql, config.tables)
                assert isinstance(plan, QueryPlan)
                answers = set()
                for vname, (keys, unit_unique) in VARIANTS.items():
                    if vname == "canonical" and dialect != "sqlite":
                        continue
                    compiled = compile_plan(
                        plan,
                        config.tables["patients"],
                        dialect,
                        unit_unique=unit_unique,
                        join_keys=keys,
                    ).sql
                    first = conn.exec_driver_sql(compiled).fetchall()  # warm-up
                    answers.add(tuple(sorted(map(repr, first))))
                    times = []
                    for _ in range(repeat):
                        start = time.perf_counter()
                        conn.exec_driver_sql(compiled).fetchall()
                        times.append(time.perf_counter() - start)
                    out[(qname, vname)] = statistics.median(times)
                assert len(answers) == 1, f"the variants disagree on {qname}: {answers}"
    finally:
        engine.dispose()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--backends", default="sqlite,duckdb,postgres")
    args = parser.parse_args()
    backends = args.backends.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        results: dict[str, dict[tuple[str, str], float]] = {}
        if "sqlite" in backends:
            results["sqlite"] = _time(_sqlite(args.rows, root), "sqlite", None, args.repeat)
        if "duckdb" in backends:
            results["duckdb"] = _time(_duckdb(args.rows, root), "duckdb", None, args.repeat)
        pg = os.environ.get("DPGATE_TEST_POSTGRES_URL")
        if "postgres" in backends and pg:
            schema = f"bench_joins_{uuid.uuid4().hex[:8]}"
            try:
                _postgres(args.rows, pg, schema)
                results["postgres"] = _time(pg, "postgres", schema, args.repeat)
            finally:
                engine = sa.create_engine(pg)
                with engine.begin() as conn:
                    conn.execute(sa.text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
                engine.dispose()
    print(f"rows: {args.rows:,}, median of {args.repeat} (ms)")
    print(f"{'backend':9} {'query':20} " + " ".join(f"{v:>10}" for v in VARIANTS))
    for backend, timings in results.items():
        for qname in QUERIES:
            cells = [
                f"{timings[(qname, v)] * 1000:10.1f}" if (qname, v) in timings else f"{'-':>10}"
                for v in VARIANTS
            ]
            print(f"{backend:9} {qname:20} " + " ".join(cells))


if __name__ == "__main__":
    main()
