"""The front door's cost (issue 36): answered queries per second with 32 keep-alive
clients against ``dpgate serve --workers 2``, this checkout's front door (the main
thread reads each request whole before a pool thread takes it) against an earlier
commit's ``gateway/server/serve_workers.py``, in alternating rounds on one machine.

    python -m bench.front_door --baseline 8a0d9e7 --rounds 3 --duration 10

Each round starts a server from a copy of this checkout whose ``serve_workers.py`` is
either this one or the baseline's (``git show``), on the small deployment of
``tests/test_serve.py`` (300 rows, SQLite ledger, audit off; release timing turned off), and sends
distinct queries (each a ledger reserve + commit) for ``duration`` seconds. The load
generator shares the machine: the figures compare, they are not the server's ceiling.
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.adapter import LeanHttp
from bench.common import BENCH_DIR
from tests.test_serve import ADMIN_KEY, start, stop, write_deployment

REPO = BENCH_DIR.parent


def _checkout(baseline: str | None, into: Path) -> Path:
    """A copy of this checkout's gateway/budget/mechanisms, with the baseline's front door."""
    for package in ("gateway", "budget", "mechanisms"):
        shutil.copytree(REPO / package, into / package, dirs_exist_ok=True)
    if baseline is not None:
        old = subprocess.run(
            ["git", "show", f"{baseline}:gateway/server/serve_workers.py"],
            cwd=REPO,
            capture_output=True,
            check=True,
        ).stdout
        (into / "gateway" / "serve_workers.py").write_bytes(old)
    return into


def _round(code: Path, clients: int, duration: float) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="dpgate-door-"))
    config = write_deployment(root)
    with config.open("a") as f:  # the pipeline's own rate, not the release timing's
        f.write('execution: {timing: "off"}\n')
    server = start(root, config, workers=2, env={"PYTHONPATH": str(code)})
    try:
        keys = []
        for i in range(clients):
            status, _, body = server.call(
                "POST",
                "/v1/admin/analysts",
                {"name": f"c{i}", "epsilon": 1e9, "delta": 1e-6},
                ADMIN_KEY,
            )
            assert status == 201, body
            keys.append(body["api_key"])
        counter = itertools.count(1)
        answered = [0] * clients
        latencies: list[float] = []
        stop_at = time.monotonic() + duration

        def client(n: int) -> None:
            http = LeanHttp("127.0.0.1", server.port, keys[n])
            while time.monotonic() < stop_at:
                sql = f"SELECT COUNT(*) FROM patients WHERE age >= {next(counter) % 100}"
                began = time.monotonic()
                status, _ = http.query(sql, epsilon=0.01 + next(counter) * 1e-9)
                if status == 200:
                    answered[n] += 1
                    latencies.append(time.monotonic() - began)
            http.close()

        threads = [threading.Thread(target=client, args=(n,)) for n in range(clients)]
        began = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.monotonic() - began
        latencies.sort()
        return {
            "answered_per_s": round(sum(answered) / elapsed, 1),
            "p50_ms": round(1000 * latencies[len(latencies) // 2], 1) if latencies else None,
            "p99_ms": round(1000 * latencies[int(len(latencies) * 0.99)], 1) if latencies else None,
        }
    finally:
        stop(server)
        shutil.rmtree(root, ignore_errors=True)


def run(
    baseline: str, rounds: int = 3, duration: float = 10.0, clients: int = 32
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        new = _checkout(None, Path(tmp) / "new")
        old = _checkout(baseline, Path(tmp) / "old")
        results: dict[str, list[dict[str, Any]]] = {"front_door": [], "baseline": []}
        for _ in range(rounds):
            results["baseline"].append(_round(old, clients, duration))
            results["front_door"].append(_round(new, clients, duration))
    summary = {
        name: statistics.median(r["answered_per_s"] for r in runs) for name, runs in results.items()
    }
    return {"baseline_commit": baseline, "rounds": results, "median_answered_per_s": summary}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--baseline", required=True, help="the commit whose front door to compare")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--clients", type=int, default=32)
    a = p.parse_args()
    print(json.dumps(run(a.baseline, a.rounds, a.duration, a.clients), indent=2))


if __name__ == "__main__":
    main()
