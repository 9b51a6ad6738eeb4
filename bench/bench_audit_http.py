"""The audit's price in HTTP latency, as its history grows (issue 32's target: with 300
answered queries of one analyst in its history, the median latency of a new answered
query with ``audit.mode: refuse`` at most 1 ms above the same with the audit off; after
1,000, the audit adds at most 5 ms).

    python -m bench.bench_audit_http [--workload boxes|rollups] [--probes 60]
        [--marks 300 1000] [--max-refused 3000]

Starts ``dpgate serve --workers 1`` on the demo (12,000 patients, release timing off)
twice — audit ``refuse`` and ``off`` — and sends one analyst's distinct counts over one
keep-alive connection. Two workloads:

- ``boxes`` (the default): random age × income boxes on a coarse grid (5 years, 5,000)
  at ε = 0.01 — the auditor's hard case: every box splits both axes further and adds to
  the span's rank. The audit refuses almost every box once the history holds ~570
  answered ones, so the 1,000 mark is out of reach there (``stalled_at``).
- ``rollups``: an analyst's breakdowns and roll-ups at ε = 1 — counts over a range of
  age bands (0–10, 10–20, 20–25, …, 70–80, 80+) by sex and smoking, over a range of
  income bands, and over sets of cities (Eger and Sopron always together) by sets of
  disease groups (none; chronic; acute and rare) — about 1,850 distinct queries whose
  finest cells each hold 60 patients or more, in a random order. Most of them, once the
  finest cells are answered, are sums of earlier answers: the span stops growing, the
  history does not. It reaches 1,000 answered.

The refused queries (a box that differs from earlier ones by a small group) are
counted, not timed. At each mark (that many answered queries in the history) the next
``--probes`` answered queries are timed. Both servers see the same query sequence.
Beside the wall times: the server's CPU of each answered request (its median: what load
distorts least) and of the window. After ``--max-refused`` refusals the run stops
(``stalled_at``). By default the two servers run one after the other; with
``--side-by-side`` both run at once and each query goes to both (in alternating order),
so that a machine whose load swings weighs on both alike.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import random
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.bench_latency import post, start_server
from bench.common import RESULTS_DIR


def server_cpu_s(master: int) -> float:
    """CPU seconds (user + system) used so far by the server and its workers."""
    pids = [master]
    with contextlib.suppress(OSError):
        children = Path(f"/proc/{master}/task/{master}/children").read_text()
        pids += [int(p) for p in children.split()]
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (clock ticks)
    return total / os.sysconf("SC_CLK_TCK")


def server_cpu_ns(master: int) -> int:
    """CPU nanoseconds used so far by every thread of the server and its workers
    (``/proc/<pid>/task/<tid>/schedstat``: nanosecond resolution, where ``/proc/<pid>/stat``
    counts 10 ms ticks), so that one request's CPU can be read. 0 where it is missing."""
    pids = [master]
    with contextlib.suppress(OSError):
        children = Path(f"/proc/{master}/task/{master}/children").read_text()
        pids += [int(p) for p in children.split()]
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{pid}/task").iterdir():
                with contextlib.suppress(OSError, ValueError, IndexError):
                    total += int((task / "schedstat").read_text().split()[0])
    return total


def box_queries(rng: random.Random) -> list[str]:
    """The ``boxes`` workload: every age × income box of the coarse grid, shuffled."""
    boxes = [
        (a, b, x, y)
        for a in range(0, 100, 5)
        for b in range(a + 10, 101, 5)
        for x in range(0, 60_000, 5_000)
        for y in range(x + 10_000, 80_001, 5_000)
    ]
    rng.shuffle(boxes)
    return [
        f"SELECT COUNT(*) FROM patients WHERE age BETWEEN {a} AND {b} "
        f"AND income >= {x} AND income < {y}"
        for a, b, x, y in boxes
    ]


