"""The PostgreSQL front end's connection slots under attack: no lock-out without a key.

The attack (issue 35): open many more TCP connections than ``max_connections`` to the
wire port and send nothing, half a startup packet, or a startup packet one byte at a
time, reopening whatever the server closes. Before, that made every analyst's login
fail with "too many clients" for as long as the attacker kept it up. The flood runs in
a process of its own (``tests/pgwire_flood.py``: loopback only, bounded in time and
count), from loopback source addresses other than the analyst's, while the analyst
logs in with psycopg and psql.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from gateway.ops import metrics
from gateway.pgwire.server import WireServer
from tests.conftest import wire_connect

FLOOD = Path(__file__).with_name("pgwire_flood.py")
#: The acceptance bound on an analyst's login while the flood runs (issue 35). On a
#: loaded 2-core machine a plain psql against a real PostgreSQL has taken 10 s once, so
#: the bound is on the median of the logins; every one of them must succeed, none may
#: take 5 s.
LOGIN_BOUND_S = 1.0


def _refused(reason: str) -> float:
    return float(metrics.WIRE_REFUSED.labels(reason)._value.get())


def _timeouts(kind: str) -> float:
    return float(metrics.WIRE_TIMEOUTS.labels(kind)._value.get())


def test_a_flood_of_idle_half_open_and_slow_connections_leaves_logins_answered(
    serve_wire: Callable[..., tuple[WireServer, int, str]],
) -> None:
    max_connections = 4
    server, port, key = serve_wire(
        {
            "max_connections": max_connections,
            "authentication_timeout_s": 1.5,
            "max_authenticating": 8,
            "max_authenticating_per_address": 4,
        }
    )
    refused_before = {r: _refused(r) for r in ("authenticating_per_address", "evicted")}
    # 10 × max_connections idle connections from each of three addresses, plus half-open
    # and slow ones: together they fill the per-address caps and the total, and the
    # three displace one another's pending connections all the time.
    flood = subprocess.Popen(
        [sys.executable, str(FLOOD), str(port), "8", "127.0.0.2", "127.0.0.3", "127.0.0.4",
         "--idle", str(10 * max_connections), "--half", "8", "--slow", "8",
         "--drip-s", "0.1", "--max-opened", "20000"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    logins: list[float] = []
    raw: list[float] = []  # psql's without its own start subtracted
    try:
        time.sleep(2.0)  # the flood is at full strength, past one authentication timeout
        psql = shutil.which("psql")
        for i in range(6):
            own_start = 0.0
            if psql is not None and i % 2 == 1:
                # psql's own start (a process, its libraries) is not the server's answer:
                # measured just before, by the same binary doing no connection, it is
                # subtracted (0.3 s on this 2-core machine under load).
                started = time.monotonic()
                subprocess.run([psql, "--version"], capture_output=True, timeout=30)
                own_start = time.monotonic() - started
            started = time.monotonic()
            if psql is not None and i % 2 == 1:
                out = subprocess.run(
                    [psql, f"host=127.0.0.1 port={port} user=alice dbname=dpgate "
                     "sslmode=disable connect_timeout=10", "-X", "-At", "-c", "SELECT 1"],
                    capture_output=True, text=True, timeout=30,
                    env={**os.environ, "PGPASSWORD": key},
                )  # fmt: skip
                assert out.returncode == 0 and out.stdout.strip() == "1", out.stderr
            else:
                with wire_connect(port, key) as conn:
                    assert conn.execute("SELECT 1").fetchone() == (1,)
            raw.append(time.monotonic() - started)
            logins.append(max(0.0, raw[-1] - own_start))
            time.sleep(0.3)
        # Sessions hold slots of their own: max_connections analysts at once, mid-flood.
        sessions = [wire_connect(port, key) for _ in range(max_connections)]
        try:
            for conn in sessions:
                assert conn.execute("SELECT 1").fetchone() == (1,)
        finally:
            for conn in sessions:
                conn.close()
    finally:
        out, _ = flood.communicate(timeout=60)
    seen = json.loads(out)
    print(
        "logins under the flood (s):", [round(x, 3) for x in logins],
        "raw:", [round(x, 3) for x in raw], "flood:", out,
    )  # fmt: skip
    assert sorted(logins)[len(logins) // 2] <= LOGIN_BOUND_S, logins
    assert max(logins) < 5.0, logins  # none waited out a timeout: no lock-out at all
    # The flood was real: more connections than slots, most refused at once, pending
    # ones displaced, slow ones cut at the authentication deadline however they dripped.
    assert seen["opened"] >= 10 * max_connections, seen
    assert _refused("authenticating_per_address") > refused_before["authenticating_per_address"]
    assert _refused("evicted") > refused_before["evicted"]
    # seen from the flood process, which notices a close only when it gets the CPU: well
    # under the 8 s the flood lasts (a per-read timeout would let them live that long)
    assert seen["slow_cut"] > 0 and seen["slow_longest_s"] < 1.5 + 3.0, seen
    # When the flood has gone, so have its slots.
    deadline = time.monotonic() + 5
    while server.admission.counts() != (0, 0) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.admission.counts() == (0, 0)


def test_sessions_beyond_max_connections_are_refused_after_login_and_slots_come_back(
    serve_wire: Callable[..., tuple[WireServer, int, str]],
) -> None:
    _, port, key = serve_wire({"max_connections": 2})
    first, second = (
        wire_connect(port, key),
        wire_connect(port, key),
    )
    with pytest.raises(psycopg.OperationalError, match="too many clients"):
        wire_connect(port, key)
    second.close()
    with wire_connect(port, key) as third:
        assert third.execute("SELECT 1").fetchone() == (1,)
    first.close()


def test_an_idle_session_is_closed_after_the_configured_timeout(
    serve_wire: Callable[..., tuple[WireServer, int, str]],
) -> None:
    server, port, key = serve_wire({"idle_session_timeout_s": 0.8})
    before = _timeouts("idle_session")
    with wire_connect(port, key) as busy:  # the honest session: never idle that long
        for _ in range(8):
            assert busy.execute("SELECT 1").fetchone() == (1,)
            time.sleep(0.25)
    idle = wire_connect(port, key)
    assert idle.execute("SELECT 1").fetchone() == (1,)
    time.sleep(1.6)
    with pytest.raises(psycopg.OperationalError, match="idle-session timeout"):
        idle.execute("SELECT 1")
    idle.close()
    assert _timeouts("idle_session") == before + 1
    assert server.admission.counts() == (0, 0)


def test_a_slow_startup_is_cut_at_the_authentication_deadline(
    serve_wire: Callable[..., tuple[WireServer, int, str]],
) -> None:
    """One byte every 0.2 s never ends a read's wait, yet the connection ends on time."""
    import socket
    import struct

    _, port, _ = serve_wire({"authentication_timeout_s": 1.0})
    timeouts_before = _timeouts("authentication")
    body = b"user\0alice\0database\0dpgate\0\0"
    packet = struct.pack("!ii", 8 + len(body), 196608) + body
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    started = time.monotonic()
    ended = None
    try:
        for byte in packet[:-1]:
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                ended = time.monotonic() - started
                break
            sock.settimeout(0.2)
            try:
                if sock.recv(1) == b"":
                    ended = time.monotonic() - started
                    break
            except TimeoutError:
                pass
            except OSError:
                ended = time.monotonic() - started
                break
    finally:
        sock.close()
    assert ended is not None and 0.9 <= ended < 2.0, ended
    deadline = time.monotonic() + 5
    while _timeouts("authentication") == timeouts_before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _timeouts("authentication") == timeouts_before + 1


