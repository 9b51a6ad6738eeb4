"""Accuracy per query shape at ε = 1: dpgate against OpenDP and Tumult Analytics, on PUMS
and on a synthetic table of a million rows (issue 34's workload).

Seven shapes, each released ``reps`` times (every release a cache miss for dpgate): COUNT(*),
COUNT GROUP BY a public key (sex), SUM(income), AVG(age), COUNT GROUP BY a key that is not
public (educ: partition selection), MEDIAN(income) and AVG(income) GROUP BY sex. For each:
the mean absolute error of the released cells against the exact answers (± its standard
error over releases), for partition selection also how many of the 16 groups were
released, and the mean wall and CPU time per release in process.

Each system runs in a process of its own and writes JSON lines (one per shape, as soon as
it is done) to ``bench/results/accuracy-<data>-<system>.jsonl``; ``--systems`` picks which
to run (so the slow peers can run in the background, one at a time), and the table is
rendered from whatever those files hold. The peers run in their own virtualenvs under
``bench/.data/`` (created on first use with pip; see ``PEERS``), driven by
``bench/peer/opendp_runner.py`` and ``bench/peer/tumult_runner.py``.

    .venv/bin/python -m bench.accuracy --data pums --systems dpgate,opendp --reps 200
    .venv/bin/python -m bench.accuracy --data synthetic --systems tumult --reps 200
    .venv/bin/python -m bench.accuracy --data pums --systems none   # the table only
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import queries as Q
from bench.adapter import InProcess, pums_tables, write_config
from bench.common import DATA_DIR, RESULTS_DIR, log
from bench.datagen import EXPRS, SELECT_LIST

EPSILON = 1.0
DELTA = 1e-7  # the bench config's δ (bench/adapter.py)
BOUNDS = {"income": Q.BOUNDS["income"], "age": Q.BOUNDS["age"]}
PEER_DIR = Path(__file__).resolve().parent / "peer"
#: The peers' timed whole releases per shape (the rest reuse the shape's calibrated
#: mechanism where the peer allows it: bench/peer/*_runner.py).
FRESH = 5


@dataclass(frozen=True)
class Peer:
    venv: Path
    spec: tuple[str, ...]
    runner: Path


#: The peers' virtualenvs (override a location with DPGATE_BENCH_<NAME>_VENV).
PEERS = {
    "opendp": Peer(
        Path(os.environ.get("DPGATE_BENCH_OPENDP_VENV", DATA_DIR / "venv-opendp")),
        ("opendp==0.16.0", "polars==1.36.1", "pyarrow"),
        PEER_DIR / "opendp_runner.py",
    ),
    "tumult": Peer(
        Path(os.environ.get("DPGATE_BENCH_TUMULT_VENV", DATA_DIR / "venv-tumult")),
        ("tmlt.analytics==0.21.0",),
        PEER_DIR / "tumult_runner.py",
    ),
}

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


@dataclass(frozen=True)
class Dataset:
    name: str
    csv: Path  # what the peers read (columns age, sex, educ, race, income, married)
    url: str  # what dpgate reads
    table: str
    rows: int


def dataset(name: str, rows: int) -> Dataset:
    """PUMS (1,000 rows, an SQLite copy for dpgate) or the synthetic table of
    ``bench/datagen.py``'s columns (uniform over the PUMS domains and bounds; a DuckDB
    file for dpgate, built once, and a CSV of it for the peers)."""
    if name == "pums":
        db = DATA_DIR / "accuracy-pums.sqlite"
        if not db.exists():
            Q.write_pums_sqlite(db)
        return Dataset(name, Q.PUMS_CSV, f"sqlite:///{db}", "pums", len(Q.load_pums_rows()))
    import duckdb

    db = DATA_DIR / f"accuracy-synthetic-{rows}.duckdb"
    csv = DATA_DIR / f"accuracy-synthetic-{rows}.csv"
    if not db.exists():
        log(f"building the synthetic table of {rows:,} rows in {db}")
        con = duckdb.connect(str(db))
        # NOT NULL, as PUMS's columns: no NULL group for dpgate to release
        cols_sql = ", ".join(f"{c} BIGINT NOT NULL" for c in EXPRS)
        con.execute(f"CREATE TABLE synth ({cols_sql})")
        con.execute(
            f"INSERT INTO synth SELECT {SELECT_LIST} FROM "
            f"(SELECT range AS x FROM range(1, {rows + 1}))"
        )
        con.close()
    if not csv.exists():
        con = duckdb.connect(str(db), read_only=True)
        cols = ", ".join(Q.COLUMNS)
        con.execute(f"COPY (SELECT {cols} FROM synth ORDER BY pid) TO '{csv}' (HEADER)")
        con.close()
    return Dataset(name, csv, f"duckdb:///{db}", "synth", rows)


def exact_answers(data: Dataset) -> dict[str, dict[tuple[int, ...], float]]:
    """Exact cells per shape (MEDIAN as PERCENTILE_CONT(0.5), dpgate's definition)."""
    import duckdb

    con = duckdb.connect()
    rel = f"read_csv('{data.csv}', header = true)"

    def cells(sql: str, keys: int) -> dict[tuple[int, ...], float]:
        return {
            tuple(int(v) for v in r[:keys]): float(r[keys])
            for r in con.execute(sql.format(t=rel)).fetchall()
        }

    out = {
        "count": cells("SELECT COUNT(*) FROM {t}", 0),
        "group_public": cells("SELECT sex, COUNT(*) FROM {t} GROUP BY sex", 1),
        "sum": cells("SELECT SUM(income) FROM {t}", 0),
        "avg": cells("SELECT AVG(age) FROM {t}", 0),
        "group_selection": cells("SELECT educ, COUNT(*) FROM {t} GROUP BY educ", 1),
        "median": cells("SELECT quantile_cont(income, 0.5) FROM {t}", 0),
        "avg_group": cells("SELECT sex, AVG(income) FROM {t} GROUP BY sex", 1),
    }
    con.close()
    return out


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
            if any(v is None for v in row[:keys]):
                continue  # a NULL group has no exact cell here
            key = tuple(int(float(v)) for v in row[:keys])
            if key in exact and row[keys] is not None:
                errs.append(abs(float(row[keys]) - exact[key]))
        kept.append(len(errs))
        if errs:
            per_release.append(sum(errs) / len(errs))
    m = len(per_release)
    mae = sum(per_release) / m if m else math.nan
    var = sum((x - mae) ** 2 for x in per_release) / (m - 1) if m > 1 else math.nan
    k = len(kept)
    kept_mean = sum(kept) / k if k else math.nan
    kept_var = sum((x - kept_mean) ** 2 for x in kept) / (k - 1) if k > 1 else math.nan
    return {
        "mae": mae,
        "se": math.sqrt(var / m) if m > 1 else math.nan,
        "groups_kept": kept_mean,
        "groups_kept_se": math.sqrt(kept_var / k) if k > 1 else math.nan,
        "groups": len(exact),
        "releases": len(answers),
    }


def results_file(data: Dataset, system: str) -> Path:
    return RESULTS_DIR / f"accuracy-{data.name}-{system}.jsonl"


def run_dpgate(data: Dataset, reps: int, shapes: list[str], out: Path) -> None:
    work = DATA_DIR / f"accuracy-run-{os.getpid()}"
    ledger = work / "ledger.db"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{ledger}{suffix}").unlink(missing_ok=True)
    tables = pums_tables()
    tables["pums"]["source"] = data.table
    open_cols = dict(tables["pums"]["columns"])
    open_cols["educ"] = {"type": "integer"}  # not public: partition selection
    tables["pums_open"] = {"source": data.table, "columns": open_cols}
    cfg = write_config(
        work / "dpgate.yaml", database_url=data.url, ledger_url=f"sqlite:///{ledger}", tables=tables
    )
    gw = InProcess(cfg)
    analyst = gw.new_analyst()
    with out.open("a") as f:
        f.write(json.dumps({"version": "dpgate"}) + "\n")
        for name in shapes:
            sql = SHAPES[name][0]
            gw.query(analyst, sql, EPSILON)  # warm-up
            answers, wall, cpu = [], [], []
            for i in range(reps):
                # a distinct, always-true filter: every release is a cache miss
                where = f" WHERE age > -{i + 2}"
                if " GROUP BY" in sql:
                    text = sql.replace(" GROUP BY", f"{where} GROUP BY", 1)
                else:
                    text = sql + where
                t, c = time.perf_counter(), time.process_time()
                answer = gw.query(analyst, text, EPSILON)
                wall.append(time.perf_counter() - t)
                cpu.append(time.process_time() - c)
                if not answer.ok:
                    raise RuntimeError(f"dpgate refused {name}: {answer.error}")
                answers.append(answer.rows)
            line = {"shape": name, "answers": answers, "wall_s": wall, "cpu_s": cpu}
            f.write(json.dumps({**line, "error": None}) + "\n")
            f.flush()
            log(f"dpgate {data.name} {name}: {reps} releases")
    gw.close()


def ensure_venv(peer: Peer) -> Path:
    py = peer.venv / "bin" / "python"
    if py.exists() and (peer.venv / ".installed").exists():
        return py
    log(f"creating the virtualenv {peer.venv} (pip install {' '.join(peer.spec)})")
    peer.venv.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(peer.venv)], check=True)
    subprocess.run([str(py), "-m", "pip", "install", "--quiet", *peer.spec], check=True)
    (peer.venv / ".installed").touch()
    return py