AGE_BANDS = (0, 10, 20, 25, 30, 35, 40, 45, 50, 55, 60, 65, 70, 80, None)
INCOME_BANDS = (0, 10_000, 20_000, 30_000, 40_000, 60_000, None)
CITY_GROUPS = (
    ("Budapest",),
    ("Debrecen",),
    ("Szeged",),
    ("Pécs",),
    ("Győr",),
    ("Miskolc",),
    ("Eger", "Sopron"),
)
DISEASE_GROUPS = (
    ("None",),
    ("Hypertension", "Diabetes"),
    ("Influenza", "Asthma", "Crohn", "Meningitis"),
)


def _band(column: str, bands: tuple[int | None, ...], i: int, j: int) -> str | None:
    """``column`` in bands i..j−1 (None: every band)."""
    lo, hi = bands[i], bands[j]
    if i == 0 and hi is None:
        return None
    parts = ([] if i == 0 else [f"{column} >= {lo}"]) + ([] if hi is None else [f"{column} < {hi}"])
    return " AND ".join(parts)


def _in(column: str, groups: tuple[tuple[str, ...], ...], picked: tuple[int, ...]) -> str | None:
    if len(picked) == len(groups):
        return None
    values = ", ".join(f"'{v}'" for g in picked for v in groups[g])
    return f"{column} IN ({values})"


def rollup_queries(rng: random.Random) -> list[str]:
    """The ``rollups`` workload (see the module), shuffled."""
    import itertools

    wheres: list[list[str | None]] = []
    n_age = len(AGE_BANDS) - 1
    for i in range(n_age):
        for j in range(i + 1, n_age + 1):
            for sex in (None, "sex = 'F'", "sex = 'M'"):
                for smoker in (None, "smoker", "NOT smoker"):
                    wheres.append([_band("age", AGE_BANDS, i, j), sex, smoker])
    n_income = len(INCOME_BANDS) - 1
    for i in range(n_income):
        for j in range(i + 1, n_income + 1):
            wheres.append([_band("income", INCOME_BANDS, i, j)])
    for r in range(1, len(CITY_GROUPS) + 1):
        for cities in itertools.combinations(range(len(CITY_GROUPS)), r):
            for d in range(1, len(DISEASE_GROUPS) + 1):
                for diseases in itertools.combinations(range(len(DISEASE_GROUPS)), d):
                    wheres.append(
                        [_in("city", CITY_GROUPS, cities), _in("disease", DISEASE_GROUPS, diseases)]
                    )
    sqls = sorted(
        {
            "SELECT COUNT(*) FROM patients" + ("" if not parts else " WHERE " + " AND ".join(parts))
            for parts in ([p for p in w if p is not None] for w in wheres)
        }
    )
    rng.shuffle(sqls)
    return sqls


WORKLOADS = {"boxes": (box_queries, 0.01), "rollups": (rollup_queries, 1.0)}


