"""Soak: worker memory and throughput over time, auditor on (issue 36's acceptance).

    python -m bench.soak [--duration 600] [--clients 16] [--workers 2] [--interval 10]
    python -m bench --parts soak

Starts ``dpgate serve --workers N`` (gunicorn) on a fresh copy of the demo (12,000
patients, release timing off so that the figure is the pipeline's own rate, audit
``refuse`` per analyst) and runs ``--clients`` closed-loop clients, each its own analyst
on one keep-alive connection, sending a mixed load of distinct queries (``mixed_sql``):
grouped counts over age bands, averages by sex in one city, counts over income
thresholds, visits by department in one year, each at one of a few ε — so nearly every
request is a new release the auditor must remember (repeats are cache hits, free). Every
``--interval`` seconds it samples each worker's resident set (``/proc/<pid>/status``,
``VmRSS``) and the answers per second in that interval.

The acceptance (issue 36): after the warm-up (``--warmup``, default a fifth of the run),
worker RSS grows less than 5 MB per 10 minutes (least-squares slope of each worker's
samples), and the last sample interval's throughput is within 10% of the first one's
after the warm-up. The figures are written to ``bench/results/soak.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.adapter import LeanHttp
from bench.bench_audit_http import server_cpu_s
from bench.common import RESULTS_DIR, log
from bench.throughput import _free_port, _wait_ready

EPSILONS = (0.05, 0.1, 0.2, 0.3)
MB = 1024 * 1024


def mixed_sql(seed: int) -> Iterator[tuple[str, float]]:
    """One analyst's endless mixed questions (SQL, ε), seeded; a question comes back at
    another ε now and then (a new release of a region already answered)."""
    from gateway.demo.hospital import CITIES, DEPARTMENTS

    rng = random.Random(seed)
    while True:
        kind = rng.randrange(5)
        eps = rng.choice(EPSILONS)
        if kind == 0:
            a = rng.randrange(0, 90, 5)
            b = rng.randrange(a + 10, 101, 5)
            yield (
                f"SELECT disease, COUNT(*) FROM patients WHERE age BETWEEN {a} AND {b} "
                "GROUP BY disease",
                eps,
            )
        elif kind == 1:
            city = rng.choice(CITIES)
            yield f"SELECT sex, AVG(glucose) FROM patients WHERE city = '{city}' GROUP BY sex", eps
        elif kind == 2:
            x = rng.randrange(0, 200_000, 1_000)
            yield f"SELECT COUNT(*) FROM patients WHERE income >= {x}", eps
        elif kind == 3:
            year = rng.randrange(2019, 2026)
            yield (
                f"SELECT department, COUNT(*) FROM visits WHERE year = {year} GROUP BY department",
                eps,
            )
        else:
            dept = rng.choice(DEPARTMENTS)
            lo = rng.randrange(0, 25, 5)
            yield (
                f"SELECT AVG(cost) FROM visits WHERE department = '{dept}' "
                f"AND length_of_stay >= {lo}",
                eps,
            )


def worker_pids(master: int) -> list[int]:
    """The gunicorn master's worker processes (its children)."""
    try:
        text = Path(f"/proc/{master}/task/{master}/children").read_text()
    except OSError:
        return []
    return sorted(int(p) for p in text.split())


def rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def slope_per_10min(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of (seconds, MB) points, in MB per 10 minutes."""
    if len(points) < 3:
        return None
    ts = [t for t, _ in points]
    ys = [y for _, y in points]
    mt, my = statistics.fmean(ts), statistics.fmean(ys)
    var = sum((t - mt) ** 2 for t in ts)
    if var == 0:
        return None
    return 600 * sum((t - mt) * (y - my) for t, y in zip(ts, ys, strict=True)) / var


def setup(
    root: Path, clients: int, audit: str, memory_mb: int | None = None
) -> tuple[Path, list[str]]:
    """A fresh demo database, ledger and config, and one API key per client."""
    import budget
    from gateway.demo.hospital import build, config_yaml

    db = root / "hospital.db"
    build(db)
    ledger = root / "ledger.db"
    text = config_yaml(str(db), str(ledger)).replace("mode: refuse", f'mode: "{audit}"')
    text = text.replace("timing: deadline", 'timing: "off"')
    if memory_mb is not None:
        text = text.replace(
            "  scope: analyst\n", f"  scope: analyst\n  memory_mb: {memory_mb}\n", 1
        )
    config = root / "dpgate.yaml"
    config.write_text(text)
    led = budget.Ledger.from_url(f"sqlite:///{ledger}")
    led.migrate()
    keys = [led.create_analyst(f"soak{i}", 1e9, 1e-3) for i in range(clients)]
    led.close()
    return config, keys


def run(
    duration: float,
    clients: int,
    workers: int,
    interval: float,
    warmup: float | None,
    audit: str = "refuse",
    memory_mb: int | None = None,
) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="dpgate-soak-"))
    config, keys = setup(root, clients, audit, memory_mb)
    port = _free_port()
    env = {**os.environ, "DPGATE_ADMIN_KEY": "soak-admin", "OPENBLAS_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "gateway.cli", "serve", "--config", str(config)),
            *("--port", str(port), "--workers", str(workers)),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=(root / "server.log").open("wb"),
        start_new_session=True,
    )
    stop = threading.Event()
    lock = threading.Lock()
    counts = {"answered": 0, "refused": 0, "other": 0}

    def client(i: int) -> None:
        http = LeanHttp("127.0.0.1", port, keys[i])
        questions = mixed_sql(1000 + i)
        while not stop.is_set():
            sql, eps = next(questions)
            try:
                status, _ = http.query(sql, eps)
            except OSError:
                status = 0
            kind = "answered" if status == 200 else "refused" if status == 403 else "other"
            with lock:
                counts[kind] += 1
        http.close()

    samples: list[dict[str, Any]] = []
    try:
        _wait_ready(port, proc)
        threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
        start = time.monotonic()
        for t in threads:
            t.start()
        last = dict(counts)
        last_cpu = server_cpu_s(proc.pid)
        while (now := time.monotonic()) - start < duration:
            time.sleep(min(interval, max(0.0, start + duration - now)))
            elapsed = time.monotonic() - start
            with lock:
                snap = dict(counts)
            pids = worker_pids(proc.pid)
            cpu = server_cpu_s(proc.pid)
            answered = snap["answered"] - last["answered"]
            sample = {
                "t": round(elapsed, 1),
                "rss_mb": {str(p): rss_mb(p) for p in pids},
                "answered_per_s": (snap["answered"] - last["answered"]) / interval,
                "refused_per_s": (snap["refused"] - last["refused"]) / interval,
                # the servers' CPU per answer: the throughput a loaded machine's share of
                # CPU would not hide (refusals included in the CPU)
                "server_cpu_ms_per_answer": 1000 * (cpu - last_cpu) / answered
                if answered
                else None,
                "answered_total": snap["answered"],
                "other": snap["other"],
                "load1": os.getloadavg()[0],
            }
            last, last_cpu = snap, cpu
            samples.append(sample)
            log(f"[soak] {sample}")
        stop.set()
        for t in threads:
            t.join(30)
    finally:
        stop.set()
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(root, ignore_errors=True)
    return summarise(samples, counts, duration if warmup is None else None, warmup, workers) | {
        "clients": clients,
        "workers": workers,
        "audit": audit,
        "audit_memory_mb": memory_mb,
        "duration_s": duration,
        "samples": samples,
    }


def summarise(
    samples: list[dict[str, Any]],
    counts: dict[str, int],
    duration: float | None,
    warmup: float | None,
    workers: int = 2,
) -> dict[str, Any]:
    """RSS slope per worker after the warm-up (per 10 minutes, and per 1,000 releases of
    a worker: a loaded machine releases fewer per minute), and the throughput of the
    first and last fifth of the samples after it."""
    cut = warmup if warmup is not None else (duration or 0) / 5
    after = [s for s in samples if s["t"] > cut]
    series: dict[str, list[tuple[float, float]]] = {}
    by_release: dict[str, list[tuple[float, float]]] = {}
    for s in after:
        for pid, mb in s["rss_mb"].items():
            if mb is not None:
                series.setdefault(pid, []).append((s["t"], mb))
                # releases per worker: the answers so far, shared evenly (keep-alive
                # connections are balanced across workers)
                by_release.setdefault(pid, []).append((s["answered_total"] / workers, mb))
    slopes = {pid: slope_per_10min(points) for pid, points in series.items()}
    per_1000 = {
        pid: None if (v := slope_per_10min(points)) is None else v * 1000 / 600
        for pid, points in by_release.items()
    }
    cpu = [s["server_cpu_ms_per_answer"] for s in after if s["server_cpu_ms_per_answer"]]
    tail = max(1, len(after) // 5)
    start_rate = statistics.fmean(s["answered_per_s"] for s in after[:tail]) if after else None
    end_rate = statistics.fmean(s["answered_per_s"] for s in after[-tail:]) if after else None
    return {
        "warmup_s": cut,
        "counts": counts,
        "rss_slope_mb_per_10min": slopes,
        "rss_mb_per_1000_releases": per_1000,
        "rss_first_last_mb": {p: (pts[0][1], pts[-1][1]) for p, pts in series.items()},
        "throughput_window_samples": tail,
        "answered_per_s_start": start_rate,
        "answered_per_s_end": end_rate,
        "end_vs_start": (end_rate / start_rate) if start_rate and end_rate is not None else None,
        "server_cpu_ms_per_answer_start": statistics.fmean(cpu[:tail]) if cpu else None,
        "server_cpu_ms_per_answer_end": statistics.fmean(cpu[-tail:]) if cpu else None,
        "load1_start_end": (after[0]["load1"], after[-1]["load1"]) if after else None,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=600)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--interval", type=float, default=10)
    ap.add_argument("--warmup", type=float, default=None)
    ap.add_argument("--audit", default="refuse", choices=("refuse", "flag", "off"))
    ap.add_argument(
        "--audit-memory-mb",
        type=int,
        default=None,
        help="audit.memory_mb for the server (default: the config's default, 64); a small "
        "budget makes a short run reach it",
    )
    args = ap.parse_args(argv)
    result = run(
        args.duration,
        args.clients,
        args.workers,
        args.interval,
        args.warmup,
        args.audit,
        args.audit_memory_mb,
    )
    summary = {k: v for k, v in result.items() if k != "samples"}
    print(json.dumps(summary, indent=2))
    RESULTS_DIR.mkdir(exist_ok=True)
    (RESULTS_DIR / "soak.json").write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
