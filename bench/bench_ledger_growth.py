"""Charge latency as the ledger grows, with and without a global budget.

    python -m bench.bench_ledger_growth                    # 0, 100,000 and 1,000,000 rows
    python -m bench.bench_ledger_growth --rows 0,50000

A SQLite file ledger (``synchronous=full``) with one analyst; for each size, charge rows
are appended straight to ``dpgate_ledger`` (as months of charges by that analyst would
leave them), then the median of ``--reps`` ``Ledger.reserve`` calls is taken, once on a
ledger without a global budget and once on the same file with one. An analyst's sum
starts from their latest checkpoint, and the global budget's from its latest global
checkpoint (schema v7; ``budget/ledger.py``, ``_spent_global``), so neither should grow
with the ledger: the first charge after the rows are appended sums them once and writes
a checkpoint, the timed ones after it do not. Before v7 the global sum read every row,
under the write lock, at each charge.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import sqlalchemy as sa

from budget import Ledger, schema
from mechanisms.types import PrivacyCost

COST = PrivacyCost(0.01, 0.0, 0.00005, 0.0)


def _append(url: str, total: int) -> None:
    """Charge rows of analyst 1 until the ledger holds ``total`` rows."""
    engine = sa.create_engine(url)
    now = schema.utcnow()
    with engine.begin() as conn:
        have = int(conn.execute(sa.select(sa.func.count()).select_from(schema.ledger)).scalar_one())
        rows = [
            {
                "reservation_id": f"bench{i}",
                "settles": None,
                "analyst_id": 1,
                "kind": "charge",
                "epsilon": COST.epsilon,
                "delta": COST.delta,
                "rho": COST.rho,
                "selection_delta": COST.selection_delta,
                "mechanism": "laplace",
                "query_key": "bench",
                "sql": "SELECT COUNT(*) FROM t",
                "data_version": "v",
                "release": None,
                "reason": None,
                "created_at": now,
                "charged_at": now,
            }
            for i in range(have, total)
        ]
        if rows:
            conn.execute(sa.insert(schema.ledger), rows)
    engine.dispose()


def _reserve_ms(url: str, reps: int, global_budget: tuple[float, float] | None) -> float:
    ledger = Ledger.from_url(url, global_budget=global_budget)
    try:
        times = []
        for i in range(reps):
            t = time.perf_counter()
            ledger.reserve(
                "a",
                COST,
                query_key=f"growth{i}",
                sql="SELECT COUNT(*) FROM t",
                mechanism="laplace",
                data_version="v",
            )
            times.append(time.perf_counter() - t)
        return statistics.median(times) * 1e3
    finally:
        ledger.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.bench_ledger_growth", description=__doc__)
    p.add_argument("--rows", default="0,100000,1000000", help="ledger sizes, comma list")
    p.add_argument("--reps", type=int, default=30, help="reserves timed per size and setting")
    args = p.parse_args(argv)
    sizes = sorted(int(x) for x in args.rows.split(","))
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'ledger.db'}"
        ledger = Ledger.from_url(url)
        ledger.migrate()
        ledger.create_analyst("a", 1e9, 0.5)
        ledger.close()
        print("| ledger rows | reserve, no global budget | reserve, global budget |")
        print("|---|---|---|")
        for size in sizes:
            _append(url, size)
            alone = _reserve_ms(url, args.reps, None)
            shared = _reserve_ms(url, args.reps, (1e9, 0.5))
            print(f"| {size:,} | {alone:.3g} ms | {shared:.3g} ms |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