def run(
    audit: str,
    root: Path,
    sqls: list[str],
    marks: list[int],
    probes: int,
    max_refused: int | None = None,
    epsilon: float = 0.01,
) -> dict[str, Any]:
    """Per mark: the median and p90 (ms) of ``probes`` answered queries sent once the
    history holds that many answered ones."""
    proc, port, key = start_server(root, audit)
    out: dict[str, Any] = {}
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        answered = refused = 0
        queue = iter(sqls)
        for mark in marks:
            while answered < mark:
                sql = next(queue, None)
                if sql is None:
                    out["exhausted_at"] = answered
                    return out
                if post(conn, key, sql, epsilon).get("ok"):
                    answered += 1
                else:
                    refused += 1
                    if max_refused is not None and refused > max_refused:
                        # the workload stalls: most boxes now differ from earlier ones
                        # by a small group, and each refusal sizes every such group
                        out["stalled_at"] = {"answered": answered, "refused": refused}
                        print(f"audit {audit}: stalled at {out['stalled_at']}", flush=True)
                        return out
            times: list[float] = []
            cpus: list[float] = []  # the server's CPU for each answered request
            refusal_cpus: list[float] = []
            cpu_before, sent = server_cpu_s(proc.pid), 0
            while len(times) < probes:
                sql = next(queue, None)
                if sql is None:
                    out["exhausted_at"] = answered
                    return out
                ns = server_cpu_ns(proc.pid)
                t = time.perf_counter()
                body = post(conn, key, sql, epsilon)
                elapsed = time.perf_counter() - t
                request_cpu = (server_cpu_ns(proc.pid) - ns) / 1e6
                sent += 1
                if body.get("ok"):
                    times.append(elapsed * 1000)
                    cpus.append(request_cpu)
                    answered += 1
                else:
                    refusal_cpus.append(request_cpu)
                    refused += 1
            cpu = server_cpu_s(proc.pid) - cpu_before
            times.sort()
            out[str(mark)] = {
                "median_ms": statistics.median(times),
                "p90_ms": times[int(0.9 * (len(times) - 1))],
                "refused_so_far": refused,
                # the server's CPU per request of the window (refusals included): what
                # wall time hides on a loaded machine
                "server_cpu_ms_per_request": 1000 * cpu / sent,
                # the server's CPU of each answered request (scheduler statistics, in
                # ns): its median is what load and the window's refusals do not distort
                "server_cpu_ms_median_answered": statistics.median(cpus),
                "refusals_in_window": len(refusal_cpus),
                "server_cpu_ms_median_refused": (
                    statistics.median(refusal_cpus) if refusal_cpus else None
                ),
                "requests_in_window": sent,
                "load1": os.getloadavg()[0],
            }
            print(f"audit {audit}, {mark} answered: {out[str(mark)]}", flush=True)
        conn.close()
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
    return out