def run_peer(system: str, data: Dataset, reps: int, shapes: list[str], out: Path) -> None:
    peer = PEERS[system]
    py = ensure_venv(peer)
    job = {
        "csv": str(data.csv),
        "rows": data.rows,
        "epsilon": EPSILON,
        "delta": DELTA,
        "reps": reps,
        "fresh": FRESH,
        "shapes": shapes,
        "bounds": BOUNDS,
        # OpenDP's median needs candidates: every 500 of the income bounds (1,001)
        "median_candidates": list(range(BOUNDS["income"][0], BOUNDS["income"][1] + 1, 500)),
        "out": str(out),
    }
    # one thread each, as dpgate's in-process pipeline: on a shared machine a thread pool
    # per core only waits for the others
    env = {**os.environ, "POLARS_MAX_THREADS": "1", "OMP_NUM_THREADS": "1"}
    subprocess.run(
        [str(py), str(peer.runner)], input=json.dumps(job), text=True, check=True, env=env
    )


def load(path: Path) -> tuple[str, dict[str, Any]]:
    """The system's name and its shapes (the last line per shape wins)."""
    version, shapes = path.stem, {}
    for line in path.read_text().splitlines():
        entry = json.loads(line)
        if "version" in entry:
            version = entry["version"]
        else:
            shapes[entry["shape"]] = entry
    return version, shapes


