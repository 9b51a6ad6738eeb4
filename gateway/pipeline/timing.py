"""Release timing: when an answer that read protected rows may leave dpgate.

How long a query runs depends on the rows it reads: a costly expression in a CASE
branch that only some people select makes the statement slower exactly when they are
there. Answering as soon as the database does would turn response time into a channel
that noise does not cover (issue: side channels).

Under ``execution.timing: deadline`` (the default) every query that reaches the protected
database gets a release moment fixed before its statement starts, from public facts only
(Haeberlen, Pierce and Narayan, "Differential Privacy Under Fire", USENIX Security 2011:
predictable transactions — each has a deadline fixed in advance and a default outcome
when it misses it):

- its statement's **slot** (when the cost model sizes its deadline): at most ``cpus``
  such statements of this process run at once (``StatementSlots``), on a public
  schedule — each slot is reserved from a statement's public start to its
  ``statement_until``, and the next statement given that slot starts
  (by the schedule) when the reservation ends, not when the statement really ended. So a
  statement shares the CPUs with at most ``cpus - 1`` others whatever arrives after it,
  and its deadline can be sized for that; it may start earlier when a slot is really
  free (which only makes it finish sooner: its release moment does not move);
- its deadline: the cost model's estimate of the statement (``gateway.pipeline.cost_model``: the
  plan, declared row counts, the engine's per-row costs) times
  ``execution.deadline_margin`` and the load factor of the statements that can run
  beside it, never below ``min_deadline_ms``, counted from the slot's public start, plus
  ``post_ms`` (times the load factor of the queries in flight) for noising, the
  post-audit and the ledger commit, plus ``interpreter_ms`` for each other request
  present in the process (``ReleaseTiming.arrived``: those that reached the pipeline in
  the last ``ARRIVAL_WINDOW_S``, or in flight): their own Python work — planning,
  admission, noising, the post-audit, serialising — holds the interpreter the
  statement's thread needs to start, enter its slot and fetch its rows (a dashboard's
  first chart missed its deadline while the nineteen after it were planned). That term
  lengthens this query's allowance only, not its slot's reservation, so it does not
  push the statements after it; or the fixed ``deadline_ms`` of the table or of
  ``execution`` when set; or ``FALLBACK_DEADLINE_MS`` for a table without a declared row
  count;
- within an audit scope, never earlier than the previous ticket's release moment plus
  the time for one post-audit (``gateway.pipeline.lanes``: post-audits run in ticket order).

The answer — or the error, or the post-audit refusal — is held until that moment. The
statement may run until ``statement_until`` (the release moment less the time kept for
what follows it); one still running then is abandoned (cancelled in the background,
whatever the engine does with the cancel), charged, and reported at the release moment
with the same message as any other failure after the database was reached (a miss:
``dpgate_deadline_misses_total``).

Every input of the release moment is public: the plan, the config (declared row
counts, per-row costs), the catalogue's unique keys, the arrival time and the release
moments and slot reservations of earlier queries (which fix how many statements are in
flight). None of them is a running time of a statement, nor read from the protected rows.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from gateway.core.config import ExecutionConfig, TableConfig
from gateway.core.plan import QueryPlan
from gateway.pipeline.cost_model import CostModel, cpu_count, machine_load

#: Under a fixed ``deadline_ms``, the statement may use this share of it; the rest is
#: kept for what follows it (noise from the pre-drawn pool, the post-audit, the durable
#: ledger commit), so that the answer is ready before its release moment.
STATEMENT_SHARE = 0.8
#: The deadline of a query on a table whose row count is not declared (``tables.<t>.rows``)
#: and that has no ``deadline_ms``: the cost model cannot size it, so it gets the fixed
#: deadline dpgate always had.
FALLBACK_DEADLINE_MS = 250
#: Release moments of one scope's consecutive tickets are at least this far apart (times
#: the load factor of the statements beside it): room for one post-audit — a ticket's
#: post-audit waits for the previous ticket's, which is done by that ticket's own release
#: moment less the time it kept for its ledger commit.
RELEASE_GAP_S = 0.002
#: An analyst's own misses stretch their later deadlines (``ReleaseTiming.observe``):
#: each miss multiplies the stretch by ``STRETCH_ON_MISS`` (up to ``MAX_STRETCH``), each
#: answer released on time by ``STRETCH_ON_TIME`` (down to 1).
STRETCH_ON_MISS = 2.0
STRETCH_ON_TIME = 0.9
MAX_STRETCH = 8.0
#: Requests that reached the pipeline this recently count as present beside a statement
#: (``ReleaseTiming.arrived``), admitted yet or not.
ARRIVAL_WINDOW_S = 0.5


@dataclass(frozen=True)
class ReleaseClock:
    """The release moment of one query (``None``: release at once), the moment its
    statement is abandoned, the statement timeout that goes with it, and the public
    start of its statement slot (``StatementSlots``)."""

    release_at: float | None
    statement_timeout_ms: int
    statement_until: float | None = None
    deadline_ms: float | None = None
    starts_at: float | None = None
    fixed_at: float | None = None  # when this clock was fixed (``time.monotonic()``)

    def wait(self) -> float:
        """Sleep until the release moment; return the seconds spent waiting."""
        if self.release_at is None:
            return 0.0
        pause = self.release_at - time.monotonic()
        if pause > 0:
            time.sleep(pause)
            return pause
        return 0.0


def deadline_ms(execution: ExecutionConfig, table: TableConfig) -> int | None:
    """The table's fixed release deadline in milliseconds, or ``None`` when timing is off
    or the cost model sets it per query (``ReleaseTiming.deadline_ms``)."""
    if execution.timing == "off":
        return None
    return table.deadline_ms if table.deadline_ms is not None else execution.deadline_ms


class StatementSlots:
    """At most ``slots`` statements of this process running at once, on a public schedule.

    A statement enters when fewer than ``slots`` are running, or at its slot's public
    start (``ReleaseClock.starts_at``) whatever is running then: the schedule reserved
    the slot for it from that moment (the statement before it in the slot was done or
    abandoned by then), so an abandoned statement that runs on in the background cannot
    hold a later one back past its reservation. Entering early changes no release moment:
    it only leaves the statement more of its deadline."""

    def __init__(self, slots: int) -> None:
        self.slots = max(1, slots)
        self._cond = threading.Condition()
        self._running = 0

    @contextmanager
    def enter(self, starts_at: float | None) -> Iterator[None]:
        with self._cond:
            while self._running >= self.slots:
                remaining = None if starts_at is None else starts_at - time.monotonic()
                if remaining is not None and remaining <= 0:
                    break
                self._cond.wait(remaining)
            self._running += 1
        try:
            yield
        finally:
            with self._cond:
                self._running -= 1
                self._cond.notify()


class ReleaseTiming:
    """The timing policy of one gateway: its cost model, the release moments of the
    queries in flight and the public schedule of its statement slots (all public: they
    say how loaded the gateway is)."""

    def __init__(self, execution: ExecutionConfig, model: CostModel | None) -> None:
        self.execution = execution
        self.model = model
        self._lock = threading.Lock()
        self._pending: list[float] = []  # release moments not yet past
        self._stretch: dict[str, float] = {}  # analysts whose misses stretch deadlines
        self._arrivals: deque[float] = deque()  # when requests reached the pipeline
        cpus = model.cpus if model is not None else cpu_count()
        #: when each statement slot's public reservation ends (``time.monotonic()``)
        self._slot_free = [0.0] * max(1, cpus)
        self.slots = StatementSlots(len(self._slot_free))

    @property
    def active(self) -> bool:
        return self.execution.timing != "off"

    def arrived(self) -> None:
        """Count a request that reached the pipeline now (public: its arrival time)."""
        if not self.active:
            return
        now = time.monotonic()
        with self._lock:
            self._arrivals.append(now)
            self._forget_arrivals(now)

    def _forget_arrivals(self, now: float) -> None:
        while self._arrivals and self._arrivals[0] < now - ARRIVAL_WINDOW_S:
            self._arrivals.popleft()

    def _interpreter_ms(self, now: float, in_flight: int) -> float:
        """The allowance for the other requests present (call holding the lock): those in
        flight, or arrived within ``ARRIVAL_WINDOW_S``, whichever are more, this one
        aside — a function of arrival times and earlier release moments."""
        self._forget_arrivals(now)
        others = max(in_flight, len(self._arrivals)) - 1
        return self.execution.interpreter_ms * max(0, others)

    def deadline_ms(
        self,
        plan: QueryPlan,
        table: TableConfig,
        sql: str,
        in_flight: int = 1,
        *,
        analyst: str | None = None,
    ) -> float | None:
        """The deadline of the plan's statement ``sql`` (plus what follows it) for
        ``analyst`` with ``in_flight`` queries in this process, or ``None`` when timing is
        off."""
        statement, kept = self._deadline(plan, table, sql, in_flight, self.stretch(analyst))
        return None if statement is None else float(math.ceil(statement + kept))

    def stretch(self, analyst: str | None) -> float:
        """How much ``analyst``'s own earlier misses stretch their statements' deadlines
        (1: none, or no analyst)."""
        if analyst is None:
            return 1.0
        with self._lock:
            return self._stretch.get(analyst, 1.0)

    def observe(self, analyst: str, missed: bool) -> None:
        """Record, at its release moment, whether ``analyst``'s query missed its deadline
        (a charged failure or a late answer, which the analyst has just seen) or was
        released on time: later deadlines of that analyst stretch after a miss and shrink
        back with answers on time. A function of outcomes released to that analyst only:
        another analyst's deadlines never move with it (docs/privacy.md, "Timing")."""
        if not self.active:
            return
        with self._lock:
            now = self._stretch.get(analyst, 1.0)
            if missed:
                now = min(MAX_STRETCH, now * STRETCH_ON_MISS)
            else:
                now = max(1.0, now * STRETCH_ON_TIME)
            if now > 1.0:
                self._stretch[analyst] = now
            else:
                self._stretch.pop(analyst, None)

    def _deadline(
        self,
        plan: QueryPlan,
        table: TableConfig,
        sql: str,
        in_flight: int,
        stretch: float = 1.0,
    ) -> tuple[float | None, float]:
        """(ms the statement may run from its slot's start, ms kept after it for noising,
        post-audit and commit); ``(None, 0)`` when timing is off."""
        fixed = deadline_ms(self.execution, table)
        if fixed is not None or not self.active:
            kept = (fixed or 0) * (1 - STATEMENT_SHARE)
            return (None if fixed is None else fixed - kept), kept
        ex = self.execution
        estimate = None if self.model is None else self.model.statement_ms(plan, sql)
        if estimate is None or self.model is None:
            kept = FALLBACK_DEADLINE_MS * (1 - STATEMENT_SHARE)
            return FALLBACK_DEADLINE_MS - kept, kept
        # The machine's load average is not public (it counts our own statements, whose
        # running time may depend on the rows): only an admin's explicit choice adds it.
        load = machine_load() if ex.load_aware else 0.0
        # Beside a statement run at most the other slots' statements and, while other
        # queries are in flight, one thread of the gateway's own work (planning, noising,
        # the ledger: Python holds one CPU at a time for it).
        beside = min(in_flight, len(self._slot_free) + 1)
        statement = max(
            float(ex.min_deadline_ms),
            estimate * self.model.load_factor(beside, load) * ex.deadline_margin * stretch,
        )
        # the work after the statement shares the CPU with every query in flight
        kept = ex.post_ms * self.model.load_factor(in_flight, load)
        return statement, kept

    def start(
        self,
        plan: QueryPlan,
        table: TableConfig,
        sql: str,
        statement_timeout_ms: int,
        *,
        after: float | None = None,
        analyst: str | None = None,
    ) -> ReleaseClock:
        """Fix the release moment of a query of ``analyst`` ready to run its statement
        now; ``after`` is the release moment of the previous ticket of its audit scope
        (``None``: none)."""
        if not self.active:
            return ReleaseClock(release_at=None, statement_timeout_ms=statement_timeout_ms)
        now = time.monotonic()
        with self._lock:
            self._pending = [t for t in self._pending if t > now]
            in_flight = len(self._pending) + 1
            # the public schedule (slots, queries in flight) takes the unstretched
            # deadline: one analyst's misses move no other analyst's release moment
            scheduled, kept = self._deadline(plan, table, sql, in_flight)
            stretch = 1.0 if analyst is None else self._stretch.get(analyst, 1.0)
            statement, _ = self._deadline(plan, table, sql, in_flight, stretch)
            assert statement is not None and scheduled is not None
            # Only statements the cost model sizes take a slot: a fixed or fallback
            # deadline is a worst case chosen for any concurrency, and reserving a slot
            # for all of it would hold the others back for nothing.
            scheduling = self._model_sized(plan, table, sql)
            # the others' Python work: this query's allowance, not its slot's reservation
            shared = self._interpreter_ms(now, in_flight) if scheduling else 0.0
            slot = min(range(len(self._slot_free)), key=self._slot_free.__getitem__)
            starts_at = max(now, self._slot_free[slot]) if scheduling else now
            earliest = 0.0
            if after is not None:
                # room for this one's post-audit once the previous ticket's is done
                beside = min(in_flight, len(self._slot_free) + 1)
                factor = 1.0 if self.model is None else self.model.load_factor(beside)
                earliest = after + RELEASE_GAP_S * factor
            release_at = max(starts_at + (statement + shared + kept) / 1000, earliest)
            on_schedule = max(starts_at + (scheduled + shared + kept) / 1000, earliest)
            until = release_at - kept / 1000
            if scheduling:
                self._slot_free[slot] = max(starts_at + scheduled / 1000, earliest - kept / 1000)
            self._pending.append(on_schedule)
        return ReleaseClock(
            release_at=release_at,
            statement_timeout_ms=max(1, min(statement_timeout_ms, int((until - now) * 1000))),
            statement_until=until,
            deadline_ms=math.ceil((release_at - now) * 1000),
            starts_at=starts_at if scheduling else None,
            fixed_at=now,
        )

    def _model_sized(self, plan: QueryPlan, table: TableConfig, sql: str) -> bool:
        """Whether the cost model sets this statement's deadline (not a fixed one)."""
        if deadline_ms(self.execution, table) is not None or self.model is None:
            return False
        return self.model.statement_ms(plan, sql) is not None