def run_side_by_side(
    root: Path,
    sqls: list[str],
    marks: list[int],
    probes: int,
    max_refused: int | None = None,
    epsilon: float = 0.01,
) -> dict[str, dict[str, Any]]:
    """``run`` for both servers at once (``--side-by-side``): each query goes to both,
    in alternating order, so the machine's load weighs on both alike. The marks count
    the audited server's answered queries; a probe is timed where it answered (the
    other server answers everything)."""
    audits = ("off", "refuse")
    started = {audit: start_server(root, audit) for audit in audits}
    out: dict[str, dict[str, Any]] = {audit: {} for audit in audits}
    try:
        conns = {
            a: http.client.HTTPConnection("127.0.0.1", started[a][1], timeout=60) for a in audits
        }

        def send(audit: str, sql: str) -> tuple[bool, float, float]:
            pid = started[audit][0].pid
            ns = server_cpu_ns(pid)
            t = time.perf_counter()
            try:
                body = post(conns[audit], started[audit][2], sql, epsilon)
            except (http.client.RemoteDisconnected, ConnectionError):
                # idle past the server's keep-alive (5 s, while the other server was busy
                # refusing), the connection was closed: once more, on a new one
                conns[audit].close()
                ns = server_cpu_ns(pid)
                t = time.perf_counter()
                body = post(conns[audit], started[audit][2], sql, epsilon)
            elapsed = time.perf_counter() - t
            return bool(body.get("ok")), elapsed * 1000, (server_cpu_ns(pid) - ns) / 1e6

        answered = refused = 0
        queue = iter(sqls)
        for mark in marks:
            while answered < mark:
                sql = next(queue, None)
                if sql is None:
                    out["refuse"]["exhausted_at"] = answered
                    return out
                send("off", sql)
                if send("refuse", sql)[0]:
                    answered += 1
                else:
                    refused += 1
                    if max_refused is not None and refused > max_refused:
                        out["refuse"]["stalled_at"] = {"answered": answered, "refused": refused}
                        return out
            times: dict[str, list[float]] = {a: [] for a in audits}
            cpus: dict[str, list[float]] = {a: [] for a in audits}
            refusal_cpus: list[float] = []
            cpu_before = {a: server_cpu_s(started[a][0].pid) for a in audits}
            sent = 0
            while len(times["refuse"]) < probes:
                sql = next(queue, None)
                if sql is None:
                    out["refuse"]["exhausted_at"] = answered
                    return out
                order = audits if sent % 2 == 0 else audits[::-1]
                result = {a: send(a, sql) for a in order}
                sent += 1
                if result["refuse"][0]:
                    answered += 1
                    for a in audits:
                        times[a].append(result[a][1])
                        cpus[a].append(result[a][2])
                else:
                    refused += 1
                    refusal_cpus.append(result["refuse"][2])
            for a in audits:
                cpu = server_cpu_s(started[a][0].pid) - cpu_before[a]
                ordered = sorted(times[a])
                out[a][str(mark)] = {
                    "median_ms": statistics.median(ordered),
                    "p90_ms": ordered[int(0.9 * (len(ordered) - 1))],
                    "refused_so_far": refused if a == "refuse" else 0,
                    "server_cpu_ms_per_request": 1000 * cpu / sent,
                    "server_cpu_ms_median_answered": statistics.median(cpus[a]),
                    "refusals_in_window": len(refusal_cpus) if a == "refuse" else 0,
                    "server_cpu_ms_median_refused": (
                        statistics.median(refusal_cpus) if a == "refuse" and refusal_cpus else None
                    ),
                    "requests_in_window": sent,
                    "load1": os.getloadavg()[0],
                }
                print(f"audit {a}, {mark} answered: {out[a][str(mark)]}", flush=True)
        for conn in conns.values():
            conn.close()
    finally:
        for proc, _, _ in started.values():
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="boxes")
    parser.add_argument("--probes", type=int, default=60)
    parser.add_argument(
        "--side-by-side",
        action="store_true",
        help="run both servers at once, each query to both (load weighs on both alike)",
    )
    parser.add_argument("--marks", type=int, nargs="+", default=[300, 1000])
    parser.add_argument(
        "--max-refused",
        type=int,
        default=3000,
        help="give up on the next mark after this many refusals (the run stalls)",
    )
    args = parser.parse_args()
    make, epsilon = WORKLOADS[args.workload]
    sqls = make(random.Random(11))
    root = Path(tempfile.mkdtemp(prefix="dpgate-audit-http-"))
    if args.side_by_side:
        results = run_side_by_side(root, sqls, args.marks, args.probes, args.max_refused, epsilon)
    else:
        results = {
            audit: run(audit, root, sqls, args.marks, args.probes, args.max_refused, epsilon)
            for audit in ("off", "refuse")
        }
    print(
        "| answered in history | audit off median ms | audit refuse median ms | added "
        "| server CPU ms/answered (median) off | refuse | added "
        "| server CPU ms/request of the window off | refuse | load |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for mark in args.marks:
        if str(mark) not in results["off"] or str(mark) not in results["refuse"]:
            print(f"| {mark} | not reached: {results} |")
            continue
        off, on = results["off"][str(mark)], results["refuse"][str(mark)]
        added = on["median_ms"] - off["median_ms"]
        cpu_off, cpu_on = off["server_cpu_ms_per_request"], on["server_cpu_ms_per_request"]
        med_off = off["server_cpu_ms_median_answered"]
        med_on = on["server_cpu_ms_median_answered"]
        print(
            f"| {mark} | {off['median_ms']:.2f} | {on['median_ms']:.2f} | {added:+.2f} "
            f"| {med_off:.2f} | {med_on:.2f} | {med_on - med_off:+.2f} "
            f"| {cpu_off:.2f} | {cpu_on:.2f} | {off['load1']:.1f}, {on['load1']:.1f} |"
        )
    RESULTS_DIR.mkdir(exist_ok=True)
    name = (
        "bench_audit_http.json"
        if args.workload == "boxes"
        else f"bench_audit_http_{args.workload}.json"
    )
    (RESULTS_DIR / name).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
