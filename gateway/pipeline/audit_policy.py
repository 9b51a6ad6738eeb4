"""Stage: audit policy — what the differencing auditor's decisions mean for a request.

``audit.mode`` is read here and nowhere else: ``off`` audits nothing; ``flag`` answers
and records the auditor's objection; ``refuse`` refuses. While a scope has audited
queries in flight in a process, that process holds the scope's lock (``budget.locks``),
re-syncs the scope's history when it takes it, and audits its queries in the order of
their tickets (``gateway.pipeline.lanes``): the other half of a differencing pair sent at the same
moment, to any worker, is post-audited against this one's answer. A pre-audit refusal
costs nothing; a post-audit refusal comes after the statement was sent, so its charge
stays and nothing is released (docs/design.md, invariants 2 and 8: the auditor sees only
plans and noisy values).

A post-audit runs as soon as its statement is done, before its query's release moment;
what a pre-audit decides leaves at once. So a pre-audit (and a dry run's prediction)
sees only the answers, and the post-audit refusals, whose release moment has passed
(``visible_at``): otherwise a free refusal would tell whether an earlier statement of the
same analyst had finished, a duration that can depend on the rows
(tests/attacks/test_in_flight_oracle.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

import budget
from budget import Reservation
from gateway.audit import (
    AnsweredCell,
    AnsweredQuery,
    AuditDecision,
    Auditor,
    AuditPrediction,
    CountNoise,
    left_out_reason,
    releases_counts,
)
from gateway.core.config import AuditConfig, TableConfig
from gateway.core.errors import AuditRefused, GatewayError
from gateway.core.joins import PublicLookup
from gateway.core.plan import QueryPlan
from gateway.ops import metrics
from gateway.pipeline.audit_advice import ask_instead
from gateway.pipeline.charges import Charges, ledger_errors
from gateway.pipeline.lanes import NoLane, ScopeLane
from gateway.pipeline.noising import audit_cells_from_json
from gateway.pipeline.planning import PlannedQuery, Planner

GLOBAL_SCOPE = "*"
#: Distinct refused questions a process remembers per scope (``AuditPolicy._refused``, a
#: negative filter: a question not among them needs no ledger read). Past it the scope's
#: memo is dropped, and each of its requests reads the ledger's refusals (one indexed
#: look-up) instead: memory stays bounded however many distinct questions are refused
#: (issue 36: ~320 bytes each, without end before).
REFUSED_MEMO_MAX = 2048
log = logging.getLogger("dpgate.audit")
AUDITOR_FAILED = "The auditor could not decide on this query, so it is refused."


Kept = tuple[int, ...] | None


@dataclass(frozen=True)
class PreAudit:
    """What a pre-audit lets through: every cell (``kept`` None), or the cells at
    ``kept`` (the others left out because of ``groups``); in ``flag`` mode, the
    objections to record."""

    flags: list[str] = field(default_factory=list)
    kept: Kept = None
    groups: tuple[str, ...] = ()


@dataclass(frozen=True)
class PostAudit:
    """What a post-audit lets out: every cell (``kept`` None), or the cells at ``kept``
    with ``note`` saying which were left out and why; and, in ``flag`` mode, the
    objections to record."""

    flags: list[str] = field(default_factory=list)
    kept: Kept = None
    note: dict[str, object] | None = None


class AuditPolicy:
    """The auditor, its scopes and its records in the ledger, under one ``audit.mode``."""

    def __init__(
        self,
        config: AuditConfig,
        tables: Mapping[str, TableConfig],
        ledger: budget.Ledger,
        planner: Planner,
        charges: Charges,
        public: Mapping[tuple[str, str], PublicLookup] | None = None,
    ) -> None:
        self.mode = config.mode
        self.scope_kind = config.scope
        self.ledger = ledger
        self.planner = planner
        self.charges = charges
        self.auditor = Auditor(
            tables,
            min_group_size=config.min_group_size,
            confidence=config.confidence,
            max_bytes=config.memory_mb * 2**20,
            public=public,
        )
        self._synced: dict[str, int] = {}
        # per scope: the lock's turn this process took last (``_hold``), and the turn at
        # which it last read the history (``_sync``): the next turn up means no one else
        # held the scope in between, so its history has nothing new
        self._taken: dict[str, int | None] = {}
        self._synced_turn: dict[str, int] = {}
        # per scope: the (analyst, query key) of every refusal read or recorded (complete
        # up to the last sync: refusals, too, are recorded only under the scope's lock),
        # or None once they are more than ``REFUSED_MEMO_MAX``; and the last refusal id read
        self._refused: dict[str, set[tuple[str, str]] | None] = {}
        self._refusals_read: dict[str, int] = {}
        self._sync_lock = threading.Lock()
        self._lanes: dict[str, ScopeLane] = {}
        self._lanes_lock = threading.Lock()
        # post-audit refusals (by reservation) not yet at their release moment
        self._refused_until: dict[str, float] = {}

    @property
    def active(self) -> bool:
        return self.mode != "off"

    def scope_of(self, analyst: str) -> str:
        return analyst if self.scope_kind == "analyst" else GLOBAL_SCOPE

    @contextmanager
    def lane(self, analyst: str) -> Iterator[ScopeLane | NoLane]:
        """Join the analyst's audit scope's lane (``gateway.pipeline.lanes``): the scope's lock
        is held while it has queries in flight in this process, its history re-read
        from the ledger when the lock is taken; nothing to hold when the audit is off."""
        scope = self.scope_of(analyst)
        if not self.active:
            yield NoLane(scope)
            return
        with self._lanes_lock:
            lane = self._lanes.get(scope)
            if lane is None:
                lane = self._lanes[scope] = ScopeLane(
                    scope,
                    lambda: self._hold(scope),
                    lambda: self._sync(scope),
                )
        asked = time.monotonic()
        with lane.member():
            # the wait to join: for the lane to open, and for the ledger's scope lock
            # when another process holds it (dpgate_audit_lock_wait_seconds)
            metrics.record_audit_lock_wait(time.monotonic() - asked)
            yield lane

    @contextmanager
    def holding(self, analyst: str) -> Iterator[str]:
        """Hold the analyst's audit scope for one decision outside a query (a dry run's
        prediction): as a member of its lane, under the lane's mutex; yields the scope."""
        with self.lane(analyst) as lane, lane.deciding():
            yield lane.scope

    def before(self, scope: str, analyst: str, planned: PlannedQuery) -> PreAudit:
        """Refuse (free) a request the auditor refused before, or that the pre-audit
        refuses now — unless leaving some of its rows out lets the rest through
        (``Auditor.pre_audit_cells``: a public decision); returns those rows, and in
        ``flag`` mode the objections to record."""
        if not self.active:
            return PreAudit()
        earlier = self._refused_before(analyst, planned.key) if self.mode == "refuse" else None
        noise = count_noise(planned)
        now = time.monotonic()
        if self.mode != "refuse":  # flag: the whole query, its objection recorded
            decision = _decide(lambda: self.auditor.pre_audit(scope, planned.plan, noise, at=now))
            return PreAudit(flags=[] if decision.allowed else [decision.reason])
        decision, kept, groups = _decide_cells(
            lambda: self.auditor.pre_audit_cells(scope, planned.plan, noise, at=now)
        )
        if decision.allowed:
            return PreAudit(kept=kept, groups=groups)
        if earlier is None:  # (a repeat refused again is recorded once)
            self._record_refusal(analyst, planned, decision, None)
        raise self._refusal(
            planned,
            decision,
            charged=False,
            **({"refused_before": True} if earlier is not None else {}),
        )

    def _refusal(
        self, planned: PlannedQuery, decision: AuditDecision, *, charged: bool, **detail: object
    ) -> AuditRefused:
        """The error an audit refusal raises: its reason, what it cost (``charged``: after
        execution, the answer withheld), the earlier queries and groups it names, and
        what to ask instead."""
        said = (
            "The query was charged (its answer was computed) but is withheld."
            if charged
            else "Nothing was charged."
        )
        return AuditRefused(
            f"{decision.reason} {said}",
            charged=charged,
            combined_with=list(decision.combined_with),
            groups=list(decision.groups),
            ask_instead=self._advice(planned, decision.groups, decision.uncounted),
            **detail,
        )

    def _advice(self, planned: PlannedQuery, groups: tuple[str, ...], uncounted: bool) -> list[str]:
        """What to ask instead (``audit_advice``): queries the gateway would plan. Advice
        is a courtesy: if writing it fails, the refusal goes without it."""
        try:
            return ask_instead(
                planned.request.sql,
                planned.plan.table,
                groups,
                # (a query that releases counts already gains nothing from COUNT(*))
                uncounted=uncounted and not releases_counts(planned.plan),
                plans=self.planner.analyze,
                keys=[g.expression.name for g in planned.plan.group_keys],
            )
        except Exception:
            log.exception("could not write what to ask instead of a refused query")
            return []

    def predict(self, analyst: str, planned: PlannedQuery) -> AuditPrediction:
        """What the audit would do with ``planned`` now, for a dry run (changes nothing,
        costs nothing): ``refused`` (free), ``may_be_withheld`` after execution, or
        ``answered``, with why and the groups concerned (WHERE clauses: public)."""
        if not self.active:
            return AuditPrediction("answered", "the audit is off")
        with self.holding(analyst) as scope:
            if self.mode == "refuse":
                with ledger_errors():
                    refusal = self.ledger.find_refusal(
                        planned.key, analyst, self.planner.data_version
                    )
                if refusal is not None and _withheld(refusal) and self._visible(refusal):
                    return AuditPrediction(
                        "refused",
                        f"{refusal.reason} This request was refused before.",
                        combined_with=tuple(refusal.combined_with),
                    )
            noise = count_noise(planned)
            now = time.monotonic()
            prediction = _predict(lambda: self.auditor.predict(scope, planned.plan, noise, at=now))
            if prediction.groups and prediction.verdict != "answered":
                advice = self._advice(planned, prediction.groups, prediction.uncounted)
                prediction = replace(prediction, ask_instead=tuple(advice))
        if self.mode == "flag" and prediction.verdict != "answered":
            # flag mode answers and records the objection
            return replace(
                prediction,
                verdict="answered",
                reason=f"{prediction.reason} (audit.mode is flag: answered and flagged)",
                left_out=(),
            )
        return prediction

    def after(
        self,
        scope: str,
        planned: PlannedQuery,
        reservation: Reservation,
        cells: tuple[AnsweredCell, ...],
        cells_json: list[dict[str, object]],
        visible_at: float | None = None,
        pre: PreAudit | None = None,
    ) -> PostAudit:
        """Post-audit the noisy answer — of its cells, those the pre-audit kept (``pre``).
        A cell whose release would, with earlier answers, determine a small group is
        left out (``Auditor.post_audit_cells``) and the rest released; when no cell can
        stay, the answer is recorded withheld (charged) and this raises — a repeat is
        refused free only from ``visible_at``, the query's release moment
        (``time.monotonic()``). In ``flag`` mode nothing is left out: the objection is
        returned, to record."""
        if not self.active:
            return PostAudit()
        if self.mode != "refuse":
            answered = AnsweredQuery(query_id=reservation.id, plan=planned.plan, cells=cells)
            decision = _decide(lambda: self.auditor.post_audit(scope, answered))
            return PostAudit(flags=[] if decision.allowed else [decision.reason])
        offered = tuple(range(len(cells))) if pre is None or pre.kept is None else pre.kept

        def audit() -> tuple[AuditDecision, Kept, tuple[str, ...]]:
            # (the pre-audit's positions are the declared cells', which the answer's
            # follow: a mismatch fails, and fails closed)
            mine = tuple(cells[i] for i in offered)
            answered = AnsweredQuery(query_id=reservation.id, plan=planned.plan, cells=mine)
            return self.auditor.post_audit_cells(scope, answered)

        decision, kept_here, groups = _decide_cells(audit)
        if decision.allowed:
            kept = offered if kept_here is None else tuple(offered[i] for i in kept_here)
            if len(kept) == len(cells):
                return PostAudit()
            groups = tuple(dict.fromkeys((pre.groups if pre is not None else ()) + groups))
            metrics.record_cells_left_out(len(cells) - len(kept))
            note = left_out_note(planned.plan, cells, kept, groups)
            advice = self._advice(planned, groups, uncounted=False)
            return PostAudit(kept=kept, note={**note, "ask_instead": advice} if advice else note)
        self.charges.withheld(
            reservation,
            {"withheld": True, "audit_cells": cells_json},
            f"post-audit: {decision.reason}",
        )
        if visible_at is not None:
            with self._lanes_lock:
                now = time.monotonic()
                self._refused_until = {r: t for r, t in self._refused_until.items() if t > now}
                self._refused_until[reservation.id] = visible_at
        self._record_refusal(reservation.analyst, planned, decision, reservation)
        raise self._refusal(planned, decision, charged=True)

    def remember(
        self,
        scope: str,
        query_id: str,
        plan: QueryPlan,
        cells: tuple[AnsweredCell, ...],
        visible_at: float | None = None,
    ) -> None:
        """Add an answer to the scope's history: post-audits see it at once, pre-audits
        from ``visible_at`` (its release moment, ``time.monotonic()``; ``None``: at once)."""
        if self.active:
            answer = AnsweredQuery(query_id=query_id, plan=plan, cells=cells)
            self.auditor.remember(scope, answer, visible_at=visible_at)

    def _visible(self, refusal: budget.Refusal) -> bool:
        """Whether a recorded refusal's query has reached its release moment."""
        if refusal.reservation_id is None:
            return True
        with self._lanes_lock:
            until = self._refused_until.get(refusal.reservation_id)
        return until is None or until <= time.monotonic()

    def _refused_before(self, analyst: str, key: str) -> budget.Refusal | None:
        """Refuse again, free, a request whose answer was withheld before (a repeat would
        be charged again, and draw fresh noise for the same decision); return a
        refusal before execution instead, if there was one: such a request is audited
        again, since what the analyst asked since (a count the refusal advised) may
        now size the group. Called in the scope's lane, whose sync read every refusal
        recorded before (``_sync``): a request not among them needs no read of the
        ledger (unless the scope's memo overflowed)."""
        known = self._refused.get(self.scope_of(analyst))
        if known is not None and (analyst, key) not in known:
            return None
        with ledger_errors():
            refusal = self.ledger.find_refusal(key, analyst, self.planner.data_version)
        if refusal is None or not _withheld(refusal):
            return refusal
        if self._visible(refusal):
            raise AuditRefused(
                f"{refusal.reason} This request was refused before: it is refused again, "
                "and nothing was charged.",
                charged=False,
                combined_with=list(refusal.combined_with),
                refused_before=True,
            )
        return None  # (withheld, but not yet at its release moment: as if never asked)

    def _record_refusal(
        self,
        analyst: str,
        planned: PlannedQuery,
        decision: AuditDecision,
        reservation: Reservation | None,
    ) -> None:
        """Record a refusal (for the history, and to refuse a repeat for free)."""
        with ledger_errors():
            self.ledger.record_refusal(
                analyst,
                query_key=planned.key,
                sql=planned.request.sql,
                data_version=self.planner.data_version,
                reason=decision.reason,
                combined_with=decision.combined_with,
                reservation_id=None if reservation is None else reservation.id,
            )
        # recorded under the scope's lock: the memo stays complete
        self._memo_refusal(self.scope_of(analyst), analyst, planned.key)

    def _memo_refusal(self, scope: str, analyst: str, key: str) -> None:
        """Add a refusal to the scope's memo, or drop the memo past ``REFUSED_MEMO_MAX``
        (from then on every request of the scope reads the ledger)."""
        known = self._refused.get(scope)
        if known is None:
            return
        known.add((analyst, key))
        if len(known) > REFUSED_MEMO_MAX:
            self._refused[scope] = None

    def forget(self, scope: str) -> None:
        """Drop what this process knows of ``scope`` — the auditor's knowledge and what
        was read of the ledger — so that the next query of the scope re-reads its whole
        history (whatever makes the auditor forget a scope must come through here: the
        re-read is skipped only while the knowledge is what was read)."""
        with self._sync_lock:
            self.auditor.forget_scope(scope)
            for kept in (self._synced, self._synced_turn, self._refused, self._refusals_read):
                kept.pop(scope, None)

    @contextmanager
    def _hold(self, scope: str) -> Iterator[None]:
        """The ledger's lock of ``scope`` (``budget.locks``), noting the turn taken."""
        with self.ledger.scope_lock(scope) as turn:
            self._taken[scope] = turn
            yield

    def _sync(self, scope: str) -> None:
        """Replay answers other workers released since the last sync, so every process
        audits the same history (incremental: only ledger entries past the last one
        seen). Withheld answers are not replayed: nobody saw them.

        Called holding the scope's lock, just taken (``_hold``). Answers of the scope are
        recorded only under that lock, so when this process's turn follows its previous
        one directly (``budget.locks``: nobody else took the lock in between) the ledger
        holds none it has not seen — its own are remembered as they are released — and
        nothing is read. An unknown turn (PostgreSQL) always reads. The refusals recorded
        since the last read are read with the answers (``_refused_before``)."""
        analyst = None if scope == GLOBAL_SCOPE else scope
        with self._sync_lock:
            turn = self._taken.pop(scope, None)
            last = self._synced_turn.pop(scope, None)
            if turn is not None and last is not None and turn == last + 1:
                self._synced_turn[scope] = turn
                return
            after = self._synced.get(scope)
            with ledger_errors():
                entries = self.ledger.releases(analyst, self.planner.data_version, after=after)
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
                    plan = self.planner.analyze(entry.sql)
                except GatewayError:
                    continue
                if isinstance(plan, QueryPlan):
                    self.auditor.remember(
                        scope,
                        AnsweredQuery(
                            query_id=entry.reservation_id,
                            plan=plan,
                            cells=audit_cells_from_json(cells),
                        ),
                    )
            if self._refused.get(scope, set()) is not None:  # None: overflowed, not kept
                with ledger_errors():
                    refused = self.ledger.refused_keys(
                        analyst, self.planner.data_version, after=self._refusals_read.get(scope)
                    )
                self._refused.setdefault(scope, set())
                for refusal_id, who, key in refused:
                    self._memo_refusal(scope, who, key)
                    self._refusals_read[scope] = refusal_id
            if turn is not None:  # read up to now: the next turn up needs no read
                self._synced_turn[scope] = turn


