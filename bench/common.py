"""Small helpers shared by the benchmark parts: paths, timing summaries, error statistics."""

from __future__ import annotations

import math
import os
import statistics
import sys
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
REPO_DIR = BENCH_DIR.parent
# Generated data (databases, the SmartNoise virtualenv, ledgers): never committed.
DATA_DIR = Path(os.environ.get("DPGATE_BENCH_DATA", BENCH_DIR / ".data"))
RESULTS_DIR = BENCH_DIR / "results"

# Discrete Laplace of scale 1/ε, ε = 1: q = e^−ε, E|X| = 2q / (1 − q²).
Q_EPS1 = math.exp(-1.0)
COUNT_MAE_THEORY = 2 * Q_EPS1 / (1 - Q_EPS1**2)


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def last_line(text: str) -> str:
    """A failure's last non-empty line: a traceback's exception, or the whole message."""
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    return lines[-1] if lines else "?"


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile (p in [0, 100]); NaN for an empty list."""
    if not values:
        return math.nan
    s = sorted(values)
    k = max(0, min(len(s) - 1, math.ceil(p / 100 * len(s)) - 1))
    return s[k]


def latency_summary(seconds: list[float]) -> dict[str, float]:
    """Median, p99 and mean in milliseconds."""
    if not seconds:
        return {"n": 0, "median_ms": math.nan, "p99_ms": math.nan, "mean_ms": math.nan}
    return {
        "n": len(seconds),
        "median_ms": statistics.median(seconds) * 1e3,
        "p99_ms": percentile(seconds, 99) * 1e3,
        "mean_ms": statistics.fmean(seconds) * 1e3,
    }


def mae_summary(abs_errors: list[float]) -> dict[str, float]:
    """Mean absolute error with its standard error (so a reader can judge ±)."""
    n = len(abs_errors)
    if n == 0:
        return {"n": 0, "mae": math.nan, "se": math.nan}
    mae = statistics.fmean(abs_errors)
    se = statistics.stdev(abs_errors) / math.sqrt(n) if n > 1 else math.nan
    return {"n": n, "mae": mae, "se": se}


def fmt(x: float | None, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.{digits}g}"
