"""Keep-alive connections shared between gunicorn workers by connections held
(gateway/serve_workers.py): the table's rules here; the real split in test_serve.py."""

from __future__ import annotations

import os
import select
from types import SimpleNamespace

import pytest

pytest.importorskip("gunicorn")

from gateway.serve_workers import ConnectionTable


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
