"""The Gateway: one query's way from a checked request to a released answer, stage by stage.

    request → identify + answer cache (one ledger read) → plan → [audit scope: pre-audit
    → reserve → execute → noise → post-audit → post-process → record] → response

Each stage is a module with one entry point: ``request`` (the only check of ε, δ and
mechanism), ``planning`` (plan cache, calibration, cache key), ``identity`` with
``answer_cache`` (who is asking, and a release they may reuse, in one read),
``audit_policy`` (``audit.mode``, scope locks, pre- and post-audit), ``charges`` (reserve,
outcome, refund; the ledger's errors), ``compile`` and ``execute``, ``noising``,
``postprocess``, ``release``; a nested aggregation's outer query runs last, on the
inner query's release (``post_query``).

Invariants kept here (docs/design.md): nothing computed from protected rows leaves
except as a noisy value whose cost was durably reserved in the ledger first (1); every
failure before ``reserve`` costs nothing; after it, only a failure to reach the database
at all is refunded — once the statement is sent, an error, a timeout or a post-audit
refusal stays charged and releases nothing (2); an identical request gets the identical
release, free (7); the auditor sees only plans and noisy values (8); every query that
reaches the database is answered at a release moment fixed from public facts, and costs
at least the configured minimum (9; ``gateway.pipeline.timing``).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any, NoReturn

import sqlalchemy as sa

import budget
from budget import BudgetStatus, CacheProbe, Lookup, Reservation
from gateway.core.config import Config, with_enforced_domains, with_nullability
from gateway.core.errors import DatabaseUnavailable, Forbidden, GatewayError, LedgerUnavailable
from gateway.core.plan import ProbePlan, QueryPlan, QueryRequest
from gateway.ops import metrics
from gateway.pipeline.access import Access
from gateway.pipeline.answer_cache import AnswerCache
from gateway.pipeline.audit_policy import AuditPolicy, PreAudit
from gateway.pipeline.catalog import public_schema
from gateway.pipeline.charges import (
    Charges,
    charged_ledger_failure,
    ledger_errors,
    uncharged_ledger_failures,
)
from gateway.pipeline.cost_model import CostModel, build_model
from gateway.pipeline.dry_run import dry_run
from gateway.pipeline.identity import Principal, identify
from gateway.pipeline.lanes import NoLane, ScopeLane, TurnMissed
from gateway.pipeline.noising import add_noise
from gateway.pipeline.planning import PLAN_CACHE_SIZE, PlannedQuery, Planner
from gateway.pipeline.post_query import run_post_query
from gateway.pipeline.postprocess import finish, shown
from gateway.pipeline.quantiles import rank_windows
from gateway.pipeline.release import NO_PRIVACY_SPENT, ColumnInfo, Release, privacy_spent
from gateway.pipeline.request import check_request
from gateway.pipeline.sso import TokenVerifier
from gateway.pipeline.timing import ReleaseClock, ReleaseTiming
from gateway.sql.compile import CompiledQuery, compile_plan
from gateway.sql.execute import (
    StatementFailed,
    check_parses,
    domains_enforced_by_schema,
    nullability_by_schema,
    open_protected_engine,
    ping,
    run_aggregate,
    run_aggregate_until,
    sqlglot_dialect,
    units_unique_by_schema,
)
from gateway.sql.join_keys import join_keys_by_schema, with_public_keys_as_units
from gateway.sql.public_lookups import read_public_lookups
from mechanisms import prefill

log = logging.getLogger("dpgate.pipeline")

#: A ready answer is reused this long (seconds): /readyz needs no key, and each probe
#: is a durable write to the ledger. A failed probe is not reused: recovery shows at once.
READY_PROBE_INTERVAL_S = 0.5
CHARGED_FAILURE_MESSAGE = (
    "the protected database did not complete this query before its deadline; the query "
    "was charged and nothing was released (a query that keeps failing may need a later "
    "deadline: ask the administrator)"
)


def _admit_anyone(principal: Principal) -> None:
    return None


class Gateway:
    """One configured dpgate: the protected database, the ledger and the auditor."""

    def __init__(
        self,
        config: Config,
        *,
        engine: sa.Engine | None = None,
        ledger: budget.Ledger | None = None,
    ) -> None:
        self.engine = engine or open_protected_engine(
            config.database.url, statement_timeout_ms=config.database.statement_timeout_ms
        )
        self.dialect = sqlglot_dialect(self.engine)
        # undeclared ``nullable:`` comes from the catalogue (gateway/core/domain.py)
        nullable = nullability_by_schema(self.engine, config.tables)
        tables = with_nullability(config.tables, nullable)
        # columns the database keeps in their domain need no filter (gateway/sql/constraints.py)
        tables = with_enforced_domains(tables, *domains_enforced_by_schema(self.engine, tables))
        self.config = config = replace(config, tables=tables)
        self.unique_units = units_unique_by_schema(self.engine, config.tables)
        # what the catalogue proves about each declared join on this engine (issue 31)
        keyed = with_public_keys_as_units(config.tables)
        unique_keys = frozenset(self.unique_units | units_unique_by_schema(self.engine, keyed))
        self.join_keys = join_keys_by_schema(self.engine, config.tables, unique_keys)
        self.ledger = ledger or budget.Ledger.from_url(
            config.ledger.url, **config.privacy.ledger_options()
        )
        self.ledger.migrate()
        self.ledger.on_connection_wait = metrics.watch_ledger_pool(self.ledger.engine)
        metrics.record_build_info()
        for a in config.analysts:
            self.ledger.ensure_analyst(a.name, a.epsilon, a.delta, a.period)
        data_version = config.database.data_version
        self.planner = Planner(config.tables, config.privacy, data_version)
        self.access = Access(
            config.tables,
            config.access,
            lambda tables: Planner(tables, config.privacy, data_version),
        )
        self.tokens = TokenVerifier(config.sso) if config.sso is not None else None
        # the tables every analyst may read, as the latest request's ledger read found
        # them (what a request is planned against before its caller is known)
        self._open_tables = self.access.open_tables(self.ledger.access())
        self.charges = Charges(self.ledger, data_version)
        self.cache = AnswerCache(self.ledger, config.cache.scope, data_version)
        # public lookups' rows, where the auditor may read them (gateway/sql/public_lookups.py)
        public = read_public_lookups(self.engine, config.tables, self.join_keys, self.dialect)
        self.audit = AuditPolicy(
            config.audit, config.tables, self.ledger, self.planner, self.charges, public
        )
        self.auditor = self.audit.auditor
        # Compiled statements of recent plans (compiling is a pure function of the plan
        # and the public config, and costs more than the rest of planning together).
        self._compiled: OrderedDict[str, CompiledQuery] = OrderedDict()
        self._compiled_lock = threading.Lock()
        self._ready_lock = threading.Lock()
        self._ready: dict[str, bool] | None = None
        self._ready_at = 0.0
        self.timing = ReleaseTiming(config.execution, self._cost_model())

    def _cost_model(self) -> CostModel | None:
        """The cost model (``gateway.pipeline.cost_model``) of the tables whose deadline it sets:
        from the config and the catalogue only; ``None`` when it sets none."""
        ex = self.config.execution
        if ex.timing == "off" or ex.deadline_ms is not None:
            return None
        return build_model(ex, self.config.tables, self.dialect, self.unique_units)

    # -- identity and public metadata ----------------------------------------------------

    def authenticate(self, key: str | None) -> Principal:
        """The caller behind a bearer key or token; raises ``Unauthenticated`` or
        ``Forbidden``."""
        return identify(self.ledger, key, self.config.admin_key, tokens=self.tokens)[0]

    def readable(self, principal: Principal) -> frozenset[str]:
        """The declared tables ``principal`` may read (``gateway.pipeline.access``): all, for an
        admin; one read of the ledger."""
        if principal.is_admin:
            return self.access.all_tables
        with ledger_errors():
            stored = self.ledger.access(principal.name)
        return self.access.readable(stored, principal.groups)

    def planner_for(self, readable: frozenset[str]) -> Planner:
        """The planner of a caller who may read ``readable``: other tables do not exist
        for it."""
        if readable == self.access.all_tables:
            return self.planner
        view = self.access.view(readable)
        assert isinstance(view, Planner)
        return view

    def schema(self, principal: Principal | None = None) -> dict[str, Any]:
        """What the admin declared public — tables, columns, types, bounds, value domains
        — of the tables ``principal`` may read (every table when ``None``)."""
        if principal is None:
            return public_schema(self.config.tables)
        return public_schema(self.access.tables_of(self.readable(principal)))

    def budget(self, analyst: str) -> dict[str, Any]:
        return self.charges.status(analyst).to_json()

    def history(self, analyst: str, *, limit: int = 1000) -> list[dict[str, Any]]:
        """The analyst's own charged and refused queries, as JSON (``GET /v1/queries``)."""
        return self.charges.history(analyst, limit=limit)

    def ready(self) -> dict[str, bool]:
        """Whether the protected database answers and the ledger takes a write (a ready
        answer is reused for ``READY_PROBE_INTERVAL_S``). A ledger that is back first gets
        the outcomes it missed (``Charges.settle_pending``)."""
        now = time.monotonic()
        with self._ready_lock:
            if self._ready is not None and now - self._ready_at < READY_PROBE_INTERVAL_S:
                return self._ready
            ledger_ok = True
            try:
                self.ledger.probe_write()
                self.charges.settle_pending()
            except Exception:
                log.warning("ledger readiness probe failed", exc_info=True)
                ledger_ok = False
            checks = {"database": ping(self.engine), "ledger": ledger_ok}
            self._ready = checks if all(checks.values()) else None
            self._ready_at = time.monotonic()
            return checks

    def analyze(self, sql: str, readable: frozenset[str] | None = None) -> Any:
        """The plan of ``sql`` (from the plan cache when it was seen recently), against
        the tables ``readable`` (all when ``None``)."""
        planner = self.planner if readable is None else self.planner_for(readable)
        return planner.analyze(sql)

    # -- the pipeline --------------------------------------------------------------------

    def query(
        self, analyst: str, request: QueryRequest, groups: frozenset[str] = frozenset()
    ) -> Release:
        """Answer one request of a known ``analyst`` (in-process callers, the wire front
        end; ``groups``: a token's), or raise the ``GatewayError`` that says why not.
        The tables the analyst may not read do not exist for this request. As ``answer``
        does, the grants and a release to reuse come from one ledger read."""
        seen_open = self._open_tables
        planned, refusal = self._plan(self.planner_for(seen_open), request)
        with ledger_errors():
            found = self.ledger.lookup(
                None,
                self._probe_for(planned),
                access=True,
                groups=self.access.configured_restricts,
                name=analyst,
            )
        principal = Principal(analyst, is_admin=False, groups=groups)
        if found.analyst is None:  # not in the ledger: refused where it is charged
            found = Lookup(None, access=self.ledger.access(analyst))
        return self._respond(principal, found, request, seen_open, planned, refusal)

    def answer(
        self,
        key: str | None,
        request: QueryRequest,
        *,
        admit: Callable[[Principal], None] = _admit_anyone,
    ) -> tuple[Principal, Release]:
        """Answer a request that carries its bearer ``key`` (the HTTP and wire front
        ends): the caller and a release they may reuse come from one ledger read.
        ``admit`` runs once the caller is known (rate limits), before anything else
        they could observe. Who is asking is checked before what is asked."""
        # Planned before the caller is known against the tables every analyst may read
        # (as the last request found them): a table closed to some analyst is unknown
        # here, alike for one that is not declared, so what this costs cannot tell them
        # apart (gateway.pipeline.access).
        seen_open = self._open_tables
        planned, refusal = self._plan(self.planner_for(seen_open), request)
        principal, lookup = identify(
            self.ledger,
            key,
            self.config.admin_key,
            self._probe_for(planned),
            access=True,
            groups=self.access.configured_restricts,
            tokens=self.tokens,
        )
        if principal.is_admin:
            raise Forbidden("the admin key cannot run queries: use an analyst's key")
        admit(principal)
        assert lookup is not None
        return principal, self._respond(principal, lookup, request, seen_open, planned, refusal)

    def _probe_for(self, planned: PlannedQuery | ProbePlan | None) -> CacheProbe | None:
        """What the caller's ledger read looks for: the release of an answerable request."""
        if isinstance(planned, PlannedQuery) and not planned.request.dry_run:
            return self.cache.probe(planned)
        return None

    def _respond(
        self,
        principal: Principal,
        lookup: Lookup,
        request: QueryRequest,
        seen_open: frozenset[str],
        planned: PlannedQuery | ProbePlan | None,
        refusal: GatewayError | None,
    ) -> Release:
        """The answer to ``request``, planned against ``seen_open`` before its caller was
        known, once one ledger read (``lookup``) has brought the caller's grants and the
        release that plan may reuse."""
        self._open_tables = self.access.open_tables(lookup.access)
        readable = self.access.readable(lookup.access, principal.groups)
        if readable != seen_open:
            # Planned again as if only the tables the caller may read were declared. A
            # plan both planners make is the same plan, with the same cache key: the
            # lookup's release stands; otherwise nothing was probed yet. (Refusals are not
            # kept by a planner: a closed table's name is parsed and refused afresh, as
            # an undeclared one is, whoever asked about it before.)
            probed = self._probe_for(planned) is not None
            planned, refusal = self._plan(self.planner_for(readable), request)
            probe = self._probe_for(planned)
            if probe is not None and not probed:
                assert isinstance(planned, PlannedQuery)
                with ledger_errors():  # the release and the budget, in one more read
                    found = self.ledger.lookup(None, probe, name=principal.name)
                if self.cache.usable(found.release) and found.budget is not None:
                    assert found.release is not None
                    hit = self.cache.hit(planned, found.release, found.budget)
                    return _post_process(planned, hit)
        if refusal is not None:
            raise refusal
        assert planned is not None
        if isinstance(planned, ProbePlan):
            return self._probe(self.charges.status(principal.name), planned)
        if self.cache.usable(lookup.release) and lookup.budget is not None:
            assert lookup.release is not None
            hit = self.cache.hit(planned, lookup.release, lookup.budget)
            return _post_process(planned, hit)
        return _post_process(planned, self._answer(principal.name, planned))

    def _plan(
        self, planner: Planner, request: QueryRequest
    ) -> tuple[PlannedQuery | ProbePlan | None, GatewayError | None]:
        """The request checked and planned, or the refusal (reported once the caller is
        known to be allowed: who is asking is checked before what is asked)."""
        try:
            check_request(request, self.config.privacy)
            return planner.plan(request), None
        except GatewayError as e:
            return None, e

    def _answer(self, analyst: str, planned: PlannedQuery) -> Release:
        """A planned request that is not in the cache: a dry run, or the data's turn."""
        if planned.request.dry_run:
            with uncharged_ledger_failures():  # the audit's scope lock: nothing is charged
                return self._dry_run(analyst, planned)
        plan, calibration = planned.plan, planned.calibration
        table = self.config.tables[plan.table]
        # present beside the statements that start meanwhile; its schedule counts from here
        arrived = self.timing.arrived(self.audit.scope_of(analyst) if self.audit.active else None)
        compiled = self._compile(planned)  # pure functions of the plan: outside the lane
        _prefill(planned)
        # The scope lock's own failure is the ledger's, before anything is charged.
        with uncharged_ledger_failures(), self.audit.lane(analyst) as lane:
            with lane.deciding():
                pre = self.audit.before(lane.scope, analyst, planned)
                reservation = self.charges.reserve(
                    analyst, planned.request, calibration.cost, planned.key
                )
                clock = self.timing.start(
                    plan,
                    table,
                    compiled,
                    self.config.database.statement_timeout_ms,
                    arrival=arrived,
                    since=max(arrived.at, lane.opened_at),
                    after=lane.last_release,
                    analyst=self._stretched(analyst),
                )
                ticket = lane.ticket(clock.release_at)
                if clock.fixed_at is not None:  # what the admission took (its allowance aside)
                    metrics.record_statement_phase("admission", clock.fixed_at - arrived.at)
                # its outcome is not shown (cache, history) before its release moment
                self.charges.hold(reservation, clock.release_at)
            answered = False
            missed = _Missed()
            trace = _Trace()
            try:
                release = self._release(
                    lane, ticket, planned, compiled, reservation, clock, pre, missed, trace
                )
                answered = True
                return release
            except (LedgerUnavailable, budget.LedgerUnavailable) as e:
                if isinstance(e, LedgerUnavailable) and e.detail.get("charged") is True:
                    raise
                raise charged_ledger_failure() from None  # the charge above stands
            finally:
                lane.done(ticket)
                # Whatever happened — answer, failure, withheld — it leaves at the release
                # moment fixed before execution (invariant: observables are public or DP).
                ready = time.monotonic()
                held = clock.wait()
                if clock.release_at is not None:
                    metrics.record_release_wait(held)
                    # a failure is counted once, by the stage that failed (statement, turn)
                    late = held == 0.0 and answered
                    # what the analyst sees now, at the release moment: their next
                    # deadlines follow it (gateway.pipeline.timing: stretch)
                    stretched = self._stretched(analyst)
                    if stretched is not None and (answered or missed.stage is not None):
                        self.timing.observe(stretched, missed.stage is not None or late)
                    after = trace.report_after(clock) if answered else ""
                    if late:
                        metrics.record_deadline_miss("release", plan.table)
                        kept = clock.release_at - (clock.statement_until or clock.release_at)
                        log.warning(
                            "deadline miss: query %s was ready %.1f ms after its release "
                            "moment (deadline %.0f ms, %.1f ms kept after its statement): %s",
                            reservation.id,
                            (ready - clock.release_at) * 1000,
                            clock.deadline_ms or 0,
                            kept * 1000,
                            after,
                        )

    def _stretched(self, analyst: str) -> str | None:
        """Whose own misses stretch this analyst's deadlines (``gateway.pipeline.timing``): their
        own, unless a global audit scope chains their release moments to everyone's
        (then nobody's, so that one analyst's misses move no other's release moment)."""
        if self.audit.active and self.audit.scope_kind != "analyst":
            return None
        return analyst

    def _dry_run(self, analyst: str, planned: PlannedQuery) -> Release:
        """The plan, cost and expected accuracy of a request; nothing runs or is charged."""
        release = dry_run(
            planned,
            self.charges,
            analyst,
            self.config.execution,
            self.config.tables,
            self.audit.predict(analyst, planned),
        )
        # the cost model's deadline on an idle gateway (public: plan, config, model)
        table = self.config.tables[planned.plan.table]
        deadline = self.timing.deadline_ms(
            planned.plan, table, self._compile(planned), analyst=self._stretched(analyst)
        )
        ms = None if deadline is None else int(deadline)
        return replace(release, extra={**release.extra, "release_deadline_ms": ms})

    def _compile(self, planned: PlannedQuery) -> CompiledQuery:
        """The one statement of a plan (from the cache of recently compiled plans)."""
        windows = rank_windows(planned.plan, planned.calibration.choices)
        key = (
            f"{planned.plan.canonical_sql}\x00{windows}" if windows else planned.plan.canonical_sql
        )
        with self._compiled_lock:
            compiled = self._compiled.get(key)
            if compiled is not None:
                self._compiled.move_to_end(key)
                return compiled
        compiled = self.compile(planned.plan, windows or None)
        check_parses(compiled.sql, self.dialect)  # refused free, before the charge
        with self._compiled_lock:
            self._compiled[key] = compiled
            if len(self._compiled) > PLAN_CACHE_SIZE:
                self._compiled.popitem(last=False)
        return compiled

    def compile(
        self, plan: QueryPlan, rank_windows: Sequence[Fraction] | None = None
    ) -> CompiledQuery:
        """The one statement of ``plan`` on this gateway's database, with what its
        catalogue proves (unique units, join keys) and nothing more; its quantiles
        return the buckets within ``rank_windows`` of their targets (the widest window
        without them: ``gateway.sql.compile.compile_plan``)."""
        return compile_plan(
            plan,
            self.config.tables[plan.table],
            self.dialect,
            unit_unique=plan.table in self.unique_units,
            join_keys=self.join_keys,
            rank_windows=rank_windows,
        )

    def _release(
        self,
        lane: ScopeLane | NoLane,
        ticket: int,
        planned: PlannedQuery,
        compiled: CompiledQuery,
        reservation: Reservation,
        clock: ReleaseClock,
        pre: PreAudit,
        missed: _Missed,
        trace: _Trace,
    ) -> Release:
        """Execute a reserved query, noise it, post-audit it in its ticket's turn
        (``gateway.pipeline.lanes``), post-process it and record it."""
        plan, calibration = planned.plan, planned.calibration
        slots = self.timing.slots if clock.starts_at is not None else None

        def run_in_slot(engine: sa.Engine, sql: str, *, timeout_ms: int) -> Any:
            # in its slot of the public schedule (gateway.pipeline.timing.StatementSlots)
            if slots is None:
                rows = run_aggregate(engine, sql, timeout_ms=timeout_ms)
                trace.ended = time.monotonic()
                return rows
            trace.running = time.monotonic()
            with slots.enter(clock.starts_at):
                trace.entered = time.monotonic()
                if clock.statement_until is not None:  # what is left after the wait
                    left = int((clock.statement_until - trace.entered) * 1000)
                    timeout_ms = max(1, min(timeout_ms, left))
                rows = run_aggregate(engine, sql, timeout_ms=timeout_ms)
                trace.ended = time.monotonic()
                return rows

        try:
            exact = run_aggregate_until(
                self.engine,
                compiled.sql,
                timeout_ms=clock.statement_timeout_ms,
                until=clock.statement_until,
                query_id=reservation.id,
                run=run_in_slot,
                watch=metrics.AbandonedStatements(plan.table),
            )
        except DatabaseUnavailable:
            lane.done(ticket)
            # The statement was never sent: the failure cannot depend on the rows.
            self.charges.refund(reservation, "the protected database was unreachable")
            raise
        except StatementFailed as failure:
            lane.done(ticket)
            _count_past_deadline(plan.table, clock)
            if failure.timed_out:
                missed.stage = "statement"
                metrics.record_deadline_miss("statement", plan.table)
                trace.report(clock, reservation.id)
            self._charged_failure(reservation, "timeout" if failure.timed_out else "error")
        trace.report(clock, None)
        _count_past_deadline(plan.table, clock)
        try:
            noisy = add_noise(plan, compiled, exact, calibration)
        except Exception:
            lane.done(ticket)
            log.error("noising failed after execution; the query stays charged", exc_info=True)
            self._charged_failure(reservation, "noising")
        cells_json = noisy.cells_json()
        trace.mark("noise")
        try:
            with lane.turn(ticket, clock.release_at):
                trace.mark("turn")
                # a pre-audit sees this answer (or refusal) from its release moment only
                post = self.audit.after(
                    lane.scope,
                    planned,
                    reservation,
                    noisy.cells,
                    cells_json,
                    clock.release_at,
                    pre,
                )
                flags = pre.flags + post.flags
                if post.kept is not None:  # cells left out: the rest is what is released
                    noisy = noisy.only(post.kept)
                    cells_json = noisy.cells_json()
                self.audit.remember(lane.scope, reservation.id, plan, noisy.cells, clock.release_at)
        except TurnMissed:
            lane.done(ticket)
            missed.stage = "turn"
            metrics.record_deadline_miss("turn", plan.table)
            self._charged_failure(reservation, "turn")
        lane.done(ticket)
        trace.mark("post_audit")
        uncut = finish(plan, calibration, noisy)
        release = Release(
            query_id=reservation.id,
            cached=False,
            columns=tuple(ColumnInfo(o.name, o.type) for o in plan.visible_outputs),
            rows=uncut.rows,
            accuracy=uncut.accuracy,
            privacy=privacy_spent(planned),
            budget=reservation.budget,
            extra={} if post.note is None else {"audit_left_out": post.note},
            charge=reservation.charge,
        )
        release = shown(planned, release, uncut)
        record = release.answer_json()
        record["uncut"] = {"rows": [list(r) for r in uncut.rows], "accuracy": uncut.accuracy}
        record["audit_cells"] = cells_json
        if flags:
            record["audit_flags"] = flags
        # Its charge is durable already. Another worker's auditor replays this row once it
        # has the scope lock, which this process holds until its last query of the scope
        # leaves, so with the audit on it is committed before this query leaves the lane;
        # otherwise it rides on the writer's next batch.
        self.charges.answered(reservation, record, wait=self.audit.active)
        trace.mark("record")
        return release

    def _charged_failure(self, reservation: Reservation, cause: str) -> NoReturn:
        """Record a failure after the statement reached the database — charged, nothing
        released — and raise the one error every such failure gets. Its status, code and
        message are the same for an error, a timeout or a cancellation: which one it was
        can depend on the rows (``cause`` goes to the operator's log only)."""
        log.warning("query %s failed after reaching the database (%s)", reservation.id, cause)
        metrics.record_statement_failure(cause)
        self.charges.withheld(
            reservation,
            {"withheld": True, "failed": True},
            "execution failed after the statement reached the database",
        )
        raise DatabaseUnavailable(CHARGED_FAILURE_MESSAGE, charged=True)

    def _probe(self, status: BudgetStatus, plan: ProbePlan) -> Release:
        """A query about public facts only (``SELECT 1``, a client's probe): free."""
        return Release(
            query_id=uuid.uuid4().hex,
            cached=False,
            columns=tuple(ColumnInfo(n, t) for n, t in plan.columns),
            rows=plan.rows,
            accuracy={},
            privacy=NO_PRIVACY_SPENT,
            budget=status,
        )


