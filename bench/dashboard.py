"""Release moments that fit the query (issue 33): single-answer latency, a dashboard of one
analyst fired at once, the README's and console's examples, throughput with and without
release timing.

    python -m bench --parts dashboard [--quick]
    python -m bench.dashboard [--n 60] [--dashboards 5] [--duration 10]

Starts `dpgate serve` (default: one worker) on a fresh copy of the demo (12,000 patients)
with the demo's default config (audit on, ``execution.timing: deadline``), and again with
``timing: off``, and measures over HTTP:

- **single**: ``n`` distinct COUNT(*) / AVG(age) on ``patients`` one after another (each
  with its own ε, so none is a cache hit): median latency; the deadline padding (the
  server's ``dpgate_release_wait_seconds``, its mean per answer) is reported apart from
  the pipeline's own time;
- **dashboard**: 20 distinct charts on ``patients`` from one fresh analyst, fired at once
  (one connection each, released by a barrier): the wall time until the last answer, its
  median over ``dashboards`` runs;
- **examples**: the README's and the console's example queries, each 5 times: how many
  missed their deadline (``dpgate_deadline_misses_total``) or failed;
- **throughput**: 8 analysts in a closed loop for ``duration`` seconds each, distinct
  queries: answers per second, with the default config and with timing off.

Misses are read from the server's /metrics before and after each part. The machine's
load average is recorded next to every figure: this is a shared machine.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.bench_latency import start_server
from bench.common import RESULTS_DIR, latency_summary

CHARTS = [
    "SELECT COUNT(*) FROM patients",
    "SELECT AVG(age) FROM patients",
    "SELECT sex, COUNT(*) FROM patients GROUP BY sex",
    "SELECT disease, COUNT(*) FROM patients GROUP BY disease",
    "SELECT city, COUNT(*) FROM patients GROUP BY city",
    "SELECT smoker, COUNT(*) FROM patients GROUP BY smoker",
    "SELECT AVG(income) FROM patients",
    "SELECT city, SUM(income) FROM patients GROUP BY city",
    "SELECT SUM(income) FROM patients",
    "SELECT sex, AVG(age) FROM patients GROUP BY sex",
    "SELECT disease, AVG(age) FROM patients GROUP BY disease",
    "SELECT city, AVG(income) FROM patients GROUP BY city",
    "SELECT disease, AVG(income) FROM patients GROUP BY disease",
    "SELECT smoker, AVG(income) FROM patients GROUP BY smoker",
    "SELECT city, AVG(age) FROM patients GROUP BY city",
    "SELECT sex, AVG(income) FROM patients GROUP BY sex",
    "SELECT MEDIAN(age) FROM patients",
    "SELECT disease, SUM(income) FROM patients GROUP BY disease",
    "SELECT sex, SUM(glucose) FROM patients GROUP BY sex",
    "SELECT smoker, AVG(age) FROM patients GROUP BY smoker",
]
EXAMPLES = [
    "SELECT disease, COUNT(*) AS n FROM patients WHERE age >= 40 GROUP BY disease",
    "SELECT COUNT(*) FROM patients",
    "SELECT z.region, COUNT(*) AS n FROM patients p LEFT JOIN zip_regions z "
    "ON p.zip = z.zip GROUP BY z.region",
    "SELECT disease, COUNT(*) AS n FROM patients GROUP BY disease",
    "SELECT department, COUNT(*) FROM visits GROUP BY department",
]
THROUGHPUT_CLIENTS = 8


class Server:
    def __init__(self, root: Path, timing: str) -> None:
        self.proc, self.port, self.key = start_server(root, "refuse", timing)
        self._n = 0
        self._lock = threading.Lock()

    def analyst(self) -> str:
        """A fresh analyst (created through the admin API)."""
        with self._lock:
            self._n += 1
            name = f"a{self._n}-{os.getpid()}"
        status, body = self.call(
            "POST",
            "/v1/admin/analysts",
            {"name": name, "epsilon": 1e6, "delta": 1e-3},
            "bench-admin",
        )
        if status not in (200, 201):
            raise RuntimeError(f"{status}: {body}")
        return str(body["api_key"])

    def call(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None,
        key: str,
        conn: http.client.HTTPConnection | None = None,
    ) -> tuple[int, Any]:
        own = conn is None
        c = conn or http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            c.request(
                method,
                path,
                body=None if body is None else json.dumps(body),
                headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
            )
            resp = c.getresponse()
            data = resp.read()
            return resp.status, json.loads(data) if data[:1] in (b"{", b"[") else data
        finally:
            if own:
                c.close()

    def query(
        self, key: str, sql: str, epsilon: float, conn: http.client.HTTPConnection | None = None
    ) -> tuple[int, float, str]:
        t = time.perf_counter()
        status, body = self.call("POST", "/v1/query", {"sql": sql, "epsilon": epsilon}, key, conn)
        code = "" if status == 200 else body.get("error", {}).get("code", "")
        return status, time.perf_counter() - t, code

    def metrics(self) -> dict[str, float]:
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        c.request("GET", "/metrics")
        text = c.getresponse().read().decode()
        c.close()
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith(
                (
                    "dpgate_release_wait_seconds_sum",
                    "dpgate_release_wait_seconds_count",
                    "dpgate_deadline_misses_total",
                    "dpgate_statement_phase_seconds_sum",
                    "dpgate_statement_phase_seconds_count",
                )
            ):
                name, value = line.rsplit(" ", 1)
                out[name] = out.get(name, 0.0) + float(value)
        return out

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def _delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}


def _misses(d: dict[str, float]) -> float:
    return sum(v for k, v in d.items() if k.startswith("dpgate_deadline_misses_total"))


def _misses_by_stage(d: dict[str, float]) -> dict[str, float]:
    """Misses by stage (statement, turn, release): a late statement of a dashboard makes
    its analyst's later tickets miss their turn."""
    out: dict[str, float] = {}
    for k, v in d.items():
        if k.startswith("dpgate_deadline_misses_total") and v and 'stage="' in k:
            stage = k.split('stage="', 1)[1].split('"', 1)[0]
            out[stage] = out.get(stage, 0.0) + v
    return out