def count_noise(planned: PlannedQuery) -> CountNoise | None:
    """The public noise of the count each released cell will carry (the first of
    COUNT(*), COUNT(DISTINCT unit), COUNT(x), as ``gateway/pipeline/noising.py`` picks it)."""
    plan, calibration = planned.plan, planned.calibration
    for kind in ("count_rows", "count_units", "count_values"):
        for j, m in enumerate(plan.measures):
            if m.kind == kind:
                n = calibration.noises[j]
                return CountNoise(n.mechanism, float(n.scale))
    return None


def _withheld(refusal: budget.Refusal) -> bool:
    """A refusal after execution (its answer computed, charged, withheld), not before."""
    return refusal.reservation_id is not None


def _predict(predict: Callable[[], AuditPrediction]) -> AuditPrediction:
    """Run one prediction; an auditor that cannot decide would refuse."""
    try:
        return predict()
    except Exception as e:
        log.error("the auditor failed (%s); predicting a refusal", type(e).__name__)
        return AuditPrediction("refused", "The auditor could not decide on this query.")


def _decide_cells(
    decide: Callable[[], tuple[AuditDecision, Kept, tuple[str, ...]]],
) -> tuple[AuditDecision, Kept, tuple[str, ...]]:
    """``_decide`` for a post-audit that may leave cells out: failing, it keeps no cell."""
    try:
        return decide()
    except Exception as e:
        log.error("the auditor failed (%s); withholding", type(e).__name__, exc_info=True)
        return AuditDecision(allowed=False, combined_with=(), reason=AUDITOR_FAILED), (), ()


def left_out_note(
    plan: QueryPlan, cells: tuple[AnsweredCell, ...], kept: tuple[int, ...], groups: tuple[str, ...]
) -> dict[str, object]:
    """What a response says of the cells the audit left out: their group keys (declared
    values, or keys partition selection released) and the groups they would determine,
    as WHERE clauses (public: query texts). Never a count or a value."""
    staying = set(kept)
    left = [plan.named_cell(c.group_values) for i, c in enumerate(cells) if i not in staying]
    return {"groups": left, "reason": left_out_reason(groups)}


def _decide(decide: Callable[[], AuditDecision]) -> AuditDecision:
    """Run one audit decision; an auditor that cannot decide refuses (fails closed)."""
    try:
        return decide()
    except Exception as e:
        log.error("the auditor failed (%s); refusing", type(e).__name__, exc_info=True)
        return AuditDecision(allowed=False, combined_with=(), reason=AUDITOR_FAILED)
