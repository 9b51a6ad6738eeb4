"""A connection flood against a PostgreSQL front end on this machine (tests/test_pgwire_slots.py).

``python tests/pgwire_flood.py PORT SECONDS SOURCE...`` keeps, from each loopback source
address, ``--idle`` connections that send nothing, ``--half`` that send half a startup
packet and stop, and ``--slow`` that send a startup packet one byte every
``--drip-s`` seconds (slow loris); whatever the server closes is reopened at once (up
to ``--rate`` new connections a second, so that the flood's own CPU does not starve the
2-core machine the test runs on: an attacker would use a machine of its own). It
stops by itself after SECONDS or ``--max-opened`` connections, and prints what it saw
as one JSON line. It only ever connects to 127.0.0.1.
"""

from __future__ import annotations

import argparse
import json
import select
import socket
import struct
import time

TARGET = "127.0.0.1"
_PARAMETERS = b"user\0alice\0database\0dpgate\0\0"
STARTUP = struct.pack("!ii", 8 + len(_PARAMETERS), 196608) + _PARAMETERS


class _Conn:
    def __init__(self, sock: socket.socket, kind: str) -> None:
        self.sock = sock
        self.kind = kind
        self.opened = time.monotonic()
        self.sent = 0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("port", type=int)
    parser.add_argument("seconds", type=float)
    parser.add_argument("sources", nargs="+")
    parser.add_argument("--idle", type=int, default=40)
    parser.add_argument("--half", type=int, default=10)
    parser.add_argument("--slow", type=int, default=10)
    parser.add_argument("--drip-s", type=float, default=0.2)
    parser.add_argument("--max-opened", type=int, default=5000)
    parser.add_argument("--rate", type=float, default=300.0, help="new connections per second")
    args = parser.parse_args()
    for source in args.sources:
        if not source.startswith("127."):
            raise SystemExit("the flood only runs on the loopback range")
    wanted = {"idle": args.idle, "half": args.half, "slow": args.slow}
    conns: dict[str, list[_Conn]] = {s: [] for s in args.sources}
    opened = refused = closed = failed = 0
    slow_lifetimes: list[float] = []
    deadline = time.monotonic() + args.seconds
    last_drip = 0.0
    started = time.monotonic()
    while time.monotonic() < deadline and opened < args.max_opened:
        allowed = int((time.monotonic() - started) * args.rate) + sum(wanted.values())
        for source, mine in conns.items():
            for kind, n in wanted.items():
                have = sum(1 for c in mine if c.kind == kind)
                for _ in range(n - have):
                    if opened >= min(args.max_opened, allowed * len(conns)):
                        break
                    try:
                        sock = socket.create_connection(
                            (TARGET, args.port), timeout=1.0, source_address=(source, 0)
                        )
                    except OSError:
                        failed += 1
                        continue
                    opened += 1
                    conn = _Conn(sock, kind)
                    if kind == "half":
                        sock.sendall(STARTUP[: len(STARTUP) // 2])
                    mine.append(conn)
        now = time.monotonic()
        if now - last_drip >= args.drip_s:
            last_drip = now
            for mine in conns.values():
                for conn in mine:
                    if conn.kind == "slow" and conn.sent < len(STARTUP) - 1:
                        try:  # never the last byte: the packet stays incomplete
                            conn.sock.send(STARTUP[conn.sent : conn.sent + 1])
                            conn.sent += 1
                        except OSError:
                            pass
        everyone = [c for mine in conns.values() for c in mine]
        readable, _, _ = select.select([c.sock for c in everyone], [], [], 0.02)
        gone = set()
        for sock in readable:
            try:
                data = sock.recv(4096)
            except OSError:
                data = b""
            if data.startswith(b"E") and b"53300" in data:
                refused += 1
            else:
                closed += 1
            gone.add(sock)
        for source, mine in conns.items():
            for conn in mine:
                if conn.sock in gone:
                    if conn.kind == "slow":
                        slow_lifetimes.append(time.monotonic() - conn.opened)
                    conn.sock.close()
            conns[source] = [c for c in mine if c.sock not in gone]
    held = sum(len(m) for m in conns.values())
    for mine in conns.values():
        for conn in mine:
            conn.sock.close()
    print(
        json.dumps(
            {
                "opened": opened,
                "refused": refused,
                "closed": closed,
                "failed": failed,
                "held_at_end": held,
                "slow_cut": len(slow_lifetimes),
                "slow_longest_s": round(max(slow_lifetimes, default=0.0), 2),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