def _phases_ms(d: dict[str, float]) -> dict[str, float]:
    """Where the slotted statements' allowances went, mean ms per statement and phase
    (``dpgate_statement_phase_seconds``: queue — the statement's thread waiting for the
    interpreter and a CPU —, slot, run)."""
    out: dict[str, float] = {}
    for k, v in d.items():
        if k.startswith("dpgate_statement_phase_seconds_sum") and 'phase="' in k:
            phase = k.split('phase="', 1)[1].split('"', 1)[0]
            n = d.get(k.replace("_sum", "_count"), 0.0)
            if n:
                out[phase] = round(1e3 * v / n, 1)
    return out


def _padding_ms(d: dict[str, float]) -> float | None:
    n = d.get("dpgate_release_wait_seconds_count", 0.0)
    return 1e3 * d.get("dpgate_release_wait_seconds_sum", 0.0) / n if n else None


_eps_counter = iter(range(10**9))


def _epsilon() -> float:
    return 0.05 * (1 + next(_eps_counter) * 1e-7)  # distinct ε: never a cache hit


def single(server: Server, n: int) -> dict[str, Any]:
    key = server.analyst()
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    server.query(key, "SELECT COUNT(*) FROM patients", _epsilon(), conn)  # warm up
    before = server.metrics()
    times, failed = [], 0
    for i in range(n):
        sql = CHARTS[i % 2]
        status, seconds, _ = server.query(key, sql, _epsilon(), conn)
        if status == 200:
            times.append(seconds)
        else:
            failed += 1
    conn.close()
    d = _delta(server.metrics(), before)
    summary = latency_summary(times)
    padding = _padding_ms(d)
    return {
        "latency": summary,
        "padding_mean_ms": padding,
        "pipeline_median_ms": None if padding is None else summary["median_ms"] - padding,
        "failed": failed,
        "misses": _misses(d),
        "load": os.getloadavg()[0],
    }


def _fire(server: Server, key: str) -> tuple[float, list[tuple[int, float, str]]]:
    """Send every chart at once (one connection each, opened first); the wall time from
    the barrier to the last answer."""
    barrier = threading.Barrier(len(CHARTS))
    start = [0.0]

    def chart(sql: str) -> tuple[int, float, str]:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
        conn.connect()
        if barrier.wait() == 0:
            start[0] = time.perf_counter()
        try:
            return server.query(key, sql, _epsilon(), conn)
        finally:
            conn.close()

    with ThreadPoolExecutor(len(CHARTS)) as pool:
        done = list(pool.map(chart, CHARTS))
    return time.perf_counter() - start[0], done


