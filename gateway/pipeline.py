"""The Gateway: the whole pipeline of one query, from SQL text to a released answer.

    analyze → cache? → calibrate → pre-audit → reserve → execute → add noise
            → post-audit → record → post-process

Invariants kept here (docs/design.md): nothing computed from protected rows leaves
except as a noisy value whose cost was durably reserved in the ledger first (1); every
failure before ``reserve`` costs nothing; after it, only a failure to reach the database
at all is refunded — once the statement is sent, an error, a timeout or a post-audit
refusal stays charged and releases nothing (2); an identical request gets the identical
release, free (7); the auditor sees only plans and noisy values (8); every query that
reaches the database is answered at a release moment fixed from public facts, and costs
at least the configured minimum (9; ``gateway.timing``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace
from typing import Any, NoReturn

import sqlalchemy as sa

import budget
from budget import Quote, Reservation
from gateway import accuracy_target, metrics
from gateway.analyze import analyze
from gateway.audit import AnsweredQuery, AuditDecision, Auditor
from gateway.compile import CompiledQuery, compile_plan
from gateway.config import Config, with_nullability
from gateway.errors import (
    AuditRefused,
    BudgetExhausted,
    DatabaseUnavailable,
    Forbidden,
    GatewayError,
    InvalidPrivacyParameters,
    LedgerUnavailable,
    Unauthenticated,
)
from gateway.execute import (
    StatementFailed,
    nullability_by_schema,
    open_protected_engine,
    ping,
    run_aggregate,
    sqlglot_dialect,
    units_unique_by_schema,
)
from gateway.noising import NoisyResult, add_noise, expected_accuracy
from gateway.plan import ProbePlan, QueryPlan, QueryRequest
from gateway.release import ColumnInfo, Release
from gateway.timing import ReleaseClock, deadline_ms, start_clock
from mechanisms import QueryCalibration, calibrate_query, prefill

GLOBAL_SCOPE = "*"
log = logging.getLogger("dpgate.pipeline")
PLAN_CACHE_SIZE = 1024
CHARGED_FAILURE_MESSAGE = (
    "the protected database did not complete this query before its deadline; the query "
    "was charged and nothing was released (a query that keeps failing may need a later "
    "deadline: ask the administrator)"
)


@dataclass(frozen=True)
class Principal:
    """Who is calling: an analyst (by name) or the admin."""

    name: str
    is_admin: bool


class Gateway:
    """One configured dpgate: the protected database, the ledger and the auditor."""

    def __init__(
        self,
        config: Config,
        *,
        engine: sa.Engine | None = None,
        ledger: budget.Ledger | None = None,
    ) -> None:
        self.config = config
        self.engine = engine or open_protected_engine(
            config.database.url, statement_timeout_ms=config.database.statement_timeout_ms
        )
        self.dialect = sqlglot_dialect(self.engine)
        # undeclared ``nullable:`` comes from the catalogue (gateway/domain.py)
        nullable = nullability_by_schema(self.engine, config.tables)
        self.config = config = replace(config, tables=with_nullability(config.tables, nullable))
        self.unique_units = units_unique_by_schema(self.engine, config.tables)
        self._plans: OrderedDict[str, QueryPlan | ProbePlan] = OrderedDict()
        self.ledger = ledger or budget.Ledger.from_url(
            config.ledger.url,
            **config.privacy.ledger_options(),
        )
        self.ledger.migrate()
        for a in config.analysts:
            self.ledger.ensure_analyst(a.name, a.epsilon, a.delta, a.period)
        self.auditor = Auditor(
            config.tables,
            min_group_size=config.audit.min_group_size,
            confidence=config.audit.confidence,
        )
        self._synced: dict[str, int] = {}
        self._sync_lock = threading.Lock()

    # -- identity ------------------------------------------------------------------------

    def authenticate(self, key: str | None) -> Principal:
        """The caller behind a bearer key; raises ``Unauthenticated`` or ``Forbidden``."""
        if not key:
            raise Unauthenticated("send your API key as 'Authorization: Bearer <key>'")
        admin = self.config.admin_key
        if admin is not None and _same_secret(key, admin):
            return Principal(name="admin", is_admin=True)
        analyst = _ledger_call(self.ledger.authenticate, key)
        if analyst is None:
            raise Unauthenticated("unknown API key")
        if analyst.disabled:
            raise Forbidden(f"analyst '{analyst.name}' is disabled")
        return Principal(name=analyst.name, is_admin=False)

    # -- public metadata -----------------------------------------------------------------

    def schema(self) -> dict[str, Any]:
        """What the admin declared public: tables, columns, types, bounds, value domains."""
        tables = []
        for t in self.config.tables.values():
            columns = []
            for c in t.columns.values():
                col: dict[str, Any] = {"name": c.name, "type": c.type, "nullable": c.may_be_null}
                if c.bounded:
                    col["lower"], col["upper"] = c.lower, c.upper
                if c.values is not None:
                    col["values"] = list(c.values)
                if c.name.lower() == t.privacy_unit:
                    col["privacy_unit"] = True
                columns.append(col)
            tables.append(
                {
                    "name": t.name,
                    "schema": t.schema or "main",
                    "privacy_unit": t.privacy_unit,
                    "max_rows_per_unit": t.max_rows_per_unit if t.privacy_unit else 1,
                    "max_groups_per_unit": t.max_groups_per_unit,
                    "columns": columns,
                }
            )
        return {"ok": True, "tables": tables}

    def budget(self, analyst: str) -> dict[str, Any]:
        return _ledger_call(self.ledger.budget_status, analyst).to_json()

    def history(self, analyst: str, *, limit: int = 1000) -> list[dict[str, Any]]:
        """The analyst's own charged and refused queries, as JSON (``GET /v1/queries``)."""
        entries = _ledger_call(lambda: self.ledger.history(analyst, limit=limit))
        out = []
        for e in entries:
            release = None
            if e.release is not None and e.outcome == "answered":
                release = {
                    k: v for k, v in e.release.items() if k not in ("audit_cells", "audit_flags")
                }
            out.append(
                {
                    "query_id": e.reservation_id,
                    "sql": e.sql,
                    "mechanism": e.mechanism,
                    "cost": {
                        "epsilon": e.cost.epsilon,
                        "delta": e.cost.delta,
                        "rho": e.cost.rho,
                        "selection_delta": e.cost.selection_delta,
                    },
                    "outcome": e.outcome,
                    "reason": e.reason,
                    "release": release,
                    "created_at": e.created_at.isoformat(),
                }
            )
        return out

    def ready(self) -> dict[str, bool]:
        ledger_ok = True
        try:
            self.ledger.ping()
        except Exception:
            ledger_ok = False
        return {"database": ping(self.engine), "ledger": ledger_ok}

    # -- the pipeline --------------------------------------------------------------------

    def query(self, analyst: str, request: QueryRequest) -> Release:
        """Answer one request of ``analyst``, or raise the ``GatewayError`` that says why not."""
        plan = self.analyze(request.sql)
        if isinstance(plan, ProbePlan):
            return self._probe(analyst, plan)
        if request.accuracy is not None:  # the smallest ε meeting the accuracy asked for
            request = self._target_accuracy(plan, request)
        self._check_parameters(request)
        calibration = self._calibrate(plan, request)
        key = self._cache_key(plan, request)
        if not request.dry_run:
            cached = self._cached(analyst, key)
            if cached is not None:
                return cached
        if request.dry_run:
            return self._dry_run(analyst, plan, request, calibration)
        scope = analyst if self.config.audit.scope == "analyst" else GLOBAL_SCOPE
        # One query per audit scope at a time, across workers (budget/locks.py), from the
        # re-sync of the scope's knowledge to the release moment: the other half of a
        # differencing pair sent at the same moment then sees this one's answer. Held
        # until the release moment, so its holding time is public too.
        with self._scope_lock(scope):
            flags: list[str] = []
            if self.config.audit.mode != "off":
                self._sync_auditor(scope)
                self._refused_before(analyst, key)
                decision = self._audit(lambda: self.auditor.pre_audit(scope, plan))
                if not decision.allowed:
                    if self.config.audit.mode == "refuse":
                        self._refuse(analyst, key, request, decision)
                    flags.append(decision.reason)
            table = self.config.tables[plan.table]
            compiled = compile_plan(
                plan, table, self.dialect, unit_unique=plan.table in self.unique_units
            )
            _prefill(plan, calibration)
            reservation = self._reserve(analyst, plan, request, calibration, key)
            clock = start_clock(
                self.config.execution, table, self.config.database.statement_timeout_ms
            )
            try:
                return self._execute_and_release(
                    scope, plan, request, calibration, compiled, reservation, clock, flags
                )
            finally:
                # Whatever happened — answer, failure, withheld — it leaves at the release
                # moment fixed before execution (invariant: observables are public or DP).
                held = clock.wait()
                if clock.release_at is not None:
                    metrics.record_release_wait(held)

    def _execute_and_release(
        self,
        scope: str,
        plan: QueryPlan,
        request: QueryRequest,
        calibration: QueryCalibration,
        compiled: CompiledQuery,
        reservation: Reservation,
        clock: ReleaseClock,
        flags: list[str],
    ) -> Release:
        """Execute a reserved query, noise it, post-audit it and record the outcome."""
        try:
            exact = run_aggregate(self.engine, compiled.sql, timeout_ms=clock.statement_timeout_ms)
        except DatabaseUnavailable:
            # The statement was never sent: the failure cannot depend on the rows.
            _ledger_call(self.ledger.refund, reservation, "the protected database was unreachable")
            raise
        except StatementFailed as failure:
            self._charged_failure(reservation, "timeout" if failure.timed_out else "error")
        try:
            noisy = add_noise(plan, compiled, exact, calibration)
        except Exception:
            log.error("noising failed after execution; the query stays charged", exc_info=True)
            self._charged_failure(reservation, "noising")
        answered = AnsweredQuery(query_id=reservation.id, plan=plan, cells=noisy.cells)
        if self.config.audit.mode != "off":
            decision = self._audit(lambda: self.auditor.post_audit(scope, answered))
            if not decision.allowed:
                if self.config.audit.mode == "refuse":
                    _ledger_call(
                        self.ledger.commit,
                        reservation,
                        {"withheld": True, "audit_cells": noisy.cells_json()},
                        "withheld",
                        f"post-audit: {decision.reason}",
                    )
                    self._record_refusal(
                        reservation.analyst, reservation.query_key, request, decision, reservation
                    )
                    raise AuditRefused(
                        f"{decision.reason} The query was charged (its answer was computed) "
                        "but is withheld.",
                        charged=True,
                        combined_with=list(decision.combined_with),
                    )
                flags.append(decision.reason)
        release = self._release(reservation.id, plan, request, calibration, noisy, reservation)
        record = release.answer_json()
        record["audit_cells"] = noisy.cells_json()
        if flags:
            record["audit_flags"] = flags
        _ledger_call(self.ledger.commit, reservation, record, "answered")
        if self.config.audit.mode != "off":
            self.auditor.remember(scope, answered)
        return release

    def _scope_lock(self, scope: str) -> AbstractContextManager[None]:
        """The audit scope's lock on the ledger (nothing to hold when the audit is off)."""
        if self.config.audit.mode == "off":
            return nullcontext()
        return self.ledger.scope_lock(scope)

    def _refused_before(self, analyst: str, key: str) -> None:
        """Refuse again, free and without recomputing, a request the auditor refused."""
        if self.config.audit.mode != "refuse":
            return
        refusal = _ledger_call(
            self.ledger.find_refusal, key, analyst, self.config.database.data_version
        )
        if refusal is not None:
            raise AuditRefused(
                f"{refusal.reason} This request was refused before: it is refused again, "
                "and nothing was charged.",
                charged=False,
                combined_with=list(refusal.combined_with),
                refused_before=True,
            )

    def _refuse(
        self, analyst: str, key: str, request: QueryRequest, decision: AuditDecision
    ) -> NoReturn:
        """Record a pre-audit refusal (for the history, and to refuse a repeat free)."""
        self._record_refusal(analyst, key, request, decision, None)
        raise AuditRefused(
            f"{decision.reason} Nothing was charged.",
            charged=False,
            combined_with=list(decision.combined_with),
        )

    def _record_refusal(
        self,
        analyst: str,
        key: str,
        request: QueryRequest,
        decision: AuditDecision,
        reservation: Reservation | None,
    ) -> None:
        _ledger_call(
            lambda: self.ledger.record_refusal(
                analyst,
                query_key=key,
                sql=request.sql,
                data_version=self.config.database.data_version,
                reason=decision.reason,
                combined_with=decision.combined_with,
                reservation_id=None if reservation is None else reservation.id,
            )
        )

    def _charged_failure(self, reservation: Reservation, cause: str) -> NoReturn:
        """Record a failure after the statement reached the database — charged, nothing
        released — and raise the one error every such failure gets. Its status, code and
        message are the same for an error, a timeout or a cancellation: which one it was
        can depend on the rows (``cause`` goes to the operator's log only)."""
        log.warning("query %s failed after reaching the database (%s)", reservation.id, cause)
        metrics.record_statement_failure(cause)
        _ledger_call(
            self.ledger.commit,
            reservation,
            {"withheld": True, "failed": True},
            "withheld",
            "execution failed after the statement reached the database",
        )
        raise DatabaseUnavailable(CHARGED_FAILURE_MESSAGE, charged=True)

    # -- stages --------------------------------------------------------------------------

    def analyze(self, sql: str) -> QueryPlan | ProbePlan:
        """``gateway.analyze.analyze`` against this config, remembering recent plans."""
        plan = self._plans.get(sql)
        if plan is None:
            plan = analyze(sql, self.config.tables)  # refusals raise and are not kept
            self._plans[sql] = plan
            if len(self._plans) > PLAN_CACHE_SIZE:
                self._plans.popitem(last=False)
        return plan

    def _audit(self, decide: Callable[[], AuditDecision]) -> AuditDecision:
        """Run one audit decision; an auditor that cannot decide refuses (fails closed)."""
        try:
            return decide()
        except Exception as e:
            log.error("the auditor failed (%s); refusing", type(e).__name__, exc_info=True)
            return AuditDecision(
                allowed=False,
                combined_with=(),
                reason="The auditor could not decide on this query, so it is refused.",
            )

    def _target_accuracy(self, plan: QueryPlan, request: QueryRequest) -> QueryRequest:
        """The request with ε set to the smallest that meets its accuracy target."""
        assert request.accuracy is not None
        return accuracy_target.request_for_target(
            plan,
            request,
            self.config.privacy,
            lambda r: self._calibrate(plan, r),
        )

    def _check_parameters(self, request: QueryRequest) -> None:
        p = self.config.privacy
        if not (math.isfinite(request.epsilon) and request.epsilon > 0):
            raise InvalidPrivacyParameters("epsilon must be a finite number > 0")
        if request.epsilon > p.max_epsilon_per_query:
            raise InvalidPrivacyParameters(
                f"epsilon {request.epsilon} is above this gateway's limit per query "
                f"({p.max_epsilon_per_query})",
                max_epsilon_per_query=p.max_epsilon_per_query,
            )
        if request.epsilon < p.min_epsilon_per_query:
            # Near-free queries would let an analyst repeat any residual channel millions
            # of times; the floor makes the budget bound the number of queries.
            raise InvalidPrivacyParameters(
                f"epsilon {request.epsilon} is below this gateway's minimum per query "
                f"({p.min_epsilon_per_query})",
                min_epsilon_per_query=p.min_epsilon_per_query,
            )
        if not (math.isfinite(request.delta) and 0 <= request.delta < 1):
            raise InvalidPrivacyParameters("delta must be in [0, 1)")
        if p.composition == "pure" and request.mechanism != "laplace":
            raise InvalidPrivacyParameters(
                "this gateway accounts pure ε-DP: only the laplace mechanism is available"
            )
        if request.mechanism == "gaussian" and request.delta <= 0:
            raise InvalidPrivacyParameters("the gaussian mechanism needs delta > 0")

    def _calibrate(self, plan: QueryPlan, request: QueryRequest) -> QueryCalibration:
        table = self.config.tables[plan.table]
        groups = None
        if plan.needs_partition_selection:
            from gateway.analyze.aggregates import contribution_bounds

            groups = contribution_bounds(table, grouped=True)[1]
            if request.delta <= 0:
                raise InvalidPrivacyParameters(
                    "these GROUP BY keys are not declared public, so their groups are released "
                    "through DP partition selection, which needs delta > 0 (or declare the "
                    "key's values in the config)"
                )
        try:
            calibration = calibrate_query(
                request.mechanism,
                request.epsilon,
                request.delta,
                [m.sensitivity for m in plan.measures],
                max_groups_per_unit=groups,
            )
        except ValueError as e:
            raise InvalidPrivacyParameters(str(e)) from None
        except ArithmeticError:  # e.g. a denormal ε whose scale no float can hold
            raise InvalidPrivacyParameters(
                f"epsilon {request.epsilon!r} is too small to calibrate noise for"
            ) from None
        min_rho = self.config.privacy.min_rho
        if self.config.privacy.composition != "pure" and calibration.cost.rho < min_rho:
            raise InvalidPrivacyParameters(
                f"this query would cost ρ={calibration.cost.rho:.3g}, below this gateway's "
                f"minimum per query (ρ={min_rho:.3g}): ask for a larger epsilon or a smaller "
                "delta",
                min_rho_per_query=min_rho,
            )
        return calibration

    def _cache_key(self, plan: QueryPlan, request: QueryRequest) -> str:
        material = json.dumps(
            [
                plan.canonical_sql,
                repr(float(request.epsilon)),
                repr(float(request.delta)),
                request.mechanism,
                self.config.database.data_version,
            ]
        )
        return hashlib.sha256(material.encode()).hexdigest()

    def _cached(self, analyst: str, key: str) -> Release | None:
        scope = analyst if self.config.cache.scope == "analyst" else None
        stored = _ledger_call(
            self.ledger.find_release, key, scope, self.config.database.data_version
        )
        if stored is None:
            return None
        stored = {k: v for k, v in stored.items() if k not in ("audit_cells", "audit_flags")}
        return Release.from_answer_json(stored, cached=True, budget=self.budget(analyst))

    def _reserve(
        self,
        analyst: str,
        plan: QueryPlan,
        request: QueryRequest,
        calibration: QueryCalibration,
        key: str,
    ) -> Reservation:
        try:
            return self.ledger.reserve(
                analyst,
                calibration.cost,
                query_key=key,
                sql=request.sql,
                mechanism=request.mechanism,
                data_version=self.config.database.data_version,
            )
        except budget.BudgetExhausted as e:
            raise BudgetExhausted(str(e), **e.detail()) from None
        except budget.UnsupportedCost as e:
            raise InvalidPrivacyParameters(str(e)) from None
        except budget.AnalystDisabled as e:
            raise Forbidden(str(e)) from None
        except budget.LedgerUnavailable:
            raise LedgerUnavailable(
                "the ledger database is unavailable; nothing was charged or released"
            ) from None

    def _sync_auditor(self, scope: str) -> None:
        """Replay answers other workers released since the last sync, so every process
        audits the same history (incremental: only ledger entries past the last one seen).
        Withheld answers are not replayed: nobody saw them."""
        analyst = None if scope == GLOBAL_SCOPE else scope
        with self._sync_lock:
            after = self._synced.get(scope)
            entries = _ledger_call(
                lambda: self.ledger.releases(
                    analyst, self.config.database.data_version, after=after
                )
            )
            for entry in entries:
                self._synced[scope] = max(self._synced.get(scope, 0), entry.seq)
                if entry.outcome != "answered" or entry.release is None:
                    continue
                if self.auditor.knows(scope, entry.reservation_id):
                    continue
                cells = entry.release.get("audit_cells")
                if cells is None:
                    continue
                try:
                    plan = self.analyze(entry.sql)
                except GatewayError:
                    continue
                if isinstance(plan, QueryPlan):
                    self.auditor.remember(
                        scope,
                        AnsweredQuery(
                            query_id=entry.reservation_id,
                            plan=plan,
                            cells=NoisyResult.cells_from_json(cells),
                        ),
                    )

    def _release(
        self,
        query_id: str,
        plan: QueryPlan,
        request: QueryRequest,
        calibration: QueryCalibration,
        noisy: NoisyResult,
        reservation: Reservation,
    ) -> Release:
        return Release(
            query_id=query_id,
            cached=False,
            columns=tuple(ColumnInfo(o.name, o.type) for o in plan.visible_outputs),
            rows=noisy.rows,
            accuracy=noisy.accuracy,
            privacy=_privacy(request, calibration),
            budget=reservation.budget.to_json(),
            charge=None if reservation.charge is None else reservation.charge.to_json(),
        )

    def _probe(self, analyst: str, plan: ProbePlan) -> Release:
        return Release(
            query_id=uuid.uuid4().hex,
            cached=False,
            columns=tuple(ColumnInfo(n, t) for n, t in plan.columns),
            rows=plan.rows,
            accuracy={},
            privacy={"mechanism": "none", "epsilon": 0.0, "delta": 0.0, "rho": 0.0},
            budget=self.budget(analyst),
        )

    def _quote(self, analyst: str, calibration: QueryCalibration, request: QueryRequest) -> Quote:
        """What the query would cost the analyst's own budget (the global cap aside)."""
        try:
            quote: Quote = _ledger_call(
                self.ledger.quote, analyst, calibration.cost, request.mechanism
            )
        except budget.UnsupportedCost as e:
            raise InvalidPrivacyParameters(str(e)) from None
        return quote

    def _dry_run(
        self,
        analyst: str,
        plan: QueryPlan,
        request: QueryRequest,
        calibration: QueryCalibration,
    ) -> Release:
        quote = self._quote(analyst, calibration, request)
        return Release(
            query_id="dry-run",
            cached=False,
            columns=tuple(ColumnInfo(o.name, o.type) for o in plan.visible_outputs),
            rows=(),
            accuracy=expected_accuracy(plan, calibration),
            privacy=_privacy(request, calibration),
            budget=quote.budget.to_json(),
            extra={
                "dry_run": True,
                "would_fit": quote.would_fit,
                # what it would cost, in the analyst's budget units, and how many fit
                "charge": quote.charge.to_json(),
                "queries_remaining": quote.queries_remaining,
                "plan": _describe(plan, calibration),
                # When the answer would leave after its execution starts (public: config).
                "release_deadline_ms": deadline_ms(
                    self.config.execution, self.config.tables[plan.table]
                ),
            },
        )


