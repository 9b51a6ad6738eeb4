"""Whether the PostgreSQL front end accepts connections now: what ``/readyz`` reports of it.

The front end runs in a process of its own (``gateway.server.serve``). ``dpgate serve`` gives
it a file to write the address it bound once listening (``python -m gateway.pgwire
--address-file``) and tells the HTTP workers where that file is (``ADDRESS_FILE_ENV``).
The probe then asks the front end itself, not just the kernel: it connects and sends an
SSLRequest, and the front end is ready when it answers one byte (``N``, ``S``, or an
ErrorResponse saying it is full) — a port merely bound, whose accept loop is not yet
running, answers nothing. Without the file (an app not started by ``dpgate serve``),
it probes ``127.0.0.1`` on the configured port.
"""

from __future__ import annotations

import os
import socket
import struct
from pathlib import Path

from gateway.core.config import Config
from gateway.pgwire import codec

ADDRESS_FILE_ENV = "DPGATE_PGWIRE_ADDRESS_FILE"
PROBE_TIMEOUT_S = 2.0


def wire_address(config: Config) -> tuple[str, int] | None:
    """Where the front end listens, as far as this process can tell (None: unknown)."""
    wire = config.postgres_wire
    if wire is None:
        return None
    path = os.environ.get(ADDRESS_FILE_ENV)
    if path:
        try:
            host, port = Path(path).read_text().split()
        except (OSError, ValueError):
            return None  # not written yet: the front end is not listening
        return _reachable(host), int(port)
    return ("127.0.0.1", wire.port) if wire.port else None


def wire_ready(config: Config) -> bool:
    """True when the front end answers a connection's first packet right now."""
    address = wire_address(config)
    if address is None:
        return False
    try:
        with socket.create_connection(address, timeout=PROBE_TIMEOUT_S) as sock:
            sock.sendall(struct.pack("!ii", 8, codec.SSL_REQUEST))
            return sock.recv(1) in (b"N", b"S", b"E")
    except OSError:
        return False


def _reachable(host: str) -> str:
    """A wildcard address is probed on the loopback of its family."""
    return {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
