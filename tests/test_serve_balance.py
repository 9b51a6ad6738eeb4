"""Keep-alive connections shared between gunicorn workers by connections held
(gateway/server/serve_workers.py): the table's rules here; the real split in test_serve.py.
And a pool thread serving its connection's next requests while they come at once."""

from __future__ import annotations

import os
import select
from types import SimpleNamespace

import pytest

pytest.importorskip("gunicorn")

from gateway.server.serve_workers import ConnectionTable


def _workers(table: ConnectionTable, n: int) -> list[SimpleNamespace]:
    workers = [SimpleNamespace(age=i + 1) for i in range(n)]
    for w in workers:
        table.assign(w)
    return workers


def _woken(table: ConnectionTable, slot: int) -> bool:
    fd = table.wake_fd(slot)
    poller = select.poll()  # not select(): a test process may hold descriptors past 1024
    poller.register(fd, select.POLLIN)
    ready = bool(poller.poll(0))
    if ready:
        os.read(fd, 4096)
    return ready


def test_only_the_workers_holding_fewest_connections_listen() -> None:
    table = ConnectionTable(4)
    a, b = _workers(table, 2)
    assert table.least_loaded(a.dpgate_slot, 0) and table.least_loaded(b.dpgate_slot, 0)
    table.publish(a.dpgate_slot, 1)
    assert not table.least_loaded(a.dpgate_slot, 1)  # b holds fewer: a stops listening
    assert table.least_loaded(b.dpgate_slot, 0)
    table.publish(b.dpgate_slot, 1)
    assert table.least_loaded(a.dpgate_slot, 1) and table.least_loaded(b.dpgate_slot, 1)


def test_a_rising_count_wakes_the_workers_that_stopped_listening() -> None:
    table = ConnectionTable(4)
    a, b, c = _workers(table, 3)
    table.listening(a.dpgate_slot, False)  # a stopped listening, b and c listen
    table.listening(b.dpgate_slot, True)
    table.listening(c.dpgate_slot, True)
    table.publish(b.dpgate_slot, 2)
    assert _woken(table, a.dpgate_slot)
    assert not _woken(table, c.dpgate_slot)  # listening already: nothing to look at
    table.publish(b.dpgate_slot, 1)  # a falling count changes nobody's turn
    assert not _woken(table, a.dpgate_slot)


def test_a_worker_that_leaves_counts_for_nobody_and_wakes_the_others() -> None:
    table = ConnectionTable(2)
    a, b = _workers(table, 2)
    table.publish(b.dpgate_slot, 5)
    table.listening(b.dpgate_slot, False)
    table.publish(a.dpgate_slot, 1)
    assert not table.least_loaded(b.dpgate_slot, 5)
    table.release(a)  # a exited (or stops): b must take every new connection
    assert table.least_loaded(b.dpgate_slot, 5)
    assert _woken(table, b.dpgate_slot)
    c = SimpleNamespace(age=3)
    table.assign(c)  # its slot is free again
    assert c.dpgate_slot == a.dpgate_slot


def test_a_worker_beyond_the_slots_is_not_balanced() -> None:
    table = ConnectionTable(1)
    a, b = _workers(table, 2)
    assert a.dpgate_slot == 0 and b.dpgate_slot is None
    table.release(b)  # nothing to free
    assert table.least_loaded(0, 3)


# -- a thread lingering on its keep-alive connection -------------------------------------


def _hello(environ: dict, start_response) -> list[bytes]:  # type: ignore[no-untyped-def, type-arg]
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "5")])
    return [b"hello"]


def _worker(threads: int, connections: int):  # type: ignore[no-untyped-def]
    """A balanced gthread worker as the master builds it, not forked: its ``handle``
    runs in the calling thread, as in one of its pool threads."""
    from gunicorn.config import Config
    from gunicorn.glogging import Logger

    from gateway.server.serve_workers import balanced_worker_class

    cfg = Config()
    cfg.set("threads", threads)
    cfg.set("keepalive", 5)
    worker_class, _ = balanced_worker_class(1)
    worker = worker_class(0, os.getpid(), [], None, 30, cfg, Logger(cfg))
    worker.wsgi = _hello
    worker.nr_conns = connections
    return worker


def _serve_in_turn(threads: int, connections: int) -> tuple[list[bytes], int]:
    """One client sends three requests on one connection, each as soon as it has read
    the previous answer, then closes it; what it received, and how many turns of a pool
    thread (calls of ``handle``) served them: each turn but the last ends by handing the
    connection back to the worker's poller."""
    import socket
    import threading

    from gunicorn.workers.gthread import TConn

    worker = _worker(threads, connections)
    server_side, client_side = socket.socketpair()
    conn = TConn(worker.cfg, server_side, ("127.0.0.1", 1), ("127.0.0.1", 2))
    request = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
    answers: list[bytes] = []

    def client() -> None:
        for _ in range(3):
            client_side.sendall(request)
            data = b""
            while not data.endswith(b"hello"):
                data += client_side.recv(4096)
            answers.append(data)
        client_side.close()

    sender = threading.Thread(target=client)
    sender.start()
    turns = 1
    while worker.handle(conn) is True:  # kept alive: the poller would submit it again
        turns += 1
    sender.join()
    server_side.close()
    return answers, turns


def test_a_thread_serves_its_connections_next_requests_while_they_come_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import gateway.server.serve_workers as serve_workers

    # However slowly a loaded machine runs the client, its next request comes within.
    monkeypatch.setattr(serve_workers, "KEEPALIVE_LINGER_S", 30.0)
    answers, turns = _serve_in_turn(threads=4, connections=1)
    assert len(answers) == 3 and all(a.startswith(b"HTTP/1.1 200") for a in answers)
    assert turns == 1  # the three requests and the close, in one turn: no hand-off


def test_no_thread_lingers_when_connections_outnumber_threads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import gateway.server.serve_workers as serve_workers

    monkeypatch.setattr(serve_workers, "KEEPALIVE_LINGER_S", 30.0)
    answers, turns = _serve_in_turn(threads=2, connections=3)
    assert len(answers) == 3
    assert turns == 4  # each answer hands the connection back; the fourth turn sees it closed
