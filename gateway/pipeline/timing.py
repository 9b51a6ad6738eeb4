"""Release timing: when an answer that read protected rows may leave dpgate.

How long a query runs depends on the rows it reads: a costly expression in a CASE
branch that only some people select makes the statement slower exactly when they are
there. Answering as soon as the database does would turn response time into a channel
that noise does not cover (issue: side channels).

Under ``execution.timing: deadline`` (the default) every query that reaches the protected
database gets a release moment fixed before its statement starts, from public facts only
(Haeberlen, Pierce and Narayan, "Differential Privacy Under Fire", USENIX Security 2011:
predictable transactions — each has a deadline fixed in advance and a default outcome
when it misses it), counted from its **arrival** (``ReleaseTiming.arrived``; or from the
moment its audit lane let it in, when it had to wait for the lane to open): its own
admission — compiling, waiting for its lane, the pre-audit, the reservation — shares the
CPUs with other queries' statements, whose running time depends on the rows, so its
length must not move the release moment. The schedule gives it ``admission_ms`` (times
the load factor of the queries in flight); one that takes longer moves its schedule by a
whole step, the allowance doubled until it fits (``admitted_by``), never by its own
length. What the schedule counts (queries in flight, requests present) is what arrived
before it, whenever it is fixed. The schedule is made of:

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
Two residues of the admission remain (docs/privacy.md, "Admission moments"): which step
an overrunning admission reached, and, for two queries that arrive within one admission
of each other, which of them fixed its schedule first (the slot it got, whether it
counted the other).
"""

from __future__ import annotations

import bisect
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
from gateway.sql.compile import CompiledQuery

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
#: A query's schedule counts from its arrival (``ReleaseTiming.start``'s ``since``), up to
#: this long before it is fixed: arrivals and release moments are kept this long for it.
HORIZON_S = 5.0
#: What each request of the same audit scope ahead of a query in its lane adds to the
#: query's admission allowance, in ``admission_ms``: its pre-audit and reservation, and
#: its post-audit and ledger commit, which go first (a 20-chart dashboard of one analyst
#: on the demo, 2 cores: 12-15 ms per chart ahead, ``bench.dashboard``).
AHEAD_SHARE = 3.0
#: The smallest step by which an admission that overran its allowance moves its
#: schedule (``admitted_by``).
MIN_STEP_MS = 1.0
#: Forgotten arrivals and release moments are dropped this many at a time.
FORGET_BATCH = 256


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


def _arrived_at(arrival: Arrival) -> float:
    return arrival.at


def admitted_by(since: float, allowance_ms: float, now: float) -> float:
    """When the schedule has a query's admission done: ``allowance_ms`` after ``since``,
    or, when the admission overran that (it was done only ``now``), the first moment
    ``since + allowance·2ᵏ`` (k = 1, 2, …; the allowance at least ``MIN_STEP_MS``) not
    before ``now``. So the release moment moves only by whole steps: what an admission
    slowed by other queries' statements can show is which step it reached (a few
    values, the first nearly always), never its exact length — where a miss would
    have charged the analyst for it."""
    ready = since + allowance_ms / 1000
    if ready >= now:
        return ready
    step = max(allowance_ms, MIN_STEP_MS) / 1000
    while since + step < now:
        step *= 2
    return since + step


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


@dataclass
class Arrival:
    """A request that reached the pipeline: when (``time.monotonic()``), in which audit
    scope, and when its schedule has its admission done (``None``: not fixed yet, or
    never — refused before its statement). Public: arrival times and the schedule."""

    at: float
    scope: str | None = None
    ready: float | None = None
    #: its release moment on the public schedule (``None``: not fixed yet, or never)
    released: float | None = None


