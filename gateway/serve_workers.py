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
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import select
import selectors
from typing import Any, ClassVar

from gunicorn.workers.gthread import ThreadWorker

_ABSENT = -1  # a slot no live worker holds
# How long a pool thread that has just answered on a keep-alive connection waits there
# for the next request before handing the connection back to the worker's poller.
KEEPALIVE_LINGER_S = 0.005


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

    # -- a worker ------------------------------------------------------------------------

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
        super().set_accept_enabled(enabled and self._balanced())
        if place is not None and self.alive:
            place[0].listening(place[1], self._accepting)

    def wait_for_and_dispatch_events(self, timeout: float) -> None:
        if self._accepting and self.alive and not self._balanced():
            self.set_accept_enabled(False)
        super().wait_for_and_dispatch_events(timeout)

    def handle(self, conn: Any) -> Any:
        """Serve a request, then the connection's next ones while they come within
        ``KEEPALIVE_LINGER_S`` (see the module's docstring); runs in a pool thread."""
        result = super().handle(conn)
        while result is True and self._may_linger(conn) and _readable_within(conn):
            result = super().handle(conn)
        return result

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


def _readable_within(conn: Any) -> bool:
    """Whether ``conn``'s next request is read ahead or arrives within the linger (a
    closed connection counts: serving it ends the turn)."""
    if conn.parser.unreader.buf.getvalue():  # a body drain read into the next request
        return True
    poller = select.poll()
    poller.register(conn.sock.fileno(), select.POLLIN)
    return bool(poller.poll(KEEPALIVE_LINGER_S * 1000.0))


def balanced_worker_class(slots: int) -> tuple[type[ThreadWorker], ConnectionTable]:
    """The worker class and the table it shares (call in the master, before forking).
    A gunicorn whose gthread worker lacks the hooks this builds on gets plain gthread."""
    table = ConnectionTable(slots)
    if not all(
        hasattr(ThreadWorker, m) for m in ("set_accept_enabled", "wait_for_and_dispatch_events")
    ):
        return ThreadWorker, table
    return type("BalancedThreadWorker", (BalancedThreadWorker,), {"table": table}), table
