"""What a join costs now against what dpgate compiled for it at an earlier commit (issue
31: "keep the 10M-row figures within 10% of today's where the shortcut stays sound").

    git archive 8a0d9e7 | tar -x -C /tmp/before      # the tree before issue 31
    python -m bench.joins_before_after --before /tmp/before --backend duckdb --rows 10000000

The data and queries are ``bench_joins``' (a unit per row, a 1,000-key public lookup, both
keys ``integer``: a schema whose shortcut stays sound). Each tree's ``Gateway`` is started
over the same database in a process of its own and compiles each query as it would answer
it; both statements are then timed on one connection, interleaved run by run (so the
machine's load hits both alike), median of ``--repeat`` after one warm-up, and their
answers compared. Whether the two statements are the same text (up to the order of the
ON's operands) is printed too: the same statement costs the same, whatever the timings say.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import sqlalchemy as sa

from bench import bench_joins

QUERIES = bench_joins.QUERIES
#: Run in each tree's own process: print the statement its gateway compiles per query.
COMPILER = """
import json, os, sys, tempfile
url, schema, tables, queries = sys.argv[1], sys.argv[2] or None, *map(json.loads, sys.argv[3:5])
from gateway.core.config import parse_config
from gateway.pipeline.gateway import Gateway
ledger = os.path.join(tempfile.mkdtemp(), "ledger.db")
gw = Gateway(parse_config({"database": {"url": url}, "ledger": {"url": "sqlite:///" + ledger},
                           "tables": tables}))
out = {}
for name, sql in queries.items():
    plan = gw.planner.analyze(sql)
    if hasattr(gw, "compile"):
        out[name] = gw.compile(plan).sql
    else:  # before issue 31: the gateway compiled inside its pipeline only
        from gateway.sql.compile import compile_plan
        out[name] = compile_plan(plan, gw.config.tables[plan.table], gw.dialect,
                                 unit_unique=plan.table in gw.unique_units,
                                 unique_keys=gw.unique_keys).sql
gw.engine.dispose()
print(json.dumps(out))
"""


def compiled(tree: Path, url: str, schema: str | None) -> dict[str, str]:
    """The statement ``tree``'s gateway compiles for each of ``bench_joins.QUERIES``."""
    args = [url, schema or "", json.dumps(bench_joins._tables(schema)), json.dumps(QUERIES)]
    env = {**os.environ, "PYTHONPATH": str(tree), "DPGATE_ADMIN_KEY": "admin-" + "k" * 40}
    done = subprocess.run(
        [sys.executable, "-c", COMPILER, *args], capture_output=True, text=True, cwd=tree, env=env
    )
    if done.returncode != 0:
        raise SystemExit(f"{tree}: {done.stderr[-3000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _same(a: str, b: str) -> bool:
    flipped = a.replace('"t1"."zip" = "t0"."zip"', '"t0"."zip" = "t1"."zip"')
    return a == b or flipped == b


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", type=Path, required=True, help="the earlier source tree")
    parser.add_argument("--backend", choices=("sqlite", "duckdb", "postgres"), required=True)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    trees = {"before": args.before.resolve(), "now": Path(__file__).resolve().parent.parent}
    root = Path(tempfile.mkdtemp())
    schema = None
    started = time.perf_counter()
    if args.backend == "sqlite":
        url = bench_joins._sqlite(args.rows, root)
    elif args.backend == "duckdb":
        url = bench_joins._duckdb(args.rows, root)
    else:
        url = os.environ["DPGATE_TEST_POSTGRES_URL"]
        schema = f"bench_joins_{uuid.uuid4().hex[:8]}"
        bench_joins._postgres(args.rows, url, schema)
    print(f"{args.backend}, {args.rows:,} rows, built in {time.perf_counter() - started:.0f} s")
    try:
        sqls = {label: compiled(tree, url, schema) for label, tree in trees.items()}
        engine = sa.create_engine(url)
        with engine.connect() as conn:
            for q in QUERIES:
                answers = {
                    tuple(sorted(map(repr, conn.exec_driver_sql(sqls[t][q]).fetchall())))
                    for t in trees
                }
                times: dict[str, list[float]] = {t: [] for t in trees}
                for _ in range(args.repeat):
                    for t in trees:
                        start = time.perf_counter()
                        conn.exec_driver_sql(sqls[t][q]).fetchall()
                        times[t].append(time.perf_counter() - start)
                ms = {t: statistics.median(v) * 1000 for t, v in times.items()}
                print(
                    f"{q:20} same statement: {_same(sqls['before'][q], sqls['now'][q])}, "
                    f"same answer: {len(answers) == 1}; before {ms['before']:.0f} ms, "
                    f"now {ms['now']:.0f} ms (now/before {ms['now'] / ms['before']:.2f})"
                )
        engine.dispose()
    finally:
        shutil.rmtree(root, ignore_errors=True)
        if schema:
            engine = sa.create_engine(url)
            with engine.begin() as conn:
                conn.execute(sa.text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
            engine.dispose()


if __name__ == "__main__":
    main()