class ReleaseTiming:
    """The timing policy of one gateway: its cost model, the release moments of the
    queries in flight and the public schedule of its statement slots (all public: they
    say how loaded the gateway is)."""

    def __init__(self, execution: ExecutionConfig, model: CostModel | None) -> None:
        self.execution = execution
        self.model = model
        self._lock = threading.Lock()
        # (arrival, release moment on the public schedule) of the queries started lately
        self._pending: list[tuple[float, float]] = []
        self._prune_at = FORGET_BATCH  # prune ``_pending`` when it grows past this
        self._stretch: dict[str, float] = {}  # analysts whose misses stretch deadlines
        self._arrivals: list[Arrival] = []  # requests that reached the pipeline (by time)
        self._by_scope: dict[str, deque[Arrival]] = {}  # the same, per audit scope
        cpus = model.cpus if model is not None else cpu_count()
        #: when each statement slot's public reservation ends (``time.monotonic()``)
        self._slot_free = [0.0] * max(1, cpus)
        self.slots = StatementSlots(len(self._slot_free))

    @property
    def active(self) -> bool:
        return self.execution.timing != "off"

    def arrived(self, scope: str | None = None) -> Arrival:
        """Count a request of audit ``scope`` that reached the pipeline now (public: its
        arrival time); its schedule counts from it (``start``)."""
        if not self.active:
            return Arrival(time.monotonic(), scope)
        with self._lock:
            # read under the lock: the list stays in arrival order
            now = time.monotonic()
            arrival = Arrival(now, scope)
            self._arrivals.append(arrival)
            forget = now - ARRIVAL_WINDOW_S - HORIZON_S
            old = bisect.bisect_left(self._arrivals, forget, key=_arrived_at)
            if old > FORGET_BATCH:
                del self._arrivals[:old]
                # and the scopes nobody of which arrived lately (one per analyst)
                for quiet in [k for k, v in self._by_scope.items() if v[-1].at < forget]:
                    del self._by_scope[quiet]
            if scope is not None:
                mine = self._by_scope.setdefault(scope, deque())
                while mine and mine[0].at < forget:
                    mine.popleft()
                mine.append(arrival)
        return arrival

    def _ahead_in_scope(self, arrival: Arrival, since: float) -> int:
        """The requests of ``arrival``'s scope that arrived before it, within
        ``ARRIVAL_WINDOW_S`` of ``since``, and whose admission the schedule has not done
        by ``since`` (call holding the lock): its admission waits for theirs, one at a
        time (the lane). One whose schedule is not fixed yet has its admission done
        later than ``since`` whatever happens, so the count does not depend on when the
        others' schedules are fixed; one refused before its statement counts until it
        leaves the window (whether it was refused yet is not a public moment)."""
        if arrival.scope is None:
            return 0
        ahead = 0
        for other in self._by_scope.get(arrival.scope, ()):
            if other.at >= arrival.at:
                break
            if other.at >= since - ARRIVAL_WINDOW_S and (
                other.ready is None or other.ready > since
            ):
                ahead += 1
        return ahead

    def _interpreter_ms(self, since: float, in_flight: int) -> float:
        """The allowance for the other requests present at ``since`` (call holding the
        lock): those in flight, or arrived within ``ARRIVAL_WINDOW_S`` before it and not
        released by ``since``, whichever are more, this one aside — a function of arrival
        times and earlier release moments (arrivals after ``since`` do not count,
        whenever they came). A release moment at or before ``since`` is always fixed by
        the time this runs (a schedule is fixed, under the lock, before the release
        moment it sets, and ``since`` is not after now), so which arrivals count does not
        depend on when the others' schedules were fixed; one refused before its
        statement has no release moment and counts until it leaves the window."""
        arrivals = self._arrivals
        first = bisect.bisect_left(arrivals, since - ARRIVAL_WINDOW_S, key=_arrived_at)
        last = bisect.bisect_right(arrivals, since, key=_arrived_at)
        recent = sum(1 for a in arrivals[first:last] if a.released is None or a.released > since)
        others = max(in_flight, recent) - 1
        return self.execution.interpreter_ms * max(0, others)

    def deadline_ms(
        self,
        plan: QueryPlan,
        table: TableConfig,
        compiled: CompiledQuery,
        in_flight: int = 1,
        *,
        analyst: str | None = None,
    ) -> float | None:
        """The deadline of the plan's statement ``compiled`` (plus what follows it) for
        ``analyst`` with ``in_flight`` queries in this process, or ``None`` when timing is
        off."""
        estimate = self._estimate(plan, table, compiled)
        statement, kept = self._deadline(table, estimate, in_flight, self.stretch(analyst))
        if statement is None:
            return None
        return float(math.ceil(self._admission_ms(estimate) + statement + kept))

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

    def _estimate(
        self, plan: QueryPlan, table: TableConfig, compiled: CompiledQuery
    ) -> float | None:
        """The cost model's estimate of the statement (ms), when the model sets its
        deadline: ``None`` under a fixed deadline, without a model, or for a table it
        cannot size."""
        if self.model is None or deadline_ms(self.execution, table) is not None:
            return None
        return self.model.statement_ms(plan, compiled)

    def _deadline(
        self,
        table: TableConfig,
        estimate: float | None,
        in_flight: int,
        stretch: float = 1.0,
    ) -> tuple[float | None, float]:
        """(ms the statement may run from its slot's start, ms kept after it for noising,
        post-audit and commit), from its ``estimate`` (``_estimate``); ``(None, 0)`` when
        timing is off."""
        fixed = deadline_ms(self.execution, table)
        if fixed is not None or not self.active:
            kept = (fixed or 0) * (1 - STATEMENT_SHARE)
            return (None if fixed is None else fixed - kept), kept
        ex = self.execution
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
        compiled: CompiledQuery,
        statement_timeout_ms: int,
        *,
        arrival: Arrival | None = None,
        since: float | None = None,
        after: float | None = None,
        analyst: str | None = None,
    ) -> ReleaseClock:
        """Fix the release moment of a query of ``analyst`` that arrived as ``arrival``
        (``arrived``'s record) and is counted from ``since`` (its arrival, or the later
        moment at which its audit lane let it in; both ``None``: now), ready to run its
        statement; ``after`` is the release
        moment of the previous ticket of its audit scope (``None``: none).

        The schedule counts from ``since``, not from now: the query's own admission
        (compiling, waiting for its lane, the pre-audit, the reservation) shares the CPU
        with other queries' statements, whose running time depends on the rows, so its
        length must not move the release moment. The schedule gives it an allowance
        (``_admission_ms``); one that took longer moves it by whole steps
        (``admitted_by``).
        """
        if not self.active:
            return ReleaseClock(release_at=None, statement_timeout_ms=statement_timeout_ms)
        estimate = self._estimate(plan, table, compiled)  # a pure function: outside the lock
        with self._lock:
            # read under the lock: every schedule fixed before this one set its release
            # moment after the moment it read, so none of them is later than ``now``
            now = time.monotonic()
            if since is None:
                since = now if arrival is None else arrival.at
            since = min(since, now)
            self._forget_pending(now)
            # queries that arrived before this one and are released after its arrival
            in_flight = 1 + sum(1 for a, t in self._pending if a <= since < t)
            # the public schedule (slots, queries in flight) takes the unstretched
            # deadline: one analyst's misses move no other analyst's release moment
            scheduled, kept = self._deadline(table, estimate, in_flight)
            stretch = 1.0 if analyst is None else self._stretch.get(analyst, 1.0)
            statement, _ = self._deadline(table, estimate, in_flight, stretch)
            assert statement is not None and scheduled is not None
            # Only statements the cost model sizes take a slot: a fixed or fallback
            # deadline is a worst case chosen for any concurrency, and reserving a slot
            # for all of it would hold the others back for nothing.
            scheduling = estimate is not None
            # the others' Python work: this query's allowance, not its slot's reservation
            shared = self._interpreter_ms(since, in_flight) if scheduling else 0.0
            ahead = 0 if arrival is None else self._ahead_in_scope(arrival, since)
            allowance = self._admission_ms(estimate, in_flight, ahead)
            ready = admitted_by(since, allowance, now)
            slot = min(range(len(self._slot_free)), key=self._slot_free.__getitem__)
            starts_at = max(ready, self._slot_free[slot]) if scheduling else ready
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
            self._pending.append((since, on_schedule))
            if arrival is not None:
                arrival.ready = ready
                arrival.released = on_schedule
        return ReleaseClock(
            release_at=release_at,
            statement_timeout_ms=max(1, min(statement_timeout_ms, int((until - now) * 1000))),
            statement_until=until,
            deadline_ms=math.ceil((release_at - since) * 1000),
            starts_at=starts_at if scheduling else None,
            fixed_at=now,
        )

    def _forget_pending(self, now: float) -> None:
        """Drop release moments no query fixed from now on can count (holding the lock):
        those before the earliest ``since`` still possible, ``HORIZON_S`` ago."""
        if len(self._pending) > self._prune_at:  # amortised: not a rebuild per query
            horizon = now - HORIZON_S
            self._pending = [(a, t) for a, t in self._pending if t > horizon]
            self._prune_at = max(FORGET_BATCH, 2 * len(self._pending))

    def _admission_ms(self, estimate: float | None, in_flight: int = 1, ahead: int = 0) -> float:
        """The schedule's allowance for a query's admission with ``in_flight`` queries in
        this process and ``ahead`` of its own scope before it in the lane:
        ``admission_ms`` times the load factor of those in flight (its Python work
        shares the CPUs with theirs), plus ``AHEAD_SHARE`` times that for each one ahead
        (their admissions and post-audits hold the lane first, one at a time), under
        the cost model; a fixed or fallback deadline, a worst case, counts from the
        arrival and includes it."""
        if self.model is None or estimate is None:
            return 0.0
        return self.execution.admission_ms * (
            self.model.load_factor(in_flight) + AHEAD_SHARE * ahead
        )
