"""Accuracy per query shape at ε = 1: dpgate against OpenDP, on PUMS (issue 34's workload).

Seven shapes, each released ``reps`` times (every release a cache miss for dpgate, a fresh
Context for OpenDP): COUNT(*), COUNT GROUP BY a public key (sex), SUM(income),
AVG(age), COUNT GROUP BY a key that is not public (educ: partition selection), MEDIAN(income)
and AVG(income) GROUP BY sex. For each: the mean absolute error of the released cells
against the exact answers (± its standard error), for partition selection also how many
of the 16 groups were released, and the mean time per release in process.

OpenDP runs in its own virtualenv (``bench/.data/venv-opendp``, created on first use with
``pip install opendp==0.16.0 polars==1.36.1 pyarrow``; OpenDP's polars plans need that
exact polars), driven by ``bench/peer/opendp_runner.py``. Tumult Analytics is not run
here: see bench/README.md.

    .venv/bin/python -m bench.accuracy --reps 200
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench import queries as Q
from bench.adapter import InProcess, pums_tables, write_config
from bench.common import DATA_DIR, log

VENV = Path(os.environ.get("DPGATE_BENCH_OPENDP_VENV", DATA_DIR / "venv-opendp"))
SPEC = ("opendp==0.16.0", "polars==1.36.1", "pyarrow")
RUNNER = Path(__file__).resolve().parent / "peer" / "opendp_runner.py"
EPSILON = 1.0
DELTA = 1e-7  # the bench config's δ (bench/adapter.py)

#: name → (dpgate SQL, number of leading group-key columns)
SHAPES: dict[str, tuple[str, int]] = {
    "count": ("SELECT COUNT(*) AS n FROM pums", 0),
    "group_public": ("SELECT sex, COUNT(*) AS n FROM pums GROUP BY sex", 1),
    "sum": ("SELECT SUM(income) AS s FROM pums", 0),
    "avg": ("SELECT AVG(age) AS a FROM pums", 0),
    "group_selection": ("SELECT educ, COUNT(*) AS n FROM pums_open GROUP BY educ", 1),
    "median": ("SELECT MEDIAN(income) AS m FROM pums", 0),
    "avg_group": ("SELECT sex, AVG(income) AS a FROM pums GROUP BY sex", 1),
}


def exact_answers() -> dict[str, dict[tuple[int, ...], float]]:
    """Exact cells per shape (MEDIAN as PERCENTILE_CONT(0.5), dpgate's definition)."""
    rows = Q.load_pums_rows()
    col = {c: i for i, c in enumerate(Q.COLUMNS)}
    income = sorted(r[col["income"]] for r in rows)
    n = len(income)
    mid = (n - 1) / 2
    median = income[math.floor(mid)] + (mid - math.floor(mid)) * (
        income[math.ceil(mid)] - income[math.floor(mid)]
    )

    def grouped(key: str, value: str | None) -> dict[tuple[int, ...], float]:
        acc: dict[tuple[int, ...], list[int]] = {}
        for r in rows:
            acc.setdefault((r[col[key]],), []).append(r[col[value]] if value else 1)
        if value is None:
            return {k: float(len(v)) for k, v in acc.items()}
        return {k: sum(v) / len(v) for k, v in acc.items()}

    return {
        "count": {(): float(n)},
        "group_public": grouped("sex", None),
        "sum": {(): float(sum(income))},
        "avg": {(): sum(r[col["age"]] for r in rows) / n},
        "group_selection": grouped("educ", None),
        "median": {(): float(median)},
        "avg_group": grouped("sex", "income"),
    }


def score(
    answers: list[list[list[float]]], keys: int, exact: dict[tuple[int, ...], float]
) -> dict[str, Any]:
    """MAE (± standard error of the mean over releases) of the released cells, and the
    mean number of groups released."""
    per_release: list[float] = []
    kept: list[int] = []
    for rows in answers:
        errs = []
        for row in rows:
            key = tuple(int(float(v)) for v in row[:keys])
            if key in exact and row[keys] is not None:
                errs.append(abs(float(row[keys]) - exact[key]))
        kept.append(len(errs))
        if errs:
            per_release.append(sum(errs) / len(errs))
    m = len(per_release)
    mae = sum(per_release) / m if m else math.nan
    var = sum((x - mae) ** 2 for x in per_release) / (m - 1) if m > 1 else math.nan
    return {
        "mae": mae,
        "se": math.sqrt(var / m) if m > 1 else math.nan,
        "groups_kept": sum(kept) / len(kept) if kept else math.nan,
        "groups": len(exact),
        "releases": len(answers),
    }


def run_dpgate(reps: int) -> dict[str, Any]:
    work = DATA_DIR / f"accuracy-run-{os.getpid()}"
    db = Q.write_pums_sqlite(work / "pums.sqlite")
    ledger = work / "ledger.db"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{ledger}{suffix}").unlink(missing_ok=True)
    tables = pums_tables()
    open_cols = dict(tables["pums"]["columns"])
    open_cols["educ"] = {"type": "integer"}  # not public: partition selection
    tables["pums_open"] = {"source": "pums", "columns": open_cols}
    cfg = write_config(
        work / "dpgate.yaml",
        database_url=f"sqlite:///{db}",
        ledger_url=f"sqlite:///{ledger}",
        tables=tables,
    )
    gw = InProcess(cfg)
    analyst = gw.new_analyst()
    out: dict[str, Any] = {}
    for name, (sql, _) in SHAPES.items():
        gw.query(analyst, sql, EPSILON)  # warm-up
        answers, latencies = [], []
        for i in range(reps):
            # a distinct, always-true filter: every release is a cache miss
            where = f" WHERE age > -{i + 2}"
            if " GROUP BY" in sql:
                text = sql.replace(" GROUP BY", f"{where} GROUP BY", 1)
            else:
                text = sql + where
            t = time.perf_counter()
            answer = gw.query(analyst, text, EPSILON)
            latencies.append(time.perf_counter() - t)
            if not answer.ok:
                raise RuntimeError(f"dpgate refused {name}: {answer.error}")
            answers.append(answer.rows)
        out[name] = {"answers": answers, "latencies_s": latencies}
    return out


def ensure_venv() -> Path:
    py = VENV / "bin" / "python"
    if py.exists() and (VENV / ".installed").exists():
        return py
    log(f"creating the OpenDP virtualenv in {VENV} (pip install {' '.join(SPEC)})")
    VENV.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    subprocess.run([str(py), "-m", "pip", "install", "--quiet", *SPEC], check=True)
    (VENV / ".installed").touch()
    return py


def run_opendp(reps: int) -> dict[str, Any]:
    py = ensure_venv()
    job = {
        "csv": str(Q.PUMS_CSV),
        "rows": len(Q.load_pums_rows()),
        "epsilon": EPSILON,
        "delta": DELTA,
        "reps": reps,
        "shapes": list(SHAPES),
        "median_candidates": list(range(0, 500_001, 500)),
    }
    done = subprocess.run(
        [str(py), str(RUNNER)], input=json.dumps(job), capture_output=True, text=True, check=True
    )
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def report(reps: int, peers: bool, peer_reps: int | None = None) -> dict[str, Any]:
    exact = exact_answers()
    log(f"dpgate: {len(SHAPES)} shapes x {reps} releases at epsilon={EPSILON}")
    systems = {"dpgate": run_dpgate(reps)}
    if peers:
        log(f"OpenDP: the same, in {VENV}")
        opendp = run_opendp(peer_reps or reps)
        systems[f"OpenDP {opendp['version']}"] = opendp["shapes"]
    table: dict[str, Any] = {}
    for name, (_, keys) in SHAPES.items():
        table[name] = {}
        for system, shapes in systems.items():
            entry = shapes[name]
            if entry.get("error"):
                table[name][system] = {"error": entry["error"]}
                continue
            s = score(entry["answers"], keys, exact[name])
            lat = entry["latencies_s"]
            s["ms_per_release"] = 1000 * sum(lat) / len(lat)
            table[name][system] = s
    return table


def render(table: dict[str, Any]) -> str:
    lines = [
        "| shape | system | MAE ± s.e. | groups kept | ms / release |",
        "|---|---|---|---|---|",
    ]
    for name, systems in table.items():
        for system, s in systems.items():
            if "error" in s:
                lines.append(f"| {name} | {system} | refused: {s['error']} | | |")
                continue
            kept = f"{s['groups_kept']:.1f} of {s['groups']}" if s["groups"] > 1 else ""
            lines.append(
                f"| {name} | {system} | {s['mae']:.4g} ± {s['se']:.2g} | {kept} | "
                f"{s['ms_per_release']:.3g} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=200)
    p.add_argument("--no-peers", action="store_true", help="dpgate only")
    p.add_argument(
        "--peer-reps", type=int, help="releases per shape for the peers (default: --reps)"
    )
    p.add_argument("--json", type=Path, help="also write the figures here")
    a = p.parse_args(argv)
    table = report(a.reps, not a.no_peers, a.peer_reps)
    print(render(table))
    if a.json:
        a.json.write_text(json.dumps(table, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
