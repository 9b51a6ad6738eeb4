"""SmartNoise SQL on PUMS: its own virtualenv, the runner as a subprocess, statistics here.

The virtualenv lives in ``bench/.data/venv-smartnoise`` (override with
``DPGATE_BENCH_SN_VENV``) and is created on first use with
``python3 -m venv`` + ``pip install smartnoise-sql`` (version pinnable with
``DPGATE_BENCH_SN_SPEC``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from bench import queries as Q
from bench.common import DATA_DIR, log
from bench.pums import summarise

RUNNER = Path(__file__).resolve().parent / "smartnoise_runner.py"
VENV = Path(os.environ.get("DPGATE_BENCH_SN_VENV", DATA_DIR / "venv-smartnoise"))
SPEC = os.environ.get("DPGATE_BENCH_SN_SPEC", "smartnoise-sql")


def venv_python() -> Path:
    return VENV / "bin" / "python"


def ensure_venv() -> Path:
    """Create the SmartNoise virtualenv if missing (slow the first time: ~1–3 min)."""
    py = venv_python()
    stamp = VENV / ".installed"
    if py.exists() and stamp.exists():
        return py
    log(f"creating SmartNoise SQL virtualenv in {VENV} (pip install {SPEC})")
    VENV.parent.mkdir(parents=True, exist_ok=True)
    base = os.environ.get("DPGATE_BENCH_SN_PYTHON", "python3")
    subprocess.run([base, "-m", "venv", str(VENV)], check=True)
    subprocess.run([str(py), "-m", "pip", "install", "--quiet", "--upgrade", "pip"], check=True)
    subprocess.run([str(py), "-m", "pip", "install", "--quiet", SPEC], check=True)
    stamp.touch()
    return py


def run(reps: int, warmup: int = 5, epsilon: float = 1.0, delta: float = 1e-5) -> dict:
    """Run every query ``reps`` times at (ε, δ); latency, acceptance and MAE per query."""
    return summarise_rounds([run_round(reps, warmup, epsilon, delta)], epsilon, delta)


def run_round(reps: int, warmup: int = 5, epsilon: float = 1.0, delta: float = 1e-5) -> dict:
    """One runner process: ``warmup`` untimed, then ``reps`` timed repetitions of each
    query; its raw result (``summarise_rounds`` pools rounds)."""
    py = ensure_venv()
    job = {
        "csv": str(Q.PUMS_CSV),
        "yaml": str(Q.PUMS_YAML),
        "epsilon": epsilon,
        "delta": delta,
        "reps": reps,
        "warmup": warmup,
        "queries": [{"name": q.name, "sql": q.text("PUMS.PUMS")} for q in Q.QUERIES],
    }
    log(f"SmartNoise SQL: {len(Q.QUERIES)} queries × {reps} reps at ε={epsilon}")
    proc = subprocess.run(
        [str(py), str(RUNNER)],
        input=json.dumps(job),
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
        raise RuntimeError(f"SmartNoise runner failed with exit code {proc.returncode}")
    raw: dict = json.loads(proc.stdout)
    return raw


def summarise_rounds(rounds: list[dict], epsilon: float = 1.0, delta: float = 1e-5) -> dict:
    """The statistics of every round's repetitions pooled (a query refused in any round
    counts as refused)."""
    if not rounds:
        raise RuntimeError("SmartNoise SQL ran no round")
    pooled = [dict(q) for q in rounds[0]["queries"]]
    for later in rounds[1:]:
        for entry, q in zip(pooled, later["queries"], strict=True):
            entry["latencies_s"] = entry["latencies_s"] + q["latencies_s"]
            entry["answers"] = entry["answers"] + q["answers"]
            if not q["accepted"]:
                entry["accepted"], entry["error"] = False, q["error"]
    return summarise(pooled, system=f"smartnoise-sql {rounds[0]['version']}") | {
        "setup_s": rounds[0]["setup_s"],
        "epsilon": epsilon,
        "delta": delta,
        "rounds": len(rounds),
    }
