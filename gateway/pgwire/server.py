"""The PostgreSQL front end's listener: one thread per connection, TLS, cancel requests.

``WireServer(config, gateway)`` owns the emulated catalogue, the slot accounting
(``gateway.pgwire.admission``: who may hold a connection while logging in, and a
session slot once logged in) and the registry of live sessions (for CancelRequest).
``serve_forever`` accepts connections on ``postgres_wire.port``; a connection refused a
slot gets SQLSTATE 53300 and is closed at once, without a thread of its own. Each
connection must log in within ``postgres_wire.authentication_timeout_s`` of being
accepted, and a session idle for ``idle_session_timeout_s`` is closed
(``gateway.pgwire.link``).

``dpgate serve`` runs it in a process of its own beside the HTTP workers
(``python -m gateway.pgwire``, see ``gateway.server.serve``), with its own ``Gateway`` on the
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
import time
from collections import OrderedDict
from dataclasses import replace
from pathlib import Path

from gateway.core.config import Config
from gateway.ops import metrics
from gateway.pgwire import codec
from gateway.pgwire.admission import Admission, Ticket
from gateway.pgwire.catalog import Catalog
from gateway.pgwire.link import AuthenticationTimeout, IdleSessionTimeout, Link
from gateway.pgwire.observe import Observer
from gateway.pgwire.session import Session
from gateway.pipeline.gateway import Gateway

log = logging.getLogger("dpgate.pgwire")
TOO_MANY = "sorry, too many clients already"
#: How long the accept loop pauses when the process is out of file descriptors.
ACCEPT_BACKOFF_S = 0.05
#: Emulated catalogues kept for distinct sets of readable tables (each a DuckDB database).
MAX_CATALOGS = 16


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
        # the catalogues of analysts who may read only some tables (gateway.pipeline.access)
        self._catalogs: OrderedDict[frozenset[str], Catalog] = OrderedDict()
        self._catalogs_lock = threading.Lock()
        self.observe = Observer(self.gateway, config)
        self.tls: ssl.SSLContext | None = None
        if wire.login == "password" and (wire.tls is None or not wire.tls.require):
            log.warning(
                "postgres_wire.login is password without tls.require: clients may send "
                "their API key or token in clear text"
            )
        if wire.tls is not None:
            self.tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            self.tls.minimum_version = ssl.TLSVersion.TLSv1_2
            self.tls.load_cert_chain(str(wire.tls.cert), str(wire.tls.key))
        self._sessions: dict[int, Session] = {}
        self._lock = threading.Lock()
        self.admission = Admission(wire)
        self._listener: socket.socket | None = None
        self._stopped = threading.Event()

    def catalog_for(self, readable: frozenset[str]) -> Catalog:
        """The emulated catalogue of the tables ``readable``: the others are not in it at
        all (names, OIDs: as if they were not declared)."""
        gw = self.gateway
        if readable == gw.access.all_tables:
            return self.catalog
        with self._catalogs_lock:
            found = self._catalogs.get(readable)
            if found is not None:
                self._catalogs.move_to_end(readable)
                return found
        catalog = Catalog(replace(gw.config, tables=gw.access.tables_of(readable)))
        with self._catalogs_lock:
            self._catalogs[readable] = catalog
            if len(self._catalogs) > MAX_CATALOGS:
                self._catalogs.popitem(last=False)
        return catalog

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
                # Out of descriptors (EMFILE), or a connection reset before it was
                # accepted: keep serving the others.
                log.warning("pgwire accept failed", exc_info=True)
                time.sleep(ACCEPT_BACKOFF_S)
                continue
            self._admit(conn, str(address[0]))

    def _admit(self, conn: socket.socket, peer: str) -> None:
        """Give an accepted connection a pending slot and a thread, or refuse it now."""
        link = Link(conn, time.monotonic() + self.wire.authentication_timeout_s)
        ticket = self.admission.admit(peer, link)
        if isinstance(ticket, str):
            link.try_write(codec.error_response("53300", TOO_MANY, severity="FATAL"))
            link.close()
            return
        threading.Thread(target=self.handle, args=(ticket,), daemon=True).start()

    def shutdown(self) -> None:
        """Stop ``serve_forever`` (it returns: closing a socket does not wake a thread
        blocked in its ``accept()`` on Linux, shutting it down does) and close the
        catalogue."""
        self._stopped.set()
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                self._listener.close()
        self.catalog.close()

    # -- one connection ----------------------------------------------------------------

    def handle(self, ticket: Ticket) -> None:
        """Serve one admitted connection until it ends; never raises."""
        link, peer = ticket.link, ticket.peer
        session: Session | None = None
        try:
            link.raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            startup = self._startup(link)
            if startup is None:
                return
            session = Session(self, link, link.write, peer)
            session.serve(startup, login=lambda: self._login(ticket))
            session.flush()
        except AuthenticationTimeout:
            metrics.record_wire_timeout("authentication")
        except IdleSessionTimeout:
            metrics.record_wire_timeout("idle_session")
            with contextlib.suppress(OSError, ValueError):
                if session is not None:
                    session.flush()
            link.try_write(
                codec.error_response(
                    "57P05",
                    "terminating connection due to idle-session timeout",
                    severity="FATAL",
                )
            )
        except (codec.ConnectionClosed, OSError, ssl.SSLError):
            pass
        except codec.ProtocolViolation as e:
            link.try_write(codec.error_response("08P01", str(e), severity="FATAL"))
        except Exception:
            log.error("pgwire connection failed", exc_info=True)
        finally:
            if session is not None:
                self._unregister(session)
            self.admission.release(ticket)
            link.close()

    def _login(self, ticket: Ticket) -> bool:
        """A session slot for a connection that passed SCRAM (False: none free, 53300)."""
        if not self.admission.promote(ticket):
            return False
        ticket.link.logged_in(self.wire.idle_session_timeout_s)
        return True

    def _startup(self, link: Link) -> codec.Startup | None:
        """Read startup packets (answering SSL/GSS requests) until a real startup."""
        encrypted = False
        for _ in range(3):
            packet = codec.read_startup(link)
            if isinstance(packet, codec.CancelRequest):
                self._cancel(packet)
                return None
            if isinstance(packet, codec.GssEncRequest):
                link.write(b"N")
                continue
            if isinstance(packet, codec.SslRequest):
                if self.tls is None or encrypted:
                    link.write(b"N")
                    continue
                link.write(b"S")
                link.encrypt(self.tls)
                encrypted = True
                continue
            if self.wire.tls is not None and self.wire.tls.require and not encrypted:
                link.write(
                    codec.error_response(
                        "28000",
                        "this dpgate accepts PostgreSQL clients over TLS only (sslmode=require)",
                        severity="FATAL",
                    )
                )
                return None
            if "user" not in packet.parameters:
                link.write(
                    codec.error_response(
                        "28000", "no user name in the startup packet", severity="FATAL"
                    )
                )
                return None
            return packet
        raise codec.ProtocolViolation("too many startup negotiation packets")


def serve(config: Config, host: str, address_file: Path | None = None) -> None:
    """Bind and serve until the process is terminated (``python -m gateway.pgwire``).

    ``address_file``: where to write the address bound (``HOST PORT``), once listening,
    for the HTTP workers' readiness check (``gateway.pgwire.probe``).
    """
    from gateway.ops.heap import freeze_startup_heap

    server = WireServer(config)
    freeze_startup_heap()  # a full collection no longer walks the startup heap
    bound = server.bind(host)
    if address_file is not None:
        partial = address_file.with_name(address_file.name + ".partial")
        partial.write_text(f"{bound[0]} {bound[1]}\n")
        partial.replace(address_file)
    log.info(
        "postgres wire listening",
        extra={"fields": {"host": bound[0], "port": bound[1], "pid": os.getpid()}},
    )
    server.serve_forever()
