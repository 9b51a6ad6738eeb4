"""The watchdog that interrupts SQLite statements at their deadlines
(``gateway/sql/interrupts.py``): one thread for every statement of the process."""

from __future__ import annotations

import os
import sqlite3
import threading
import time

from gateway.sql.interrupts import Watchdog


def test_interrupts_fire_at_their_moments_in_order_and_cancelled_ones_never() -> None:
    dog = Watchdog()
    fired: list[int] = []
    start = time.monotonic()
    armed = [
        dog.arm(start + d, lambda i=i: fired.append(i)) for i, d in enumerate((0.06, 0.02, 0.04))
    ]
    cancelled = dog.arm(start + 0.03, lambda: fired.append(99))
    cancelled.cancel()
    time.sleep(0.15)
    assert fired == [1, 2, 0]
    for a in armed:
        a.cancel()  # after firing: a no-op


def test_cancel_waits_for_an_interrupt_under_way() -> None:
    """The connection is reused only once its interrupt has landed (or can no longer)."""
    dog = Watchdog()
    entered, release = threading.Event(), threading.Event()
    landed: list[float] = []

    def slow_interrupt() -> None:
        entered.set()
        release.wait(2)
        landed.append(time.monotonic())

    armed = dog.arm(time.monotonic(), slow_interrupt)
    assert entered.wait(2)
    threading.Timer(0.05, release.set).start()
    armed.cancel()
    cancelled_at = time.monotonic()
    assert landed and landed[0] <= cancelled_at


def test_a_running_sqlite_statement_is_interrupted_at_its_deadline() -> None:
    dog = Watchdog()
    conn = sqlite3.connect(":memory:", check_same_thread=False)
    endless = (
        "WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r) SELECT COUNT(*) FROM r"
    )
    start = time.monotonic()
    armed = dog.arm(start + 0.05, conn.interrupt)
    try:
        conn.execute(endless).fetchall()
    except sqlite3.OperationalError as e:
        assert "interrupt" in str(e)
    else:
        raise AssertionError("the statement was not interrupted")
    finally:
        armed.cancel()
    assert 0.04 <= time.monotonic() - start < 2.0
    # the next statement on the connection is not interrupted by a stale arm
    assert conn.execute("SELECT 1").fetchall() == [(1,)]


def test_a_forked_child_starts_afresh_and_never_fires_the_parents_interrupts() -> None:
    dog = Watchdog()
    parents: list[int] = []
    held = dog.arm(time.monotonic() + 0.2, lambda: parents.append(1))
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its own thread, only its own interrupts
        fired: list[int] = []
        dog.arm(time.monotonic() + 0.02, lambda: fired.append(2))
        time.sleep(0.4)
        os.write(write, bytes([len(parents), len(fired)]))
        os._exit(0)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    got = os.read(read, 2)
    os.close(read)
    held.cancel()
    assert status == 0 and got == bytes([0, 1])