@dataclass
class _Missed:
    """The deadline stage a query failed at (``None``: none), for the timing's stretch."""

    stage: str | None = None


@dataclass
class _Trace:
    """When a slotted statement's thread ran, entered its slot and ended
    (``time.monotonic()``; ``None``: not reached): where its allowance went."""

    running: float | None = None
    entered: float | None = None
    ended: float | None = None
    # after the statement: noised, its post-audit's turn begun, audited (post-audit and
    # remember done), its outcome recorded
    after: dict[str, float] = field(default_factory=dict)

    def mark(self, phase: str) -> None:
        self.after[phase] = time.monotonic()

    def report_after(self, clock: ReleaseClock) -> str:
        """Record the phases after the statement (``dpgate_statement_phase_seconds``:
        noise, turn, post_audit, record) and say them for the operator's log."""
        if clock.statement_until is None or not self.after:
            return ""
        start = self.ended if self.ended is not None else clock.statement_until
        said = []
        for phase in POST_PHASES:
            at = self.after.get(phase)
            if at is None:
                break
            metrics.record_statement_phase(phase, at - start)
            said.append(f"{phase.replace('_', ' ')} {(at - start) * 1000:.1f} ms")
            start = at
        return ", ".join(said)

    def report(self, clock: ReleaseClock, missed: str | None) -> None:
        """Record the phases (``dpgate_statement_phase_seconds``); for a miss
        (``missed``: its query id) say in the operator's log where the time went."""
        if clock.fixed_at is None or clock.statement_until is None or self.running is None:
            return
        until = clock.statement_until
        entered = self.entered if self.entered is not None else until
        ended = self.ended if self.ended is not None else until
        phases = {
            "queue": self.running - clock.fixed_at,
            "slot": entered - self.running,
            "run": ended - entered,
        }
        for phase, seconds in phases.items():
            metrics.record_statement_phase(phase, seconds)
        if missed is not None:
            log.warning(
                "deadline miss: query %s's statement had %.1f ms (slot public start +%.1f ms): "
                "queue %.1f ms, slot wait %.1f ms, run %.1f ms%s",
                missed,
                (until - clock.fixed_at) * 1000,
                ((clock.starts_at or clock.fixed_at) - clock.fixed_at) * 1000,
                phases["queue"] * 1000,
                phases["slot"] * 1000,
                phases["run"] * 1000,
                "" if self.ended is not None else " and on",
            )


