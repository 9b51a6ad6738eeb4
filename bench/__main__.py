"""``python -m bench`` (``make bench``): every benchmark part, one markdown table, one JSON.

    python -m bench                 # full: PUMS ×200, SmartNoise, scale 1M+10M, throughput
    python -m bench --quick         # smoke: PUMS ×20, scale 100k, throughput 5 s
    python -m bench --parts pums,smartnoise --reps 50

Figures go to stdout as one markdown table and to ``bench/results/bench-<UTC>.json``
(plus ``bench/results/latest.json``); progress goes to stderr. See bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.common import COUNT_MAE_THEORY, REPO_DIR, RESULTS_DIR, fmt, log

PARTS = ("pums", "smartnoise", "throughput", "pgwire", "dashboard", "scale")
PUMS_ROUNDS = 10  # turns dpgate and SmartNoise take on PUMS (each: reps / PUMS_ROUNDS)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes and few repetitions")
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma list of {PARTS}")
    p.add_argument("--reps", type=int, help="PUMS repetitions per query (200; quick 20)")
    p.add_argument(
        "--count-reps", type=int, help="extra dpgate COUNT(*) releases (5000; quick 300)"
    )
    p.add_argument("--sizes", help="scale sizes, comma list (1000000,10000000; quick 100000)")
    p.add_argument(
        "--backends",
        default="sqlite,duckdb,postgresql,clickhouse",
        help="scale backends, comma list",
    )
    p.add_argument("--scale-reps", type=int, help="scale repetitions (10 at ≤1M, 5 above)")
    p.add_argument(
        "--scale-baseline",
        help="an earlier results JSON: the scale part's bounded figures are compared with it",
    )
    p.add_argument("--duration", type=float, help="seconds per throughput scenario (20; 5)")
    p.add_argument("--workers", type=int, default=2, help="dpgate serve --workers")
    p.add_argument("--clients", type=int, default=32, help="throughput client threads")
    return p.parse_args(argv)


def machine() -> dict[str, Any]:
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO_DIR,
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
    except OSError:
        commit = ""
    return {
        "cpus": os.cpu_count(),
        "loadavg": os.getloadavg(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "commit": commit,
    }


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    parts = [x.strip() for x in a.parts.split(",") if x.strip()]
    unknown = set(parts) - set(PARTS)
    if unknown:
        print(f"unknown parts: {sorted(unknown)}", file=sys.stderr)
        return 2
    reps = a.reps or (20 if a.quick else 200)
    count_reps = a.count_reps if a.count_reps is not None else (300 if a.quick else 5000)
    sizes = (
        [int(s) for s in a.sizes.split(",")]
        if a.sizes
        else ([100_000] if a.quick else [1_000_000, 10_000_000])
    )
    duration = a.duration or (5.0 if a.quick else 20.0)
    started = datetime.now(UTC)
    results: dict[str, Any] = {
        "started": started.isoformat(timespec="seconds"),
        "quick": a.quick,
        "settings": {
            "reps": reps,
            "count_reps": count_reps,
            "sizes": sizes,
            "backends": a.backends,
            "duration_s": duration,
            "workers": a.workers,
            "clients": a.clients,
        },
        "machine_before": machine(),
        "parts": {},
    }

    def attempt(name: str, fn: Any) -> None:
        t = time.perf_counter()
        try:
            results["parts"][name] = fn()
        except Exception as e:
            log(f"{name} failed: {type(e).__name__}: {e}")
            traceback.print_exc(file=sys.stderr)
            results["parts"][name] = {"failed": f"{type(e).__name__}: {e}"}
        results["parts"][name]["wall_s"] = time.perf_counter() - t

    if "pums" in parts and "smartnoise" in parts:
        # Both systems take turns (PUMS_ROUNDS rounds), so that the speed-up compares
        # them in the same minutes of a host whose speed drifts (bench/pums.py, run).
        from bench import pums
        from bench.peer import smartnoise

        peer_rounds: list[dict[str, Any]] = []
        rounds = min(PUMS_ROUNDS, reps)

        def peer_round(n: int) -> None:
            peer_rounds.append(smartnoise.run_round(n))

        attempt(
            "pums",
            lambda: pums.run(reps, count_reps=count_reps, rounds=rounds, between=peer_round),
        )
        attempt("smartnoise", lambda: smartnoise.summarise_rounds(peer_rounds))
    elif "pums" in parts:
        from bench import pums

        attempt("pums", lambda: pums.run(reps, count_reps=count_reps))
    elif "smartnoise" in parts:
        from bench.peer import smartnoise

        attempt("smartnoise", lambda: smartnoise.run(reps))
    if "throughput" in parts:
        from bench import throughput

        attempt(
            "throughput",
            lambda: throughput.run(duration=duration, workers=a.workers, clients=a.clients),
        )
    if "pgwire" in parts:
        from bench import bench_pgwire

        attempt("pgwire", lambda: bench_pgwire.run(100 if a.quick else 400))
    if "dashboard" in parts:
        from bench import dashboard

        attempt(
            "dashboard",
            lambda: dashboard.run(
                n=20 if a.quick else 60, dashboards=2 if a.quick else 5, duration=duration / 2
            ),
        )
    if "scale" in parts:
        # Last: loading and reading 10M rows leaves databases busy for a while
        # (autovacuum, checkpoints), which would be measured as the server's latency.
        from bench import scale

        reps_for = {
            n: a.scale_reps or (3 if a.quick else (10 if n <= 1_000_000 else 5)) for n in sizes
        }
        attempt("scale", lambda: scale.run(sizes, a.backends.split(","), reps_for))
        if a.scale_baseline:
            baseline = json.loads(Path(a.scale_baseline).read_text(encoding="utf-8"))
            results["scale_baseline"] = baseline.get("parts", {}).get("scale")
            results["settings"]["scale_baseline"] = a.scale_baseline
    results["machine_after"] = machine()
    results["finished"] = datetime.now(UTC).isoformat(timespec="seconds")
    rows = table_rows(results)
    results["table"] = rows
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    text = json.dumps(results, indent=1, default=_json_default)
    (RESULTS_DIR / f"bench-{stamp}{'-quick' if a.quick else ''}.json").write_text(text)
    (RESULTS_DIR / "latest.json").write_text(text)
    print(render(rows, results))
    return 0


def _json_default(o: Any) -> Any:
    if isinstance(o, float) and not math.isfinite(o):
        return None
    return str(o)


# --- the one table ---------------------------------------------------------------------


def _verdict(ok: bool | str | None) -> str:
    if isinstance(ok, str):
        return ok
    return "n/a" if ok is None else ("yes" if ok else "**no**")


def _mae_verdict(mae: float, se: float, limit: float) -> str:
    """yes / no only when the estimate is more than 2 standard errors from the limit."""
    if mae + 2 * se <= limit:
        return "yes"
    if mae - 2 * se > limit:
        return "**no**"
    return "yes (point estimate; within 2 s.e.)" if mae <= limit else "inconclusive (within 2 s.e.)"


def table_rows(r: dict[str, Any]) -> list[dict[str, str]]:
    rows: list[dict[str, str]] = []

    def add(
        part: str, figure: str, value: str, target: str = "", met: bool | str | None = None
    ) -> None:
        rows.append(
            {
                "part": part,
                "figure": figure,
                "value": value,
                "target": target,
                "met": _verdict(met) if target else "",
            }
        )

    P = r["parts"]
    pg = P.get("pgwire", {})
    if pg.get("failed"):
        add("PostgreSQL protocol", "run", f"failed: {pg['failed'][:120]}")
    elif pg.get("median_ms"):
        add(
            "PostgreSQL protocol",
            "per-query overhead vs HTTP, cached query (wire − HTTP median)",
            f"{fmt(pg['wire_minus_http_ms'])} ms (wire {fmt(pg['median_ms']['wire'])}, "
            f"HTTP {fmt(pg['median_ms']['http'])}, in-process "
            f"{fmt(pg['median_ms']['in_process'])} ms)",
            "≤ 1 ms",
            pg["wire_minus_http_ms"] <= 1.0,
        )
    db = P.get("dashboard", {})
    if db.get("failed"):
        add("Dashboard", "run", f"failed: {db['failed'][:120]}")
    elif db.get("timing_deadline"):
        on, off = db["timing_deadline"], db["timing_off"]
        single = on["single"]
        add(
            "Dashboard",
            "single COUNT/AVG on patients over HTTP, median (padding to the deadline apart)",
            f"{fmt(single['latency']['median_ms'])} ms (= deadline padding "
            f"{fmt(single['padding_mean_ms'])} ms + pipeline {fmt(single['pipeline_median_ms'])}"
            f" ms; {single['failed']} failed; timing off "
            f"{fmt(off['single']['latency']['median_ms'])} ms; load {fmt(single['load'])})",
            "≤ 50 ms",
            single["latency"]["median_ms"] <= 50,
        )
        dash = on["dashboard"]
        add(
            "Dashboard",
            "20 distinct charts of one analyst fired at once, wall time, median",
            f"{fmt(dash['wall_median_s'])} s (deadline padding {fmt(dash['padding_mean_ms'])} "
            f"ms per chart; {dash['failed']} of {dash['charts'] * dash['runs']} failed, "
            f"{fmt(dash['misses'])} misses {dash.get('misses_by_stage', {})}; timing off "
            f"{fmt(off['dashboard']['wall_median_s'])} s; load {fmt(dash['load'])})",
            "≤ 1.0 s",
            dash["wall_median_s"] <= 1.0,
        )
        ex = on["examples"]
        add(
            "Dashboard",
            "deadline misses, README and console examples (5 each)",
            f"{fmt(ex['misses'])} (not answered: {ex['not_ok'] or 'none'}; load {fmt(ex['load'])})",
            "0",
            ex["misses"] == 0,
        )
        add(
            "Dashboard",
            "throughput, 8 analysts, default config vs timing off",
            f"{fmt(on['throughput']['answered_per_s'])} vs "
            f"{fmt(off['throughput']['answered_per_s'])} answers/s ({on['throughput']['failed']}"
            f" vs {off['throughput']['failed']} failed; load {fmt(on['throughput']['load'])} / "
            f"{fmt(off['throughput']['load'])})",
        )
    dp, sn = P.get("pums", {}), P.get("smartnoise", {})
    for name, res in (("dpgate", dp), ("SmartNoise", sn)):
        if res.get("failed"):
            add("PUMS", f"{name} run", f"failed: {res['failed'][:120]}")
    if dp.get("queries"):
        la = dp["latency_all"]
        add(
            "PUMS",
            "dpgate latency per query, cache miss (median / p99)",
            f"{fmt(la['median_ms'])} / {fmt(la['p99_ms'])} ms",
        )
        ch = dp.get("latency_cache_hit", {})
        if ch.get("n"):
            add(
                "PUMS",
                "dpgate latency per query, cache hit (median / p99)",
                f"{fmt(ch['median_ms'])} / {fmt(ch['p99_ms'])} ms",
            )
    st = dp.get("stages")
    if st and st.get("stages_ms"):
        parts = ", ".join(f"{k} {v:.2g}" for k, v in st["stages_ms"].items())
        add(
            "PUMS",
            "dpgate time per stage, cache-miss COUNT under cProfile (ms per query; "
            "profiler inflates Python-heavy stages)",
            f"total {st['profiled_ms_per_query']:.3g}: {parts}",
        )
    au = dp.get("analyze_uncached")
    if au:
        add(
            "PUMS",
            "dpgate SQL analysis alone, plan cache bypassed (median over the 22 queries; "
            "add it to the latency of a never-seen query text)",
            f"{fmt(au['median_ms'])} ms",
        )
    if sn.get("queries"):
        la = sn["latency_all"]
        add(
            "PUMS",
            f"{sn['system']} latency per query (median / p99)",
            f"{fmt(la['median_ms'])} / {fmt(la['p99_ms'])} ms",
        )
    if dp.get("queries") and sn.get("queries"):
        ratios = []
        for dq, sq in zip(dp["queries"], sn["queries"], strict=True):
            if dq["accepted"] and sq["accepted"]:
                ratios.append(sq["latency"]["median_ms"] / dq["latency"]["median_ms"])
        if ratios:
            ratios.sort()
            med = (
                ratios[len(ratios) // 2]
                if len(ratios) % 2
                else ((ratios[len(ratios) // 2 - 1] + ratios[len(ratios) // 2]) / 2)
            )
            add(
                "PUMS",
                f"speed-up vs SmartNoise (median per-query ratio of medians, {len(ratios)} "
                f"queries both accept; min–max){_turns(sn)}",
                f"{fmt(med)}× ({fmt(ratios[0])}–{fmt(ratios[-1])}×)",
                "≥ 25× (issue 14)",
                med >= 25,
            )
    http = dp.get("http") or {}
    if http.get("per_query_median_ms") and sn.get("queries"):
        over_http = []
        for sq in sn["queries"]:
            mine = http["per_query_median_ms"].get(sq["name"])
            if mine and sq["accepted"]:
                over_http.append(sq["latency"]["median_ms"] / mine)
        if over_http:
            over_http.sort()
            med = statistics.median(over_http)
            add(
                "PUMS",
                f"speed-up vs SmartNoise over HTTP (dpgate serve --workers 1, one keep-alive "
                f"client, cache miss; median per-query ratio, {len(over_http)} queries; "
                f"dpgate median {fmt(http['median_ms'])} ms){_turns(sn)}",
                f"{fmt(med)}× ({fmt(over_http[0])}–{fmt(over_http[-1])}×)",
                "≥ 12× (issue 14)",
                med >= 12,
            )
    for name, res in (("dpgate", dp), ("SmartNoise", sn)):
        if res.get("queries"):
            refused = [q["name"] for q in res["queries"] if not q["accepted"]]
            add(
                "PUMS",
                f"{name}: queries accepted",
                f"{res['accepted']}/{res['total']}"
                + (f" (refused: {', '.join(refused)})" if refused else ""),
            )
    if sn.get("queries"):
        costs: dict[str, list[str]] = {}
        for q in sn["queries"]:
            c = q.get("privacy_cost")
            if c:
                costs.setdefault(f"ε={fmt(c[0])}", []).append(q["kind"])
        if costs:
            add(
                "PUMS",
                "SmartNoise: ε its own odometer charges per query at Privacy(ε=1) "
                "(dpgate charges the requested ε=1 for the whole query)",
                "; ".join(f"{k}: {', '.join(sorted(set(v)))}" for k, v in costs.items()),
            )
    limit = COUNT_MAE_THEORY * 1.02
    for name, res in (("dpgate", dp), ("SmartNoise", sn)):
        cm = res.get("count_mae")
        if cm and cm.get("n"):
            add(
                "PUMS",
                f"{name}: COUNT MAE at ε=1 (8 COUNT queries pooled, n={cm['n']}, ± s.e.)",
                f"{cm['mae']:.3f} ± {cm['se']:.3f}",
                f"≤ {limit:.3f} (theory {COUNT_MAE_THEORY:.3f} + 2%)",
                _mae_verdict(cm["mae"], cm["se"], limit),
            )
    big = dp.get("count_all_mae_large")
    if big and big.get("n"):
        add(
            "PUMS",
            f"dpgate: COUNT(*) MAE at ε=1 (n={big['n']} fresh releases, ± s.e.)",
            f"{big['mae']:.3f} ± {big['se']:.3f}",
            f"≤ {limit:.3f}",
            _mae_verdict(big["mae"], big["se"], limit),
        )

    if "scale" in P:
        from bench import scale

        for row in scale.summary_rows(P["scale"], r.get("scale_baseline")):
            add(*row)

    tp = P.get("throughput", {})
    if tp.get("failed"):
        add("throughput", "run", f"failed: {tp['failed'][:120]}")
    for scen, label, target in (
        (
            "distinct",
            "distinct queries, SQLite ledger, durable charge each, release timing off",
            (300.0, 60.0),
        ),
        (
            "distinct_fixed_rate",
            "the same distinct queries offered at a fixed rate (open loop; each latency "
            "from the request's scheduled moment)",
            None,
        ),
        ("repeated", "repeated query (cache hits), SQLite ledger", None),
        ("postgres_ledger", "distinct queries, PostgreSQL ledger, release timing off", None),
        (
            "deadline_timing",
            "distinct queries, SQLite ledger, default release timing (padding to the "
            "deadline, reported apart from pipeline time)",
            None,
        ),
    ):
        s = tp.get(scen)
        if s:
            other = {k: v for k, v in s["outcomes"].items() if not k.startswith("answered")}
            rate, median = s["answered_per_s"], s["latency"]["median_ms"]
            add(
                "throughput",
                f"HTTP, --workers {tp['workers']}, {tp['clients']} clients: {label}",
                (f"offered {s['offered_per_s']:.0f}/s: " if s.get("offered_per_s") else "")
                + f"{rate:.1f} answered/s (median {fmt(median)}"
                f" ms, p99 {fmt(s['latency']['p99_ms'])} ms)"
                + (f", {s['sent_late']} sent late" if s.get("sent_late") else "")
                + _costs_text(s)
                + (f"; not answered: {other}" if other else ""),
                "≥ 300/s, p50 ≤ 60 ms" if target else "",
                None if target is None else (rate >= target[0] and median <= target[1]),
            )
    return rows


def _costs_text(s: dict[str, Any]) -> str:
    """What a throughput figure cost: CPU per answer of the server and of the load
    generator, the CPU time the hypervisor took, and the CPU time other processes of the
    machine took while it ran (bench/throughput.py)."""
    parts = []
    if "server_cpu_ms_per_answer" in s:
        parts.append(f"server CPU {fmt(s['server_cpu_ms_per_answer'])} ms/answer")
    if "client_cpu_ms_per_answer" in s:
        parts.append(f"load generator {fmt(s['client_cpu_ms_per_answer'])} ms")
    if "steal_share" in s:
        parts.append(f"steal {100 * s['steal_share']:.0f}%")
    if "other_cpu_share" in s:
        parts.append(f"other processes {100 * s['other_cpu_share']:.0f}%")
    return f"; {', '.join(parts)}" if parts else ""


def render(rows: list[dict[str, str]], r: dict[str, Any]) -> str:
    m0, m1 = r["machine_before"], r["machine_after"]
    head = (
        f"dpgate benchmarks{' (--quick)' if r['quick'] else ''} — {r['started']} → "
        f"{r['finished']}, commit {m0['commit']}, {m0['cpus']} CPUs, load average "
        f"{m0['loadavg'][0]:.2f} → {m1['loadavg'][0]:.2f} (shared machine)\n\n"
    )
    lines = [
        "| part | figure | value | target | met |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        cells = [row[k].replace("|", "\\|") for k in ("part", "figure", "value", "target", "met")]
        lines.append("| " + " | ".join(cells) + " |")
    return head + "\n".join(lines) + "\n"


def _turns(peer: dict[str, Any]) -> str:
    """How the two systems were timed, for a speed-up's label."""
    rounds = peer.get("rounds")
    return f"; the systems taking turns, {rounds} rounds" if rounds and rounds > 1 else ""


if __name__ == "__main__":
    sys.exit(main())