def dashboard(server: Server, runs: int) -> dict[str, Any]:
    walls, codes, misses, paddings = [], [], 0.0, []
    stages: dict[str, float] = {}
    first = server.metrics()
    for _ in range(runs):
        key = server.analyst()
        before = server.metrics()
        wall, done = _fire(server, key)
        walls.append(wall)
        codes += [code for status, _, code in done if status != 200]
        d = _delta(server.metrics(), before)
        misses += _misses(d)
        for stage, n in _misses_by_stage(d).items():
            stages[stage] = stages.get(stage, 0.0) + n
        paddings.append(_padding_ms(d) or 0.0)
        time.sleep(0.5)
    return {
        "charts": len(CHARTS),
        "runs": runs,
        "wall_median_s": statistics.median(walls),
        "wall_s": walls,
        "padding_mean_ms": statistics.fmean(paddings),
        "failed": len(codes),
        "failed_codes": sorted(set(codes)),
        "misses": misses,
        "misses_by_stage": stages,
        "statement_phases_ms": _phases_ms(_delta(server.metrics(), first)),
        "load": os.getloadavg()[0],
    }


def examples(server: Server, reps: int = 5) -> dict[str, Any]:
    """Each example ``reps`` times, each time by a fresh analyst (one analyst asking them
    all, or one again, would meet the auditor, which is not what this part measures)."""
    keys = [[server.analyst() for _ in range(reps)] for _ in EXAMPLES]
    before = server.metrics()
    outcomes: dict[str, list[str]] = {}
    for sql, fresh in zip(EXAMPLES, keys, strict=True):
        for key in fresh:
            status, _, code = server.query(key, sql, 10 * _epsilon())  # ε 0.5, as the README
            outcomes.setdefault(sql, []).append("ok" if status == 200 else code)
    d = _delta(server.metrics(), before)
    return {
        "misses": _misses(d),
        "misses_by_stage": _misses_by_stage(d),
        "not_ok": {
            s: [o for o in v if o != "ok"] for s, v in outcomes.items() if any(o != "ok" for o in v)
        },
        "load": os.getloadavg()[0],
    }


def throughput(server: Server, duration: float) -> dict[str, Any]:
    keys = [server.analyst() for _ in range(THROUGHPUT_CLIENTS)]
    before = server.metrics()
    stop_at = time.monotonic() + duration

    def client(key: str) -> tuple[int, int]:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
        ok = bad = 0
        i = 0
        while time.monotonic() < stop_at:
            status, _, _ = server.query(key, CHARTS[i % len(CHARTS)], _epsilon(), conn)
            i += 1
            ok, bad = (ok + 1, bad) if status == 200 else (ok, bad + 1)
        conn.close()
        return ok, bad

    t = time.monotonic()
    with ThreadPoolExecutor(len(keys)) as pool:
        done = list(pool.map(client, keys))
    elapsed = time.monotonic() - t
    d = _delta(server.metrics(), before)
    return {
        "answered_per_s": sum(o for o, _ in done) / elapsed,
        "failed": sum(b for _, b in done),
        "misses": _misses(d),
        "misses_by_stage": _misses_by_stage(d),
        "statement_phases_ms": _phases_ms(d),
        "clients": len(keys),
        "load": os.getloadavg()[0],
    }


def run(n: int = 60, dashboards: int = 5, duration: float = 10.0) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="dpgate-dashboard-"))
    result: dict[str, Any] = {"load_before": os.getloadavg()}
    for timing in ("deadline", "off"):
        server = Server(root, timing)
        try:
            part: dict[str, Any] = {
                "single": single(server, n),
                "dashboard": dashboard(server, dashboards),
            }
            if timing == "deadline":
                part["examples"] = examples(server)
            part["throughput"] = throughput(server, duration)
        finally:
            server.stop()
        result[f"timing_{timing}"] = part
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--n", type=int, default=60)
    parser.add_argument("--dashboards", type=int, default=5)
    parser.add_argument("--duration", type=float, default=10.0)
    args = parser.parse_args()
    result = run(args.n, args.dashboards, args.duration)
    print(json.dumps(result, indent=2))
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    (RESULTS_DIR / "dashboard.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