def test_the_slot_settings_are_checked_when_the_config_loads(tmp_path: Path) -> None:
    from gateway.core.config import ConfigError
    from gateway.core.config_load import parse_config
    from tests.conftest import demo_config_dict

    def wire(**keys: Any) -> Any:
        raw = demo_config_dict(tmp_path / "d.db", tmp_path / "l.db", postgres_wire=keys)
        return parse_config(raw).postgres_wire

    defaults = wire(port=15433)
    assert (defaults.max_connections, defaults.authentication_timeout_s) == (64, 10.0)
    assert (defaults.max_authenticating, defaults.max_authenticating_per_address) == (32, 8)
    assert defaults.idle_session_timeout_s == 600.0
    assert wire(port=15433, idle_session_timeout_s=0).idle_session_timeout_s == 0.0
    for keys, problem in [
        ({"authentication_timeout_s": 0}, "authentication_timeout_s: must be > 0"),
        ({"idle_session_timeout_s": -1}, "idle_session_timeout_s: must be ≥ 0"),
        ({"max_authenticating": 0}, "max_authenticating: must be ≥ 1"),
        (
            {"max_authenticating": 4, "max_authenticating_per_address": 5},
            "max_authenticating_per_address: must be ≤ max_authenticating",
        ),
        ({"login_timeout": 3}, "login_timeout"),
    ]:
        with pytest.raises(ConfigError) as info:
            wire(port=15433, **keys)
        assert any(problem in p for p in info.value.problems), (keys, info.value.problems)
    # a small total lowers the per-address default with it
    assert wire(port=15433, max_authenticating=4).max_authenticating_per_address == 4
