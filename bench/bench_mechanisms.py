"""Noise samplers: throughput (single and batched) and accuracy of a COUNT against theory.

    python -m bench.bench_mechanisms            # full (≈ 30 s)
    python -m bench.bench_mechanisms --quick    # smoke (≈ 5 s)

Rows:
- ``sampler batch``: ``DiscreteLaplace/DiscreteGaussian(...).sample(n)`` — the exact
  vectorised sampler alone, one thread (what refills the pools).
- ``sample() batch``: ``mechanisms.sample(noise, n)`` — the public call with a large n
  (synchronous refill + conversion to Python ints).
- ``sample() single``: ``mechanisms.sample(noise, 1)`` in a loop — the release path (pool
  take), with the background refiller running in the same process.
- ``sampler single``: ``sampler.sample(1)`` in a loop — the cost of drawing without a pool.
- MAE of a COUNT at ε = 1 (discrete Laplace, scale 1) against 2q/(1−q²), q = e^−1.

Everything runs in one process on one core (numpy is single-threaded for these ops).
The machine may be shared, so the figures are lower bounds. Results: stdout (a markdown
table) and ``bench/results/bench_mechanisms.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import time
from datetime import UTC, datetime
from fractions import Fraction
from pathlib import Path
from typing import Any

from mechanisms import Noise, Sensitivity, calibrate_query, prefill, sample
from mechanisms.samplers import DiscreteGaussian, DiscreteLaplace

RESULTS = Path(__file__).resolve().parent / "results" / "bench_mechanisms.json"


def _rate(fn: Any, count: int, repeats: int) -> float:
    """Best-of-``repeats`` samples per second of ``fn()`` producing ``count`` samples."""
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return count / best


def _single_rate(fn: Any, calls: int) -> float:
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return calls / (time.perf_counter() - t0)


def bench_throughput(quick: bool) -> list[dict[str, Any]]:
    batch = 100_000
    repeats = 3 if quick else 7
    calls = 5_000 if quick else 50_000
    rows: list[dict[str, Any]] = []
    specs: list[tuple[str, Noise]] = [
        ("laplace", Noise("laplace", Fraction(s))) for s in (1, 10, 1000, 10**6)
    ] + [
        ("gaussian", Noise("gaussian", Fraction(s), Fraction(s * s))) for s in (1, 10, 1000, 10**6)
    ]
    for kind, noise in specs:
        t0 = time.perf_counter()
        sampler: DiscreteLaplace | DiscreteGaussian = (
            DiscreteLaplace(noise.scale)
            if kind == "laplace"
            else DiscreteGaussian(noise.sigma2 or noise.scale**2)
        )
        setup_ms = (time.perf_counter() - t0) * 1e3
        prefill(noise, 4096)
        rows.append(
            {
                "mechanism": kind,
                "scale": float(noise.scale),
                "setup_ms": setup_ms,
                "sampler_batch_per_s": _rate(lambda s=sampler: s.sample(batch), batch, repeats),
                "sample_batch_per_s": _rate(lambda n=noise: sample(n, batch), batch, repeats),
                "sample_single_per_s": _single_rate(lambda n=noise: sample(n, 1), calls),
                "sampler_single_per_s": _single_rate(
                    lambda s=sampler: s.sample(1), max(1000, calls // 10)
                ),
            }
        )
    return rows


def bench_count_mae(quick: bool) -> dict[str, Any]:
    n = 200_000 if quick else 2_000_000
    noise = calibrate_query(
        "laplace", 1.0, 0.0, [Sensitivity(Fraction(1), Fraction(1), Fraction(1))]
    ).noises[0]
    q = math.exp(-1.0)
    theory = 2 * q / (1 - q * q)
    draws = [abs(x) for x in sample(noise, n)]
    mae = statistics.fmean(draws)
    se = statistics.pstdev(draws) / math.sqrt(n)
    return {
        "epsilon": 1.0,
        "n": n,
        "mae": mae,
        "se": se,
        "theory": theory,
        "relative_error": mae / theory - 1,
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.bench_mechanisms")
    p.add_argument("--quick", action="store_true", help="fewer repetitions")
    args = p.parse_args(argv)

    rows = bench_throughput(args.quick)
    mae = bench_count_mae(args.quick)

    print(
        "| mechanism | scale | sampler batch /s | sample() batch /s | sample() single /s"
        " | sampler single /s | setup ms |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['mechanism']} | {r['scale']:g} | {r['sampler_batch_per_s']:,.0f} | "
            f"{r['sample_batch_per_s']:,.0f} | {r['sample_single_per_s']:,.0f} | "
            f"{r['sampler_single_per_s']:,.0f} | {r['setup_ms']:.1f} |"
        )
    print()
    print("| COUNT at ε=1 | n | MAE | ± SE | theory 2q/(1−q²) | relative error |")
    print("|---|---:|---:|---:|---:|---:|")
    print(
        f"| discrete Laplace | {mae['n']:,} | {mae['mae']:.5f} | {mae['se']:.5f} | "
        f"{mae['theory']:.5f} | {mae['relative_error']:+.3%} |"
    )

    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "when": datetime.now(UTC).isoformat(timespec="seconds"),
                "machine": {
                    "python": platform.python_version(),
                    "platform": platform.platform(),
                    "cpus": os.cpu_count(),
                    "load_avg": os.getloadavg() if hasattr(os, "getloadavg") else None,
                },
                "quick": args.quick,
                "throughput": rows,
                "count_mae": mae,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"\nwritten: {RESULTS}")


if __name__ == "__main__":
    main()
