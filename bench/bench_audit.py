"""Auditor benchmark: time per audited query and memory as answered queries grow.

    python -m bench.bench_audit                  # both workloads, 1,000 answered queries
    python -m bench.bench_audit --queries 300    # quicker

Workloads (random, seeded; no database — the auditor never touches one):

- ``ranges``: ``COUNT(*) WHERE a BETWEEN … AND b BETWEEN …`` (random 2-D ranges over two
  bounded integer columns, 0..100 × 0..30);
- ``groupby``: ``g, COUNT(*) WHERE a BETWEEN … GROUP BY g`` with 100 declared groups
  (100 released cells per query).

Every query is pre-audited, post-audited with a noisy answer and remembered whatever the
decision (as in ``audit.mode: flag``), so knowledge grows by one query each step. After
the last one, ``--probe`` more queries are timed without being remembered: that median is
the figure to compare with the 20 ms target.
"""

from __future__ import annotations

import os

# one BLAS thread: the auditor's matrices are small; threads only contend with the server
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse
import json
import random
import resource
import statistics
import sys
import time
from typing import Any

import numpy as np
import sqlglot

from gateway.audit import AnsweredCell, AnsweredQuery, Auditor, CountNoise
from gateway.audit.components import TableKnowledge
from gateway.core.config import ColumnConfig, TableConfig
from gateway.core.plan import GroupKey, QueryPlan

GROUPS = tuple(f"g{i:03d}" for i in range(100))
NOISE = CountNoise("laplace", 1.5)  # the released counts' public noise (≈ the gauss(0, 2) used)
TABLE = TableConfig(
    name="t",
    columns={
        "a": ColumnConfig("a", "integer", lower=0, upper=100, nullable=False),
        "b": ColumnConfig("b", "integer", lower=0, upper=30, nullable=False),
        "g": ColumnConfig("g", "text", values=GROUPS, nullable=False),
    },
)


def _plan(where: str, group: bool) -> QueryPlan:
    keys = (GroupKey(sqlglot.exp.column("g"), "g", "text", GROUPS),) if group else ()
    return QueryPlan(
        table="t",
        measures=(),
        outputs=(),
        where=sqlglot.parse_one(where),
        group_keys=keys,
        having=None,
        order_by=(),
        limit=None,
        offset=0,
        canonical_sql=where,
    )


def _range(rng: random.Random, hi: int) -> tuple[int, int]:
    x, y = sorted((rng.randint(0, hi), rng.randint(0, hi)))
    return x, y


def make_query(rng: random.Random, workload: str, n: int) -> AnsweredQuery:
    if workload == "ranges":
        (a0, a1), (b0, b1) = _range(rng, 100), _range(rng, 30)
        where = f"a BETWEEN {a0} AND {a1} AND b BETWEEN {b0} AND {b1}"
        size = 20 * (a1 - a0 + 1) * (b1 - b0 + 1)
        return AnsweredQuery(
            f"q{n}", _plan(where, False), (AnsweredCell((), size + rng.gauss(0, 2), {}, NOISE),)
        )
    a0, a1 = _range(rng, 100)
    where = f"a BETWEEN {a0} AND {a1}"
    cells = tuple(
        AnsweredCell((g,), 5 * (a1 - a0 + 1) + rng.gauss(0, 2), {}, NOISE) for g in GROUPS
    )
    return AnsweredQuery(f"q{n}", _plan(where, True), cells)


def knowledge_bytes(tk: TableKnowledge) -> int:
    total = 0
    for kn in tk.parts:
        total += kn.space.atom_of.nbytes + kn.block_of.nbytes
        for b in kn.blocks:
            total += b.basis.nbytes + b.origin.nbytes + b.asked.nbytes + b.cols.nbytes
    return total


def run(workload: str, queries: int, probe: int, seed: int = 7) -> dict[str, Any]:
    rng = random.Random(seed)
    auditor = Auditor({"t": TABLE}, min_group_size=5)
    times: list[float] = []
    refused = 0
    checkpoints: dict[int, dict[str, Any]] = {}
    for n in range(1, queries + 1):
        answer = make_query(rng, workload, n)
        t0 = time.perf_counter()
        pre = auditor.pre_audit("s", answer.plan)
        post = auditor.post_audit("s", answer)
        auditor.remember("s", answer)
        times.append(time.perf_counter() - t0)
        refused += (not pre.allowed) or (not post.allowed)
        if n in (100, 250, 500, 1000, 2000) or n == queries:
            tk = auditor.knowledge("s", "t")
            window = times[-50:]
            checkpoints[n] = {
                "median_ms_last50": statistics.median(window) * 1e3,
                "components": len(tk.parts),
                "atoms": sum(kn.space.n_atoms for kn in tk.parts),
                "cells": sum(kn.space.n_cells for kn in tk.parts),
                "blocks": sum(len(kn.blocks) for kn in tk.parts),
                "rank": sum(b.rank for kn in tk.parts for b in kn.blocks),
                "knowledge_mb": knowledge_bytes(tk) / 2**20,
                "refused_so_far": refused,
            }
            print(f"[bench_audit] {workload} n={n} {checkpoints[n]}", file=sys.stderr, flush=True)
    probe_times: list[float] = []
    probe_cpu: list[float] = []  # CPU time: what a loaded machine's wall time hides
    for n in range(probe):
        answer = make_query(rng, workload, queries + 1 + n)
        t0, c0 = time.perf_counter(), time.process_time()
        auditor.pre_audit("s", answer.plan)
        auditor.post_audit("s", answer)
        probe_times.append(time.perf_counter() - t0)
        probe_cpu.append(time.process_time() - c0)
    return {
        "workload": workload,
        "answered": queries,
        "probe_median_ms": statistics.median(probe_times) * 1e3 if probe_times else None,
        "probe_p90_ms": float(np.percentile(probe_times, 90)) * 1e3 if probe_times else None,
        "probe_cpu_median_ms": statistics.median(probe_cpu) * 1e3 if probe_cpu else None,
        "load1": os.getloadavg()[0],
        "checkpoints": checkpoints,
        "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--probe", type=int, default=50)
    ap.add_argument("--workloads", default="ranges,groupby")
    args = ap.parse_args(argv)
    results = [run(w, args.queries, args.probe) for w in args.workloads.split(",")]
    print(
        "| workload | answered | audit median (ms) | p90 (ms) | CPU median (ms) | load | atoms "
        "| rank | knowledge (MB) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        last = r["checkpoints"][r["answered"]]
        print(
            f"| {r['workload']} | {r['answered']} | {r['probe_median_ms']:.1f} | "
            f"{r['probe_p90_ms']:.1f} | {r['probe_cpu_median_ms']:.1f} | {r['load1']:.1f} | "
            f"{last['atoms']} | {last['rank']} | "
            f"{last['knowledge_mb']:.1f} |"
        )
    print(json.dumps(results, indent=1, default=str), file=sys.stderr)


if __name__ == "__main__":
    main()