#: The phases of the work after a statement, in order (``_Trace.report_after``).
POST_PHASES = ("noise", "turn", "post_audit", "record")


def _count_past_deadline(table: str, clock: ReleaseClock) -> None:
    """Count a statement that returned after its query's release moment (operator's
    metric: its response cannot leave at the deadline)."""
    if clock.release_at is not None and time.monotonic() > clock.release_at:
        metrics.record_past_deadline(table)


def _post_process(planned: PlannedQuery, release: Release) -> Release:
    """A nested aggregation's outer query, run on the (inner) release just obtained —
    fresh, cached or a dry run; post-processing of noisy values only."""
    if planned.plan.post_query is None:
        return release
    return run_post_query(planned, release)


def _prefill(planned: PlannedQuery) -> None:
    """Have each measure's noise drawn before the data is read, so that the release does
    no sampling work whose duration could depend on the values (docs/design.md,
    invariant 4: noise is exact, secret and timing-blind)."""
    cells = 1
    for g in planned.plan.group_keys:
        cells *= len(g.domain) if g.domain is not None else 64
    calibration = planned.calibration
    for noise in calibration.noises:
        prefill(noise, min(cells, 100_000))
    if calibration.selection is not None:
        prefill(calibration.selection.noise, min(cells, 100_000))
