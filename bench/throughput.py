"""Throughput: answered queries per second over HTTP against ``dpgate serve --workers N``.

The server serves PUMS (SQLite) with a fresh SQLite ledger; each client thread is its own
analyst (created in the ledger before the server starts) on a keep-alive connection.
Scenarios of a fixed duration each:

- ``distinct``: every request is a new query (``… WHERE income >= <i>`` with a unique i),
  so each one is a full pipeline run with a durable ledger reserve + commit;
- ``distinct_fixed_rate``: the same queries offered at a fixed 300 requests/s in all
  (open loop, each client on its own schedule), latency counted from each request's
  scheduled moment: the latency at that load, where the closed loop's median is the wait
  of 32 clients queueing at saturation (``mean = clients / rate``);
- ``repeated``: every thread repeats one query, so all but its first request are cache
  hits (free, no ledger charge).

The load generator runs on the same machine (stdlib threads, so it takes CPU from the
server's workers on a small machine): the figures are a lower bound of the server's rate.
It speaks just enough HTTP/1.1 over raw sockets (``bench.adapter.LeanHttp``) to take as
little of that CPU as it can.
Each scenario starts once the other processes of the machine are quiet (an earlier part's
database may still be vacuuming or checkpointing what it loaded) and reports the share of
CPU they took while it ran (``other_cpu_share``), beside the hypervisor's (``steal_share``).
"""

from __future__ import annotations

import contextlib
import http.client
import itertools
import os
import signal
import socket
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from bench.adapter import LeanHttp, create_analyst
from bench.common import BENCH_DIR, DATA_DIR, latency_summary, log
from bench.pums import setup

REPO = BENCH_DIR.parent
#: Before each scenario: wait (at most QUIET_TIMEOUT_S) until other processes use less
#: than QUIET_SHARE of the CPUs; each scenario reports that share while it ran.
QUIET_SHARE = 0.10
QUIET_TIMEOUT_S = 120.0
#: The rate the fixed-rate scenario offers: issue 14's "300 answered/s".
FIXED_RATE = 300.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _dpgate_bin() -> list[str]:
    import sys

    exe = Path(sys.executable).with_name("dpgate")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "gateway.cli"]


def _wait_ready(port: int, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"dpgate serve exited with code {proc.returncode}")
        with contextlib.suppress(OSError, http.client.HTTPException):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/healthz")
            if conn.getresponse().status == 200:
                return
        time.sleep(0.2)
    raise RuntimeError("dpgate serve did not become ready")


def _group_cpu_s(pgid: int) -> float | None:
    """CPU seconds (user + system) used so far by the live processes of a process group
    (Linux ``/proc``; ``None`` elsewhere)."""
    proc = Path("/proc")
    if not proc.is_dir():
        return None
    ticks = 0
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        fields = stat.rpartition(")")[2].split()  # after the command: state ppid pgrp …
        if len(fields) > 12 and int(fields[2]) == pgid:
            ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


