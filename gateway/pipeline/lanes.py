"""Concurrent queries of one audit scope: statements overlap, decisions keep one order.

A dashboard sends its charts at once. Their statements run concurrently; what must not
overlap, or depend on which statement finished first, is the auditor's view:

- **One lock per scope and process, held while the scope has queries in flight.** The
  first query of a scope to arrive takes the ledger's scope lock (``budget.locks``:
  other workers and hosts wait) and re-reads the scope's history; the last to leave
  lets go, after every answer released under it is durably recorded. A lane admits new
  queries for ``ADMIT_WINDOW_S`` after it opened; later ones wait for it to drain and
  take the lock again, so that other workers of the same scope get their turn.
- **Tickets in a public order.** Pre-audit, reserve and the release moment are decided
  holding the lane, one query at a time, in arrival order; each query gets a
  ticket there. The post-audit of a ticket runs only once every earlier ticket is done
  (answered, withheld or failed), holding the lane too, and before any admission
  waiting for it. So every post-audit sees exactly
  the answers of the earlier tickets that were released — an order fixed before any
  statement ran, never the order in which statements finished (which depends on the
  rows: "which half of a differencing pair was withheld" would otherwise tell which
  statement was faster).
- **Release moments in ticket order.** A ticket's release moment is at least
  ``RELEASE_GAP_S`` after the previous ticket's (``gateway.pipeline.timing``), so the post-audits,
  done in ticket order, fit before the release moments, and each moment is a function of
  public facts: arrival times, the plans' deadlines and earlier release moments.

A pre-audit sees the answers released before it, not the ones still in flight: a query
that the pre-audit would have refused for free, had it waited for an earlier one of the
same dashboard, is withheld by its post-audit instead (charged, like any post-audit
refusal). Decisions stay sound: each released answer was post-audited against every
answer released before it in ticket order.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager

#: How long a lane admits new queries after it took the ledger's scope lock.
ADMIT_WINDOW_S = 2.0


class TurnMissed(Exception):
    """An earlier ticket was not done by this query's release moment: its post-audit
    cannot run in order, so the query is a charged failure (a miss)."""


class ScopeLane:
    """The in-flight queries of one audit scope in this process (see the module)."""

    def __init__(
        self,
        scope: str,
        hold: Callable[[], AbstractContextManager[None]],
        sync: Callable[[], None],
    ) -> None:
        self.scope = scope
        self._hold = hold
        self._sync = sync
        self._cond = threading.Condition()
        self._members = 0
        self._state = "closed"  # closed → opening → open → closed
        self._opened_at = 0.0
        self._stack: ExitStack | None = None
        # The auditor's decisions (pre-audit with reserve, post-audit) hold the lane one
        # at a time (``_busy``); a post-audit waiting for it goes before any admission.
        self._busy = False
        self._post_waiting = 0
        self._next_ticket = 0
        self._turn = 0  # every ticket below this one is done
        self._done: set[int] = set()
        #: The release moment of the last ticket given (``time.monotonic()``).
        self.last_release: float | None = None

    @property
    def opened_at(self) -> float:
        """When the lane last opened (took the scope's lock and re-read its history): a
        query that waited for that counts its schedule from it, not from its arrival."""
        return self._opened_at

    @contextmanager
    def deciding(self) -> Iterator[None]:
        """Hold the lane for the pre-audit, the reservation and the ticket, once no
        post-audit is waiting for it: a burst of arrivals (a dashboard's charts) must not
        hold back the post-audits of the tickets already given, whose release moments
        are fixed (without this, the first chart's post-audit waited for all twenty
        admissions, missed its moment, and the next tickets missed their turn)."""
        with self._cond:
            while self._busy or self._post_waiting:
                self._cond.wait()
            self._busy = True
        try:
            yield
        finally:
            self._free()

    def _free(self) -> None:
        with self._cond:
            self._busy = False
            self._cond.notify_all()

    @contextmanager
    def member(self) -> Iterator[ScopeLane]:
        """Be one of the lane's queries: the scope's lock is held from the first
        member's arrival to the last one's departure."""
        self._join()
        try:
            yield self
        finally:
            self._leave()

    def ticket(self, release_at: float | None) -> int:
        """The next ticket (call in ``deciding``), with its query's release moment."""
        ticket = self._next_ticket
        self._next_ticket += 1
        if release_at is not None:
            self.last_release = release_at
        return ticket

    @contextmanager
    def turn(self, ticket: int, until: float | None) -> Iterator[None]:
        """Wait until every earlier ticket is done, then hold the lane (before any
        admission waiting for it). Raises ``TurnMissed`` when that has not happened by
        ``until`` (monotonic)."""
        with self._cond:
            while self._turn < ticket:
                remaining = None if until is None else until - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TurnMissed
                self._cond.wait(remaining)
            self._post_waiting += 1
            try:
                while self._busy:
                    self._cond.wait()
            finally:
                self._post_waiting -= 1
            self._busy = True
        try:
            yield
        finally:
            self._free()

    def done(self, ticket: int) -> None:
        """Mark a ticket done (idempotent): later tickets may take their turn."""
        with self._cond:
            if ticket < self._turn or ticket in self._done:
                return
            self._done.add(ticket)
            while self._turn in self._done:
                self._done.discard(self._turn)
                self._turn += 1
            self._cond.notify_all()

    def _join(self) -> None:
        with self._cond:
            while True:
                if self._state == "open" and (time.monotonic() - self._opened_at < ADMIT_WINDOW_S):
                    self._members += 1
                    return
                if self._state == "closed":
                    self._state = "opening"
                    self._members += 1
                    break
                self._cond.wait()
        stack = ExitStack()
        try:
            stack.enter_context(self._hold())
            self._sync()
        except BaseException:
            stack.close()
            with self._cond:
                self._members -= 1
                self._state = "closed"
                self._cond.notify_all()
            raise
        with self._cond:
            self._stack = stack
            self._state = "open"
            self._opened_at = time.monotonic()
            self._cond.notify_all()

    def _leave(self) -> None:
        with self._cond:
            self._members -= 1
            if self._members > 0:
                return
            stack, self._stack = self._stack, None
            self._state = "closing"
        try:
            if stack is not None:
                stack.close()
        finally:
            with self._cond:
                self._state = "closed"
                self._cond.notify_all()


class NoLane:
    """The lane of a scope that is not audited: no lock, no order, no chained moments."""

    def __init__(self, scope: str) -> None:
        self.scope = scope
        self.last_release: float | None = None
        self.opened_at = 0.0

    @contextmanager
    def deciding(self) -> Iterator[None]:
        yield

    def ticket(self, release_at: float | None) -> int:
        return 0

    @contextmanager
    def turn(self, ticket: int, until: float | None) -> Iterator[None]:
        yield

    def done(self, ticket: int) -> None:
        return None
