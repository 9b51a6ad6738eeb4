"""One client connection's socket, read and written under deadlines that a client cannot stretch.

A client that is still logging in must finish by an absolute deadline
(``postgres_wire.authentication_timeout_s`` after the connection was accepted): every
read waits at most for what is left of it, so sending one byte at a time (slow loris)
does not keep the connection. A logged-in session that sends nothing for
``postgres_wire.idle_session_timeout_s`` is idle and is closed; a session's write waits
at most ``WRITE_TIMEOUT_S`` for a client that stopped reading.

Reads are buffered here (one ``recv`` per 64 KiB), not by ``socket.makefile``, so the
buffer is ours to inspect: bytes that arrive after an SSLRequest and before the TLS
handshake would be read as if they came through TLS (CVE-2021-23214 in PostgreSQL), and
``encrypt`` refuses them.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import time

from gateway.pgwire import codec

#: How long one write may wait for a client that does not read (a result is ≤ 16 MiB).
WRITE_TIMEOUT_S = 60.0
RECV_BYTES = 64 * 1024


class AuthenticationTimeout(codec.ConnectionClosed):
    """The client did not finish logging in by its deadline."""


class IdleSessionTimeout(codec.ConnectionClosed):
    """A logged-in client sent nothing for the idle-session timeout."""


class Link:
    """A connection's socket (replaced when TLS starts) and its read buffer."""

    def __init__(self, conn: socket.socket, login_deadline: float) -> None:
        self.raw = conn
        self.sock: socket.socket = conn
        self._buffer = bytearray()
        self._login_deadline: float | None = login_deadline
        self._idle_timeout: float | None = None

    def logged_in(self, idle_timeout_s: float) -> None:
        """The login deadline no longer applies; idleness does (0: never closed)."""
        self._login_deadline = None
        self._idle_timeout = idle_timeout_s if idle_timeout_s > 0 else None

    # -- reading (the ``codec.ByteSource`` protocol) ---------------------------------------

    def read(self, n: int) -> bytes:
        """Up to ``n`` bytes (fewer only when some are buffered); ``b""`` at the end."""
        if not self._buffer:
            self._fill()
        out = bytes(self._buffer[:n])
        del self._buffer[:n]
        return out

    def _fill(self) -> None:
        if self._login_deadline is not None:
            left = self._login_deadline - time.monotonic()
            if left <= 0:
                raise AuthenticationTimeout()
            self.sock.settimeout(left)
        else:
            self.sock.settimeout(self._idle_timeout)
        try:
            chunk = self.sock.recv(RECV_BYTES)
        except TimeoutError:
            if self._login_deadline is not None:
                raise AuthenticationTimeout() from None
            raise IdleSessionTimeout() from None
        self._buffer += chunk

    # -- writing ---------------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        if self._login_deadline is not None:
            timeout = max(0.001, self._login_deadline - time.monotonic())
        else:
            timeout = WRITE_TIMEOUT_S
        self.sock.settimeout(timeout)
        self.sock.sendall(data)

    def try_write(self, data: bytes) -> None:
        """Send a last word (a FATAL error) if the client takes it at once; never raises."""
        with contextlib.suppress(OSError, ValueError):
            self.sock.settimeout(0.5)
            self.sock.sendall(data)

    # -- TLS and the end -------------------------------------------------------------------

    def encrypt(self, context: ssl.SSLContext) -> None:
        """Start TLS (after answering an SSLRequest with ``S``)."""
        if self._buffer:
            raise codec.ProtocolViolation(
                "received unencrypted data after the SSL request (possible man-in-the-middle)"
            )
        if self._login_deadline is not None:
            self.raw.settimeout(max(0.001, self._login_deadline - time.monotonic()))
        self.sock = context.wrap_socket(self.raw, server_side=True)

    def cut(self) -> None:
        """End the connection from another thread: the owner's blocked read returns."""
        with contextlib.suppress(OSError):
            self.raw.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        """Close for real, so that a client waiting for the end (libpq's cancel) sees it."""
        for close in (
            lambda: self.sock.shutdown(socket.SHUT_RDWR),
            self.sock.close,
            self.raw.close,
        ):
            with contextlib.suppress(OSError, ValueError):
                close()
