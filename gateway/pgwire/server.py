"""The PostgreSQL front end's listener: one thread per connection, TLS, cancel requests.

``WireServer(config, gateway)`` owns the emulated catalogue and the registry of live
sessions (for CancelRequest). ``serve_forever`` accepts connections on
``postgres_wire.port``; at most ``postgres_wire.max_connections`` are served at once
(more get SQLSTATE 53300 and are closed), and each must finish its startup and login
within ``LOGIN_TIMEOUT_S``.

``dpgate serve`` runs it in a process of its own beside the HTTP workers
(``python -m gateway.pgwire``, see ``gateway.serve``), with its own ``Gateway`` on the
same config and ledger: budgets, cache, audit and rate limits are shared through the
ledger exactly as between HTTP workers.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import socket
import ssl
import threading
from typing import BinaryIO

from gateway.config import Config
from gateway.pgwire import codec
from gateway.pgwire.catalog import Catalog
from gateway.pgwire.observe import Observer
from gateway.pgwire.session import Session
from gateway.pipeline import Gateway

log = logging.getLogger("dpgate.pgwire")
LOGIN_TIMEOUT_S = 30.0


class WireServer:
    """Serves one config's gateway over the PostgreSQL protocol."""

    def __init__(self, config: Config, gateway: Gateway | None = None) -> None:
        wire = config.postgres_wire
        if wire is None:
            raise ValueError("the config has no postgres_wire section")
        self.config = config
        self.wire = wire
        self.gateway = gateway or Gateway(config)
        self.catalog = Catalog(self.gateway.config)
        self.observe = Observer(self.gateway, config)
        self.tls: ssl.SSLContext | None = None
        if wire.tls is not None:
            self.tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            self.tls.minimum_version = ssl.TLSVersion.TLSv1_2
            self.tls.load_cert_chain(str(wire.tls.cert), str(wire.tls.key))
        self._sessions: dict[int, Session] = {}
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(wire.max_connections)
        self._listener: socket.socket | None = None
        self._stopped = threading.Event()

    # -- sessions --------------------------------------------------------------------------

    def register(self, session: Session) -> tuple[int, int]:
        """A fresh (process id, secret) pair for a session's BackendKeyData."""
        with self._lock:
            while True:
                pid = secrets.randbelow(2**31 - 2) + 1
                if pid not in self._sessions:
                    break
            self._sessions[pid] = session
        return pid, secrets.randbits(31)

    def _unregister(self, session: Session) -> None:
        with self._lock:
            if self._sessions.get(session.process_id) is session:
                del self._sessions[session.process_id]

    def _cancel(self, request: codec.CancelRequest) -> None:
        with self._lock:
            session = self._sessions.get(request.process_id)
        if session is not None and session.secret_matches(request.secret):
            session.cancel()

    # -- listening -------------------------------------------------------------------------

    def bind(self, host: str) -> tuple[str, int]:
        """Open the listening socket; returns the address actually bound."""
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, self.wire.port))
        listener.listen(128)
        self._listener = listener
        address = listener.getsockname()
        return str(address[0]), int(address[1])

    def serve_forever(self) -> None:
        listener = self._listener
        if listener is None:
            raise RuntimeError("call bind() first")
        while not self._stopped.is_set():
            try:
                conn, address = listener.accept()
            except OSError:
                if self._stopped.is_set():
                    return
                raise
            thread = threading.Thread(target=self.handle, args=(conn, str(address[0])), daemon=True)
            thread.start()

    def shutdown(self) -> None:
        self._stopped.set()
        self.catalog.close()
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.close()

    # -- one connection ----------------------------------------------------------------

    def handle(self, conn: socket.socket, peer: str) -> None:
        """Serve one accepted connection until it ends; never raises."""
        if not self._slots.acquire(blocking=False):
            with contextlib.suppress(OSError):
                conn.sendall(
                    codec.error_response(
                        "53300", "sorry, too many clients already", severity="FATAL"
                    )
                )
            conn.close()
            return
        link = _Link(conn)
        session: Session | None = None
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.settimeout(LOGIN_TIMEOUT_S)
            startup = self._startup(link)
            if startup is None:
                return
            sock = link.sock
            session = Session(self, link.stream, sock.sendall, peer)
            # The login must finish in time; afterwards a connection may idle (BI pools).
            session.serve(startup, on_login=lambda: sock.settimeout(None))
            session.flush()
        except (codec.ConnectionClosed, OSError, ssl.SSLError):
            pass
        except codec.ProtocolViolation as e:
            with contextlib.suppress(OSError):
                link.sock.sendall(codec.error_response("08P01", str(e), severity="FATAL"))
        except Exception:
            log.error("pgwire connection failed", exc_info=True)
        finally:
            if session is not None:
                self._unregister(session)
            link.close()
            self._slots.release()

    def _startup(self, link: _Link) -> codec.Startup | None:
        """Read startup packets (answering SSL/GSS requests) until a real startup."""
        encrypted = False
        for _ in range(3):
            packet = codec.read_startup(link.stream)
            if isinstance(packet, codec.CancelRequest):
                self._cancel(packet)
                return None
            if isinstance(packet, codec.GssEncRequest):
                link.sock.sendall(b"N")
                continue
            if isinstance(packet, codec.SslRequest):
                if self.tls is None or encrypted:
                    link.sock.sendall(b"N")
                    continue
                link.sock.sendall(b"S")
                link.encrypt(self.tls)
                encrypted = True
                continue
            if self.wire.tls is not None and self.wire.tls.require and not encrypted:
                link.sock.sendall(
                    codec.error_response(
                        "28000",
                        "this dpgate accepts PostgreSQL clients over TLS only (sslmode=require)",
                        severity="FATAL",
                    )
                )
                return None
            if "user" not in packet.parameters:
                link.sock.sendall(
                    codec.error_response(
                        "28000", "no user name in the startup packet", severity="FATAL"
                    )
                )
                return None
            return packet
        raise codec.ProtocolViolation("too many startup negotiation packets")


class _Link:
    """A connection's socket and read stream (both replaced when TLS starts)."""

    def __init__(self, conn: socket.socket) -> None:
        self.raw = conn
        self.sock: socket.socket = conn
        self.stream: BinaryIO = conn.makefile("rb")

    def encrypt(self, context: ssl.SSLContext) -> None:
        self.stream.close()
        self.sock = context.wrap_socket(self.raw, server_side=True)
        self.stream = self.sock.makefile("rb")

    def close(self) -> None:
        """Close for real: a socket with an open makefile stream stays open otherwise,
        and a client waiting for the end (libpq's cancel) would wait forever."""
        for close in (
            self.stream.close,
            lambda: self.sock.shutdown(socket.SHUT_RDWR),
            self.sock.close,
            self.raw.close,
        ):
            with contextlib.suppress(OSError, ValueError):
                close()


def serve(config: Config, host: str) -> None:
    """Bind and serve until the process is terminated (``python -m gateway.pgwire``)."""
    server = WireServer(config)
    bound = server.bind(host)
    log.info(
        "postgres wire listening",
        extra={"fields": {"host": bound[0], "port": bound[1], "pid": os.getpid()}},
    )
    server.serve_forever()
