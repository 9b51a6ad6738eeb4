"""Who gets a connection slot on the PostgreSQL front end, so that no one can lock out the rest.

Without a key, a client can open TCP connections and send nothing (or a startup packet
one byte at a time). Three rules keep that from denying service to analysts:

- **Session slots are for logged-in analysts only.** ``postgres_wire.max_connections``
  counts sessions that have passed SCRAM; a connection takes one when its login
  succeeds (or is refused with SQLSTATE 53300 then), never before. Unauthenticated
  connections cannot hold one.
- **Connections still logging in are capped, per source address and in total**
  (``max_authenticating_per_address``, ``max_authenticating``), and each must finish
  within ``authentication_timeout_s`` of being accepted, however slowly it sends
  (``gateway.pgwire.link``). Over the per-address cap a new connection is refused at
  once (53300). When the total is reached, the newcomer is refused if its own address
  holds as many pending connections as any other; otherwise the oldest pending
  connection of the address holding the most is closed to make room. So one address (or
  a few) flooding the port only ever displaces its own connections, and an analyst
  from another address logs in as if nothing were happening.
- **Idle sessions end** (``idle_session_timeout_s``, ``gateway.pgwire.link``), so a
  slot held by a forgotten client comes back.

Every refusal, eviction and timeout is counted (``gateway.ops.metrics``: ``dpgate_pgwire_*``).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Literal

from gateway.core.config import PostgresWireConfig
from gateway.ops import metrics
from gateway.pgwire.link import Link

Refusal = Literal["authenticating_per_address", "authenticating_total"]


@dataclass(eq=False)
class Ticket:
    """One accepted connection's claim: pending (logging in) until promoted to a session."""

    peer: str
    link: Link
    accepted: float = field(default_factory=time.monotonic)
    session: bool = False
    released: bool = False


class Admission:
    """The slot accounting of one wire server (thread-safe)."""

    def __init__(self, wire: PostgresWireConfig) -> None:
        self.wire = wire
        self._lock = threading.Lock()
        # pending tickets by address, oldest first (insertion order)
        self._pending: dict[str, OrderedDict[int, Ticket]] = {}
        self._pending_count = 0
        self._sessions = 0

    def admit(self, peer: str, link: Link) -> Ticket | Refusal:
        """A pending ticket for a new connection from ``peer``, or why it is refused."""
        with self._lock:
            here = self._pending.get(peer)
            count_here = len(here) if here else 0
            if count_here >= self.wire.max_authenticating_per_address:
                metrics.record_wire_refusal("authenticating_per_address")
                return "authenticating_per_address"
            if self._pending_count >= self.wire.max_authenticating:
                heaviest = max(self._pending, key=lambda a: len(self._pending[a]))
                if len(self._pending[heaviest]) <= count_here + 1:
                    metrics.record_wire_refusal("authenticating_total")
                    return "authenticating_total"
                _, victim = next(iter(self._pending[heaviest].items()))
                self._drop_pending(victim)
                victim.released = True
                victim.link.cut()
                metrics.record_wire_refusal("evicted")
            ticket = Ticket(peer, link)
            self._pending.setdefault(peer, OrderedDict())[id(ticket)] = ticket
            self._pending_count += 1
            metrics.set_wire_connections(self._pending_count, self._sessions)
            return ticket

    def promote(self, ticket: Ticket) -> bool:
        """Give a logged-in connection a session slot; False if none is free (53300)."""
        with self._lock:
            if ticket.released:
                return False  # evicted while it finished logging in
            if self._sessions >= self.wire.max_connections:
                metrics.record_wire_refusal("too_many_sessions")
                return False
            self._drop_pending(ticket)
            ticket.session = True
            self._sessions += 1
            metrics.set_wire_connections(self._pending_count, self._sessions)
            return True

    def release(self, ticket: Ticket) -> None:
        """The connection ended: free whatever it held."""
        with self._lock:
            if ticket.session:
                ticket.session = False
                self._sessions -= 1
            else:
                self._drop_pending(ticket)
            ticket.released = True
            metrics.set_wire_connections(self._pending_count, self._sessions)

    def counts(self) -> tuple[int, int]:
        """(connections logging in, sessions) now."""
        with self._lock:
            return self._pending_count, self._sessions

    def _drop_pending(self, ticket: Ticket) -> None:
        here = self._pending.get(ticket.peer)
        if here is not None and here.pop(id(ticket), None) is not None:
            self._pending_count -= 1
            if not here:
                del self._pending[ticket.peer]