def _cpu_ticks() -> tuple[int, int, int] | None:
    """(all, stolen, busy) CPU time of the machine so far, in ticks (``/proc/stat``):
    stolen is, on a virtual machine, the time the hypervisor gave this machine's CPUs to
    others; busy is every tick that was neither idle nor waiting for I/O."""
    try:
        first = Path("/proc/stat").read_text().splitlines()[0].split()
    except OSError:
        return None
    values = [int(v) for v in first[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return sum(values[:8]), (values[7] if len(values) > 7 else 0), sum(values[:8]) - idle


def _readings(pgid: int) -> tuple[float | None, float, tuple[int, int, int] | None]:
    """The server group's CPU seconds, this process's, and the machine's CPU ticks: what
    ``_costs`` and ``_other_share`` compare between two moments."""
    return _group_cpu_s(pgid), time.process_time(), _cpu_ticks()


def _wait_until_quiet(
    pgid: int, share: float = QUIET_SHARE, timeout: float = QUIET_TIMEOUT_S
) -> float:
    """Wait until the processes other than the server (its process group) and this one
    use less than ``share`` of the machine's CPUs over a second — an earlier part's
    leftovers (a database vacuuming or checkpointing the rows it loaded) would otherwise
    be measured as the server's latency — or ``timeout`` seconds; return the wait."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        before = _readings(pgid)
        time.sleep(1.0)
        after = _readings(pgid)
        other = _other_share(before, after)
        if other is None or other < share:
            break
    return time.monotonic() - started


def _other_share(before: tuple[Any, float, Any], after: tuple[Any, float, Any]) -> float | None:
    """The share of the machine's CPU time that processes other than the server and the
    load generator used between two readings (``None`` without ``/proc``)."""
    if before[0] is None or after[0] is None or before[2] is None or after[2] is None:
        return None
    tick = os.sysconf("SC_CLK_TCK")
    total = (after[2][0] - before[2][0]) / tick
    if total <= 0:
        return None
    busy = (after[2][2] - before[2][2]) / tick
    ours = (after[0] - before[0]) + (after[1] - before[1])
    return max(0.0, busy - ours) / total


def _costs(
    pgid: int, answered: int, before: tuple[Any, float, Any], after: tuple[Any, float, Any]
) -> dict[str, Any]:
    """CPU per answer of the server (its process group) and of the load generator (this
    process), and the share of CPU time stolen by the hypervisor: what makes figures of
    different machines comparable (the rate alone is not)."""
    out: dict[str, Any] = {}
    if answered and before[0] is not None and after[0] is not None:
        out["server_cpu_ms_per_answer"] = (after[0] - before[0]) * 1000 / answered
    if answered:
        out["client_cpu_ms_per_answer"] = (after[1] - before[1]) * 1000 / answered
    if before[2] is not None and after[2] is not None and after[2][0] > before[2][0]:
        out["steal_share"] = (after[2][1] - before[2][1]) / (after[2][0] - before[2][0])
    other = _other_share(before, after)
    if other is not None:
        out["other_cpu_share"] = other
    return out


def _scenario(
    port: int,
    keys: list[str],
    duration: float,
    make_sql: Any,
    pgid: int,
    rate: float | None = None,
) -> dict[str, Any]:
    """Every client sends ``make_sql(i)`` for ``duration`` seconds: as soon as it has its
    previous answer (closed loop), or, with ``rate``, on a fixed schedule — the clients
    together offer ``rate`` requests a second, client ``i`` at ``(k + i / n) · n / rate``
    — and each latency then counts from the request's scheduled moment, so a request the
    client could only send late (its previous answer was slow) counts its wait too."""
    quiet_wait = _wait_until_quiet(pgid)
    begin = time.monotonic() + 0.1  # every thread is running by then
    stop = begin + duration
    lock = threading.Lock()
    late = [0]
    latencies: list[float] = []
    outcomes: Counter[str] = Counter()

    def client(i: int, key: str) -> None:
        h = LeanHttp("127.0.0.1", port, key)
        local_lat: list[float] = []
        local: Counter[str] = Counter()
        period = len(keys) / rate if rate else 0.0
        due = begin + i / rate if rate else begin
        behind = 0
        while (now := time.monotonic()) < stop and due < stop:
            if now < due:
                time.sleep(due - now)
            elif rate:
                behind += 1
            sql = make_sql(i)
            t = due if rate else time.monotonic()
            due += period
            try:
                status, body = h.query(sql, 1.0)
            except Exception as e:
                local[f"transport:{type(e).__name__}"] += 1
                continue
            dt = time.monotonic() - t
            if status == 200 and body.get("ok"):
                local["answered_cached" if body.get("cached") else "answered"] += 1
                local_lat.append(dt)
            else:
                local[f"{status}:{body.get('error', {}).get('code', '?')}"] += 1
        with lock:
            latencies.extend(local_lat)
            outcomes.update(local)
            late[0] += behind

    before = _readings(pgid)
    threads = [threading.Thread(target=client, args=(i, k)) for i, k in enumerate(keys)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    after = _readings(pgid)
    elapsed = time.monotonic() - begin
    answered = outcomes["answered"] + outcomes["answered_cached"]
    paced = {"offered_per_s": rate, "sent_late": late[0]} if rate else {}
    return {
        **paced,
        "duration_s": elapsed,
        "answered": answered,
        "answered_per_s": answered / elapsed,
        "outcomes": dict(outcomes),
        "latency": latency_summary(latencies),
        "quiet_wait_s": quiet_wait,
        **_costs(pgid, answered, before, after),
    }


def _pums_config(workdir: Path, ledger_url: str | None, timing: str) -> Path:
    """PUMS in SQLite and a dpgate config on a fresh ledger (SQLite unless given)."""
    import yaml

    cfg = setup(workdir)  # fresh SQLite ledger, timing off
    raw = yaml.safe_load(cfg.read_text())
    if ledger_url is not None:
        raw["ledger"]["url"] = ledger_url
    raw["execution"] = {"timing": timing}
    cfg.write_text(yaml.safe_dump(raw, sort_keys=False))
    return cfg


@contextlib.contextmanager
def _postgres_ledger() -> Any:
    """A ledger URL on a fresh schema of the benchmark's PostgreSQL server (or None)."""
    import uuid

    import sqlalchemy as sa

    from bench.datagen import PG_URL

    schema = "dpgate_bench_tp_" + uuid.uuid4().hex[:8]
    engine = sa.create_engine(PG_URL, connect_args={"connect_timeout": 3})
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql(f"CREATE SCHEMA {schema}")
    except Exception as e:  # no server: the PostgreSQL figures are skipped
        log(f"throughput: PostgreSQL ledger skipped ({type(e).__name__})")
        yield None
        return
    sep = "&" if "?" in PG_URL else "?"
    try:
        yield f"{PG_URL}{sep}options=-csearch_path%3D{schema}"
    finally:
        with engine.begin() as conn:
            conn.exec_driver_sql(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        engine.dispose()


def _serve(
    workdir: Path, cfg: Path, workers: int, clients: int, scenarios: dict[str, Any], duration: float
) -> dict[str, Any]:
    from gateway.core.config_load import load_config

    ledger_url = load_config(cfg).ledger.url
    keys = [create_analyst(ledger_url, f"load{i}") for i in range(clients)]
    port = _free_port()
    cmd = [
        *_dpgate_bin(),
        "serve",
        "--config",
        str(cfg),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        str(workers),
    ]
    log(f"throughput: {' '.join(cmd)}")
    logf = (workdir / "serve.log").open("wb")
    proc = subprocess.Popen(
        cmd, cwd=REPO, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True
    )
    out: dict[str, Any] = {"command": " ".join(cmd)}
    try:
        _wait_ready(port, proc)
        for name, spec in scenarios.items():
            make_sql, rate = spec if isinstance(spec, tuple) else (spec, None)
            out[name] = _scenario(port, keys, duration, make_sql, proc.pid, rate)
            log(f"throughput {name}: {out[name]['answered_per_s']:.1f}/s {out[name]['outcomes']}")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        logf.close()
    return out


def run(duration: float = 20.0, workers: int = 2, clients: int = 32) -> dict[str, Any]:
    """Three servers, one after the other, each on a fresh ledger:

    - SQLite ledger, release timing off: distinct queries (closed loop, then offered at
      ``FIXED_RATE``), then a repeated query — the pipeline's own throughput (the
      acceptance figures);
    - PostgreSQL ledger, release timing off: distinct queries;
    - SQLite ledger, the default release timing (``deadline``): distinct queries — what
      the side-channel padding (every answer leaves at its release moment) does to the
      same load, reported apart from pipeline time.
    """
    workdir = DATA_DIR / "throughput-run"
    counter = itertools.count(1)

    def distinct(i: int) -> str:
        return f"SELECT COUNT(*) AS n FROM pums WHERE income >= {next(counter)}"

    def repeated(i: int) -> str:
        return "SELECT sex, COUNT(*) AS n FROM pums WHERE age >= 18 GROUP BY sex"

    result: dict[str, Any] = {"workers": workers, "clients": clients}
    sqlite_off = _serve(
        workdir,
        _pums_config(workdir, None, "off"),
        workers,
        clients,
        {
            "distinct": distinct,
            "distinct_fixed_rate": (distinct, FIXED_RATE),
            "repeated": repeated,
        },
        duration,
    )
    result["command"] = sqlite_off.pop("command")
    result.update(sqlite_off)
    with _postgres_ledger() as pg_url:
        if pg_url is not None:
            pg = _serve(
                workdir,
                _pums_config(workdir, pg_url, "off"),
                workers,
                clients,
                {"distinct": distinct},
                duration,
            )
            result["postgres_ledger"] = pg["distinct"]
    padded = _serve(
        workdir,
        _pums_config(workdir, None, "deadline"),
        workers,
        clients,
        {"distinct": distinct},
        duration,
    )
    result["deadline_timing"] = padded["distinct"]
    return result