def _privacy(request: QueryRequest, calibration: QueryCalibration) -> dict[str, Any]:
    """The ``privacy`` part of a response: what the query was calibrated for and costs."""
    return {
        "mechanism": request.mechanism,
        "epsilon": request.epsilon,
        "delta": request.delta if request.mechanism == "gaussian" else 0.0,
        "rho": calibration.cost.rho,
        "selection_delta": calibration.cost.selection_delta,
    }


def _describe(plan: QueryPlan, calibration: QueryCalibration) -> dict[str, Any]:
    """A JSON view of the plan for ``dry_run``: public information only."""
    return {
        "table": plan.table,
        "canonical_sql": plan.canonical_sql,
        "measures": [
            {
                "kind": m.kind,
                "expression": m.expression.sql() if m.expression is not None else None,
                "sensitivity": float(m.sensitivity.l1),
                "noise": {"mechanism": n.mechanism, "scale": float(n.scale * m.resolution)},
            }
            for m, n in zip(plan.measures, calibration.noises, strict=True)
        ],
        "group_keys": [
            {
                "name": g.name,
                "release": "declared values" if g.domain is not None else "partition selection",
            }
            for g in plan.group_keys
        ],
        "partition_selection": (
            {"threshold": calibration.selection.threshold}
            if calibration.selection is not None
            else None
        ),
    }


def _prefill(plan: QueryPlan, calibration: QueryCalibration) -> None:
    """Have each measure's noise drawn before the data is read, so that the release does
    no sampling work whose duration could depend on the values (docs/design.md,
    invariant 4: noise is exact, secret and timing-blind)."""
    cells = 1
    for g in plan.group_keys:
        cells *= len(g.domain) if g.domain is not None else 64
    for noise in calibration.noises:
        prefill(noise, min(cells, 100_000))
    if calibration.selection is not None:
        prefill(calibration.selection.noise, min(cells, 100_000))


def _same_secret(a: str, b: str) -> bool:
    import hmac

    return hmac.compare_digest(a.encode(), b.encode())


def _ledger_call(fn: Any, *args: Any) -> Any:
    """Call the ledger, mapping its failures to gateway errors."""
    try:
        return fn(*args)
    except budget.LedgerUnavailable:
        raise LedgerUnavailable("the ledger database is unavailable") from None
    except budget.UnknownAnalyst as e:
        raise Unauthenticated(str(e)) from None
