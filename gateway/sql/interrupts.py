"""One thread per process that interrupts statements at their deadlines.

A SQLite statement is stopped at its deadline by ``Connection.interrupt()`` called from
another thread (``gateway/sql/execute.py``). A ``threading.Timer`` per statement did that,
and starting and joining a thread for every query cost about 0.2 ms of CPU a query on
small tables (bench/README.md, issue 34's speed). Here one daemon thread keeps the armed
deadlines in a heap and calls each interrupt when its moment passes.

``Armed.cancel()`` returns only once the interrupt can no longer run: an interrupt under
way holds the entry's lock, so it lands before the caller reuses the connection (as the
join of the timer thread guaranteed).
"""

from __future__ import annotations

import heapq
import itertools
import os
import threading
import time
from collections.abc import Callable


class Armed:
    """One armed interrupt: ``cancel()`` it once the statement has ended."""

    __slots__ = ("_interrupt", "_lock")

    def __init__(self, interrupt: Callable[[], object]) -> None:
        self._interrupt: Callable[[], object] | None = interrupt
        self._lock = threading.Lock()

    def cancel(self) -> None:
        with self._lock:  # waits for an interrupt under way
            # the heap keeps the entry until its moment: not the connection
            self._interrupt = None

    def fire(self) -> None:
        with self._lock:
            interrupt, self._interrupt = self._interrupt, None
            if interrupt is not None:
                interrupt()


class Watchdog:
    """Calls armed interrupts at their moments (``time.monotonic()``), from one thread."""

    def __init__(self) -> None:
        self._reset()
        # A forked child has none of the parent's threads, and its copies of the parent's
        # connections are not its to interrupt: it starts afresh (a lock held by a parent
        # thread at the fork would otherwise stay held in the child for ever).
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Armed]] = []
        self._seq = itertools.count()
        self._running = False

    def arm(self, at: float, interrupt: Callable[[], object]) -> Armed:
        armed = Armed(interrupt)
        with self._cond:
            if not self._running:
                self._running = True
                threading.Thread(target=self._run, name="dpgate-interrupts", daemon=True).start()
            heapq.heappush(self._heap, (at, next(self._seq), armed))
            if self._heap[0][2] is armed:
                self._cond.notify()
        return armed

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._heap or self._heap[0][0] > time.monotonic():
                    wait = None if not self._heap else self._heap[0][0] - time.monotonic()
                    self._cond.wait(wait)
                _, _, armed = heapq.heappop(self._heap)
            armed.fire()  # outside the condition: arming never waits for an interrupt


#: The process's watchdog.
WATCHDOG = Watchdog()
