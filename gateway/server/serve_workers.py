"""gunicorn's threaded worker: new connections go to the worker holding fewest, and a
thread that has answered on a keep-alive connection waits there briefly for the next.

Keep-alive clients (notebooks, BI tools, a load generator) hold one connection for many
requests, and gunicorn's workers race for each new one: one process may end up holding
most of them and serve them on one core (one GIL) while another idles. Measured with 32
keep-alive clients and ``--workers 2`` on 2 cores (``bench/throughput.py``): a 27/5 split
answered 295 distinct queries/s, a 16/16 split 449/s.

Here every worker publishes how many connections it holds in a table the master
allocates before forking (``ConnectionTable``), and listens for new connections only
while it holds no more than any other live worker. A worker whose count rises wakes the
workers that stopped listening (a byte on each one's pipe), so they look again at once:
the least-loaded workers always listen, and a new connection never waits for a worker
to notice.

And a thread that has answered on a keep-alive connection serves that connection's next
request itself if it comes within ``KEEPALIVE_LINGER_S``. In plain gthread every request
takes two hand-offs between threads: the pool thread gives the connection back to the
worker's main thread (a byte on a pipe, a poller registration), which submits it to the
pool again once its next request arrives. A client that sends its next query as soon as
it has read an answer (a notebook loop, a BI tool, the benchmark) no longer waits for
either. A thread lingers only while its worker holds no more connections than it has
threads, so no connection ever waits for a thread because another lingers; past the
linger, or past that limit, the connection goes back to the poller as before. Measured
with one client sending the 22 PUMS queries to two ``dpgate serve --workers 1``
alternately (paired, 1,870–1,914 pairs per run): the lingering server answered 0.26 and
0.34 ms sooner at the median (5.0 against 5.3 ms, 5.1 against 5.4 ms); a ``/healthz``
round trip took 0.61–0.68 ms against 0.70–0.88 ms.

And slow or idle clients cannot exhaust it (issue 36). In plain gthread a pool thread
reads the request: it waits up to 5 s for a new connection's first byte, then reads the
rest of the head and the body with no deadline, so 50 clients sending half a request
held every thread. Here the worker's main thread reads each request (head and body, up
to ``PREREAD_BODY_BYTES``) from the poller, without blocking; only a complete request
is handed to a pool thread, which then parses it from memory. A request not complete
within ``REQUEST_READ_TIMEOUT_S`` of its connection's turn gets ``408`` and is closed,
and one client address holds at most ``MAX_CONNECTIONS_PER_ADDRESS`` connections per
worker (more are closed at once), so idle connections from one place cannot fill the
worker's ``worker_connections`` either. A lingering thread serves a connection's next
request only if it has arrived whole. TLS connections (read by the TLS layer) are
served as before.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import multiprocessing
import os
import re
import select
import selectors
import socket
import struct
import sys
import time
from functools import partial
from typing import Any, ClassVar

from gunicorn.http2 import negotiation
from gunicorn.workers.gthread import TConn, ThreadWorker

from gateway.core.errors import ShuttingDown

_ABSENT = -1  # a slot no live worker holds
# How long a pool thread that has just answered on a keep-alive connection waits there
# for the next request before handing the connection back to the worker's poller.
KEEPALIVE_LINGER_S = 0.005
#: How long a connection may take to deliver a whole request (head and body) once it is
#: the connection's turn (accepted, or idle after an answer); past it: 408, closed.
REQUEST_READ_TIMEOUT_S = 10.0
#: Most connections one client address holds open in one worker; more are closed at once.
#: Behind a proxy every connection comes from its address: raise it there
#: (``DPGATE_MAX_CONNECTIONS_PER_ADDRESS``), up to gunicorn's ``worker_connections``.
MAX_CONNECTIONS_PER_ADDRESS = int(os.environ.get("DPGATE_MAX_CONNECTIONS_PER_ADDRESS", "64"))
#: Bytes of a request the main thread reads before a pool thread takes it: the head
#: (gunicorn refuses one past about 8 kB a line, 32 kB in all) and a body up to the
#: app's own limit (1 MB); a longer one is handed over at once (the app refuses it).
PREREAD_HEAD_BYTES = 64 * 1024
PREREAD_BODY_BYTES = 1_000_000
_CONTENT_LENGTH = re.compile(rb"\r\ncontent-length:[ \t]*(\d{1,12})", re.IGNORECASE)
_CHUNKED = re.compile(rb"\r\ntransfer-encoding:[^\r]*chunked", re.IGNORECASE)
#: How long a connection accepted while the worker stops may take to send its request
#: (then answered 503, ``Connection: close``).
STOPPING_READ_TIMEOUT_S = 1.0
_STOPPING_BODY = json.dumps(
    ShuttingDown(
        "this gateway is shutting down; nothing was run or charged: send the request again",
        charged=False,
    ).to_dict()
).encode()
_STOPPING_RESPONSE = (
    b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nRetry-After: 1\r\n"
    b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
    % (len(_STOPPING_BODY), _STOPPING_BODY)
)
_TIMEOUT_BODY = (
    b'{"ok": false, "status": 408, "error": {"code": "invalid_request", '
    b'"message": "the request did not arrive in time", "detail": {}}}'
)
_TIMEOUT_RESPONSE = (
    b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\n"
    b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
    % (len(_TIMEOUT_BODY), _TIMEOUT_BODY)
)


def pin_worker(slot: int | None, workers: int, setting: str = "auto") -> int | None:
    """Pin the calling (just forked, single-threaded) worker process to one CPU — slot
    ``i`` takes the ``i``-th CPU it may run on, modulo their number — and return it.

    Only when every CPU gets a worker (``workers`` ≥ CPUs): each worker is one GIL, and
    when its threads hand the GIL to one another, a thread woken on the *other* core
    (busy with the other worker) stalls the whole process until it runs there; pinned,
    the hand-off stays on the worker's own core. Measured with ``--workers 2`` on 2 cores,
    32 clients, distinct queries (``bench/throughput.py``), three interleaved pairs,
    pinned/free: 476/450, 548/411 and 523/459 answered/s, p50 62/67, 55/73 and 57/66 ms.
    With fewer workers than CPUs nothing is pinned: a worker's C work (SQLite, sockets)
    may then spill onto an idle core. ``setting`` ``off`` (``DPGATE_CPU_AFFINITY=off``)
    leaves the scheduler free. Linux only (``None`` elsewhere)."""
    if setting != "auto" or slot is None or not hasattr(os, "sched_setaffinity"):
        return None
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2 or workers < len(cpus):
        return None
    cpu = cpus[slot % len(cpus)]
    os.sched_setaffinity(0, {cpu})
    return cpu


class ConnectionTable:
    """Connections held per worker, and whether it listens, in memory shared by the
    master and its workers; one wake-up pipe per slot.

    Slots are handed out by the master as it forks (``assign``) and freed when a worker
    exits (``release``); a worker forked when every slot is taken is not balanced (it
    always listens)."""

    def __init__(self, slots: int) -> None:
        self._counts = multiprocessing.RawArray("i", [_ABSENT] * slots)
        self._listening = multiprocessing.RawArray("b", [0] * slots)
        self._pipes = [os.pipe() for _ in range(slots)]
        for read_end, write_end in self._pipes:
            os.set_blocking(read_end, False)
            os.set_blocking(write_end, False)
        self._owners: dict[int, int] = {}  # slot → worker age (master only)
        self._server_stopping = multiprocessing.RawValue("b", 0)

    # -- the master ----------------------------------------------------------------------

    def assign(self, worker: Any) -> None:
        """Give ``worker`` a slot, before it is forked."""
        free = next((s for s in range(len(self._counts)) if s not in self._owners), None)
        worker.dpgate_slot = free
        if free is not None:
            self._owners[free] = worker.age
            self._counts[free] = 0
            self._listening[free] = 0

    def release(self, worker: Any) -> None:
        """Free the slot of ``worker``, which has exited."""
        slot = getattr(worker, "dpgate_slot", None)
        if slot is not None and self._owners.get(slot) == worker.age:
            del self._owners[slot]
            self.leave(slot)

    def server_stops(self) -> None:
        """The whole server stops (not a reload, not one worker): set before the master
        signals its workers, so that they may close the shared listeners for good."""
        self._server_stopping.value = 1

    # -- a worker ------------------------------------------------------------------------

    @property
    def server_stopping(self) -> bool:
        return bool(self._server_stopping.value)

    def wake_fd(self, slot: int) -> int:
        return self._pipes[slot][0]

    def publish(self, slot: int, connections: int) -> None:
        rose = connections > self._counts[slot]
        self._counts[slot] = connections
        if rose:  # the others may now hold no more than this one
            self._wake_idle(slot)

    def listening(self, slot: int, listening: bool) -> None:
        self._listening[slot] = int(listening)

    def leave(self, slot: int) -> None:
        """``slot``'s worker takes no more connections (stopping, or gone)."""
        self._counts[slot] = _ABSENT
        self._listening[slot] = 0
        self._wake_idle(slot)

    def least_loaded(self, slot: int, connections: int) -> bool:
        """Whether ``slot``'s worker holds no more connections than any other."""
        for other, held in enumerate(self._counts):
            if other != slot and held != _ABSENT and held < connections:
                return False
        return True

    def _wake_idle(self, slot: int) -> None:
        for other, held in enumerate(self._counts):
            if other != slot and held != _ABSENT and not self._listening[other]:
                with contextlib.suppress(BlockingIOError):  # a wake-up is already pending
                    os.write(self._pipes[other][1], b"\0")