def table(data: Dataset) -> dict[str, dict[str, Any]]:
    exact = exact_answers(data)
    out: dict[str, dict[str, Any]] = {name: {} for name in SHAPES}
    for system in ("dpgate", *PEERS):
        path = results_file(data, system)
        if not path.exists():
            continue
        version, shapes = load(path)
        for name, entry in shapes.items():
            if entry.get("error"):
                out[name][version] = {"error": entry["error"]}
                continue
            if not entry["answers"]:
                continue
            s = score(entry["answers"], SHAPES[name][1], exact[name])
            s["ms"] = 1000 * sum(entry["wall_s"]) / len(entry["wall_s"])
            s["cpu_ms"] = 1000 * sum(entry["cpu_s"]) / len(entry["cpu_s"])
            out[name][version] = s
    return out


def verdict(systems: dict[str, Any]) -> str:
    """dpgate against the best peer: holds iff its MAE ≤ the peer's + 2 standard errors
    of the difference (and, for partition selection, it keeps at least as many groups as
    the peer that keeps the most, within 2 standard errors of that difference)."""
    mine = systems.get("dpgate")
    peers = {k: v for k, v in systems.items() if k != "dpgate" and "error" not in v}
    if not mine or "error" in mine or not peers:
        return ""
    name, best = min(peers.items(), key=lambda kv: kv[1]["mae"])
    se = math.sqrt(mine["se"] ** 2 + best["se"] ** 2)
    z = (mine["mae"] - best["mae"]) / se if se > 0 else math.inf
    ok = mine["mae"] <= best["mae"] + 2 * se
    if mine["groups"] > 1:
        most = max(peers.values(), key=lambda v: v["groups_kept"])
        kept_se = math.sqrt(mine["groups_kept_se"] ** 2 + most["groups_kept_se"] ** 2)
        ok = ok and mine["groups_kept"] >= most["groups_kept"] - 2 * kept_se
    return f"{'holds' if ok else 'FAILS'} (best {name.split()[0]}, z = {z:+.1f})"


def render(data: Dataset, t: dict[str, dict[str, Any]]) -> str:
    lines = [
        f"{data.name} ({data.rows:,} rows), ε = {EPSILON}",
        "",
        "| shape | system | releases | MAE ± s.e. | groups kept | ms / release | CPU ms "
        "| dpgate ≤ best peer + 2 s.e. |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, systems in t.items():
        v = verdict(systems)
        for system, s in systems.items():
            if "error" in s:
                lines.append(f"| {name} | {system} | | refused: {s['error']} | | | | |")
                continue
            kept = f"{s['groups_kept']:.2f} of {s['groups']}" if s["groups"] > 1 else ""
            lines.append(
                f"| {name} | {system} | {s['releases']} | {s['mae']:.4g} ± {s['se']:.2g} | "
                f"{kept} | {s['ms']:.3g} | {s['cpu_ms']:.3g} | "
                f"{v if system == 'dpgate' else ''} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", choices=("pums", "synthetic"), default="pums")
    p.add_argument("--rows", type=int, default=1_000_000, help="synthetic table's rows")
    p.add_argument("--reps", type=int, default=200)
    p.add_argument(
        "--systems",
        default="dpgate,opendp,tumult",
        help="comma-separated: dpgate, opendp, tumult (or none: render only)",
    )
    p.add_argument("--shapes", default=",".join(SHAPES), help="comma-separated subset")
    p.add_argument("--fresh", action="store_true", help="discard the systems' earlier lines")
    p.add_argument("--json", type=Path, help="also write the figures here")
    a = p.parse_args(argv)
    data = dataset(a.data, a.rows)
    shapes = [s for s in a.shapes.split(",") if s]
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    for system in [s for s in a.systems.split(",") if s and s != "none"]:
        out = results_file(data, system)
        if a.fresh:
            out.unlink(missing_ok=True)
        log(f"{system}: {len(shapes)} shapes x {a.reps} releases on {data.name}")
        if system == "dpgate":
            run_dpgate(data, a.reps, shapes, out)
        else:
            run_peer(system, data, a.reps, shapes, out)
    t = table(data)
    print(render(data, t))
    if a.json:
        a.json.write_text(json.dumps(t, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