class BalancedThreadWorker(ThreadWorker):
    """gunicorn's ``gthread`` worker that listens only while it is least loaded, and
    whose threads linger on a keep-alive connection for its next request."""

    table: ClassVar[ConnectionTable | None] = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._reading: dict[int, Any] = {}  # connections whose request is being read
        self._refusing: dict[int, Any] = {}  # accepted while stopping: answered 503
        self._drained = False  # stopping, and no request in flight is left
        self._by_address: dict[str, set[Any]] = {}  # connections held per client address

    def _place(self) -> tuple[ConnectionTable, int] | None:
        """The shared table and this worker's slot in it (None: not balanced)."""
        slot = getattr(self, "dpgate_slot", None)
        return None if self.table is None or slot is None else (self.table, slot)

    def run(self) -> None:
        place = self._place()
        if place is not None:
            table, slot = place
            self.poller.register(table.wake_fd(slot), selectors.EVENT_READ, self._woken)
        super().run()

    def _woken(self, fd: int) -> None:
        """Another worker's count rose or it left: this turn of the loop looks again."""
        with contextlib.suppress(BlockingIOError):
            os.read(fd, 4096)

    def _balanced(self) -> bool:
        place = self._place()
        if place is None:
            return True
        table, slot = place
        table.publish(slot, self.nr_conns)
        return table.least_loaded(slot, self.nr_conns)

    def set_accept_enabled(self, enabled: bool) -> None:
        place = self._place()
        if place is not None and not enabled and not self.alive:
            place[0].leave(place[1])  # stopping: the others must take every new connection
        if not enabled and not self.alive and not self._drained:
            # Stopping: connections the kernel queued meanwhile would be reset when the
            # listener closes; accepted, each gets a 503 until the requests in flight
            # are answered (``murder_keepalived``).
            super().set_accept_enabled(True)
            return
        super().set_accept_enabled(enabled and self._balanced())
        if place is not None and self.alive:
            place[0].listening(place[1], self._accepting)

    def wait_for_and_dispatch_events(self, timeout: float) -> None:
        if self._accepting and self.alive and not self._balanced():
            self.set_accept_enabled(False)
        super().wait_for_and_dispatch_events(timeout)

    # -- the front door: whole requests only reach the pool --------------------------

    def accept(self, listener: Any) -> None:
        """Accept a connection, unless its address holds its share already."""
        try:
            sock, client = listener.accept()
        except OSError as e:
            if e.errno not in (errno.EAGAIN, errno.ECONNABORTED, errno.EWOULDBLOCK):
                raise
            return
        address = client[0] if isinstance(client, tuple) else str(client)
        held = self._by_address.setdefault(address, set())
        held.difference_update([c for c in held if c.sock.fileno() < 0])
        if len(held) >= MAX_CONNECTIONS_PER_ADDRESS:
            sock.close()
            return
        self.nr_conns += 1
        sock.setblocking(True)
        conn = TConn(self.cfg, sock, client, listener.getsockname())
        held.add(conn)
        if not self.alive:
            self._refusing[id(conn)] = conn
        self.enqueue_req(conn)

    def enqueue_req(self, conn: Any) -> None:
        """Hand ``conn`` to a pool thread once its next request has arrived whole."""
        if getattr(conn, "dpgate_whole", False) or not self._prereads(conn):
            conn.dpgate_whole = False
            super().enqueue_req(conn)
            return
        held = conn.parser.unreader.take_buffered() if conn.parser is not None else b""
        conn.dpgate_buffer = bytearray(held)
        wait = STOPPING_READ_TIMEOUT_S if id(conn) in self._refusing else REQUEST_READ_TIMEOUT_S
        conn.dpgate_deadline = time.monotonic() + wait
        if _whole_request(conn.dpgate_buffer):
            self._hand_over(conn)
            return
        conn.sock.setblocking(False)
        self._reading[id(conn)] = conn
        self.poller.register(conn.sock, selectors.EVENT_READ, partial(self._read_request, conn))

    def _prereads(self, conn: Any) -> bool:
        """Whether the main thread reads ``conn``'s requests (plain HTTP/1.x only)."""
        return not (
            self.cfg.is_ssl
            or conn.is_http2
            or negotiation.prior_knowledge_allowed(self.cfg, conn.client)
        )

    def _read_request(self, conn: Any, sock: Any) -> None:
        """Poller callback (main thread): read what has arrived, without blocking."""
        try:
            data = sock.recv(PREREAD_HEAD_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:  # the client left
            self._stop_reading(conn)
            self.nr_conns -= 1
            conn.close()
            return
        conn.dpgate_buffer += data
        if _whole_request(conn.dpgate_buffer):
            self._stop_reading(conn)
            self._hand_over(conn)

    def _hand_over(self, conn: Any) -> None:
        if self._refusing.pop(id(conn), None) is not None:
            with contextlib.suppress(OSError):  # read whole, so closing resets nothing
                conn.sock.send(_STOPPING_RESPONSE)
            self.nr_conns -= 1
            conn.close()
            return
        conn.dpgate_prefetched = bytes(conn.dpgate_buffer)
        conn.dpgate_buffer = bytearray()
        conn.data_ready = True
        conn.dpgate_whole = True
        self.enqueue_req(conn)

    def _stop_reading(self, conn: Any) -> None:
        self._reading.pop(id(conn), None)
        with contextlib.suppress(OSError, KeyError, ValueError):
            self.poller.unregister(conn.sock)

    def murder_keepalived(self, force: bool = False) -> None:
        """gunicorn's reaping of idle connections, and of requests past their deadline
        (408, closed). Forced — the stopping worker's last step before it closes its
        listeners — it first answers 503 whatever connections the kernel still holds
        for it (``_refuse_queued``)."""
        if force and not self.alive:
            self._refuse_queued()
        super().murder_keepalived(force)
        now = time.monotonic()
        for conn in list(self._reading.values()):
            if not force and conn.dpgate_deadline > now:
                continue
            self._stop_reading(conn)
            self._refusing.pop(id(conn), None)
            if conn.dpgate_buffer:  # a request had begun: say why it ends
                with contextlib.suppress(OSError):
                    conn.sock.send(_TIMEOUT_RESPONSE)
            self.nr_conns -= 1
            conn.close()
        if not self.alive and not self._drained and self.nr_conns <= len(self._refusing):
            self._drained = True  # every request in flight is answered: stop accepting
            super().set_accept_enabled(False)

    def _refuse_queued(self) -> None:
        """Answer ``503 shutting_down`` on the connections waiting in the listeners'
        queues. Once its requests in flight are answered a stopping worker stops
        accepting; connections made after that wait in the kernel's queue, and closing
        the listener would reset each of them — a request sent and never answered.

        When the whole server stops, the listeners first take no new connection
        (``_refuse_handshakes``): a client connecting from then on is refused at
        connect, before it has sent anything, and the queue is answered to its end.
        Otherwise (a reload's old worker: the listeners stay open for the others) this
        worker answers what waits for it now, for at most ``STOPPING_READ_TIMEOUT_S``."""
        place = self._place()
        closing = place is not None and place[0].server_stopping
        if closing:
            _refuse_handshakes(self.sockets)
        deadline = time.monotonic() + STOPPING_READ_TIMEOUT_S
        for listener in self.sockets:
            with contextlib.suppress(OSError):
                listener.setblocking(False)
        while closing or time.monotonic() < deadline:
            accepted = 0
            for listener in self.sockets:
                try:
                    sock, _ = listener.accept()
                except OSError:  # EAGAIN: none waiting (or the listener is gone)
                    continue
                accepted += 1
                # Past the deadline, a connection that sends nothing is not waited for.
                _refuse_now(sock, max(deadline, time.monotonic() + 0.05))
            if not accepted:
                return

    def handle(self, conn: Any) -> Any:
        """Serve a request, then the connection's next ones while they come whole within
        ``KEEPALIVE_LINGER_S`` (see the module's docstring); runs in a pool thread."""
        result = self._handle_whole(conn)
        while result is True and self._may_linger(conn) and _whole_within(conn):
            result = self._handle_whole(conn)
        return result

    def _handle_whole(self, conn: Any) -> Any:
        prefetched = getattr(conn, "dpgate_prefetched", None)
        if prefetched:
            conn.dpgate_prefetched = None
            conn.sock.setblocking(True)
            conn.init()
            conn.parser.unreader.unread(prefetched)
        return super().handle(conn)

    def _may_linger(self, conn: Any) -> bool:
        """Whether this thread may wait on ``conn`` for its next request: only while the
        worker holds no more connections than threads, so that no connection ever
        waits for a thread because one lingers (plain HTTP/1.1 only)."""
        return (
            self.alive
            and self.nr_conns <= self.cfg.threads
            and not self.cfg.is_ssl
            and not getattr(conn, "is_http2", False)
        )


#: A classic BPF program of one instruction, ``ret #0``: every packet dropped.
_DROP_ALL = struct.pack("HBBI", 0x06, 0, 0, 0)
_SO_ATTACH_FILTER = getattr(socket, "SO_ATTACH_FILTER", 26)  # asm-generic/socket.h


def _refuse_handshakes(listeners: list[Any]) -> None:
    """Make ``listeners`` complete no new TCP handshake (Linux): a socket filter that
    drops every packet, attached to a listening socket, drops the SYNs (and the last ACKs
    of handshakes begun). The client retries its SYN a second later, finds the port
    closed by then and is refused — before it has sent a byte. Connections already in
    the queue are untouched. Elsewhere, or without the right, nothing changes."""
    if not sys.platform.startswith("linux"):
        return
    program = ctypes.create_string_buffer(_DROP_ALL)  # copied by the kernel on attach
    fprog = struct.pack("HP", 1, ctypes.addressof(program))  # struct sock_fprog
    for listener in listeners:
        with contextlib.suppress(OSError):
            getattr(listener, "sock", listener).setsockopt(
                socket.SOL_SOCKET, _SO_ATTACH_FILTER, fprog
            )


def _refuse_now(sock: socket.socket, deadline: float) -> None:
    """Read a connection's request whole (until ``deadline``), answer it ``503
    shutting_down`` and close it without a reset: a socket closed with unread bytes
    sends one, so what the client sends until it closes its end is read and dropped."""
    received = bytearray()
    with contextlib.suppress(OSError):
        sock.setblocking(True)
        while not _whole_request(received):
            sock.settimeout(max(0.0, deadline - time.monotonic()))
            data = sock.recv(PREREAD_HEAD_BYTES)
            if not data:
                break
            received += data
    with contextlib.suppress(OSError):
        sock.settimeout(max(0.05, deadline - time.monotonic()))
        sock.sendall(_STOPPING_RESPONSE)
        sock.shutdown(socket.SHUT_WR)
        while sock.recv(PREREAD_HEAD_BYTES):  # until the client, answered, closes
            pass
    sock.close()


def _whole_within(conn: Any) -> bool:
    """Whether ``conn``'s next request is read ahead or arrives, whole, within the linger
    (a closed connection counts: serving it ends the turn). A partial one goes back to
    the worker's poller, which reads the rest without holding a thread."""
    held = conn.parser.unreader.buf.getvalue()  # a body drain read into the next request
    if held:
        return _whole_request(held)
    poller = select.poll()
    poller.register(conn.sock.fileno(), select.POLLIN)
    if not poller.poll(KEEPALIVE_LINGER_S * 1000.0):
        return False
    try:
        waiting = conn.sock.recv(PREREAD_HEAD_BYTES, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:
        return True
    return not waiting or _whole_request(waiting)


def _whole_request(data: bytes | bytearray) -> bool:
    """Whether ``data`` holds a whole HTTP/1.x request: its head, and its body as far as
    ``PREREAD_BODY_BYTES`` (a chunked body: its last chunk). An overlong head counts as
    whole: the parser refuses it."""
    end = data.find(b"\r\n\r\n")
    if end < 0:
        return len(data) > PREREAD_HEAD_BYTES
    head = bytes(data[:end])
    body = len(data) - end - 4
    if _CHUNKED.search(head):
        return data.find(b"0\r\n\r\n", end + 4) >= 0 or body > PREREAD_BODY_BYTES
    length = _CONTENT_LENGTH.search(head)
    return body >= min(int(length.group(1)) if length else 0, PREREAD_BODY_BYTES)


def balanced_worker_class(slots: int) -> tuple[type[ThreadWorker], ConnectionTable]:
    """The worker class and the table it shares (call in the master, before forking).
    A gunicorn whose gthread worker lacks the hooks this builds on gets plain gthread."""
    table = ConnectionTable(slots)
    if not all(
        hasattr(ThreadWorker, m) for m in ("set_accept_enabled", "wait_for_and_dispatch_events")
    ):
        return ThreadWorker, table
    return type("BalancedThreadWorker", (BalancedThreadWorker,), {"table": table}), table
