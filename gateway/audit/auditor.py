"""The differencing auditor: refuse query sets that would pin down a small group.

Every answered query — every released GROUP BY cell — is a region of a logical cell space
built from query texts and the public schema alone (``space``). A region whose indicator
lies in the span of answered regions is *determined*: a linear combination of released
answers estimates its count (``span``). The auditor refuses when a determined region that
was never asked directly is estimated below ``min_group_size`` — with the estimate made
from the noisy answers, never from the data. Its decisions are therefore post-processing
of differentially private releases (simulatable auditing, Kenthapadi–Mishra–Nissim 2005)
and cannot leak anything the releases did not.

``pre_audit`` decides before anything is spent, from earlier answers only;
``post_audit`` decides with the new noisy answer; ``remember`` records a release.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from sqlglot import exp

from gateway.audit.components import TableKnowledge
from gateway.audit.confidence import CountNoise
from gateway.audit.findings import Candidate, Sizing, _candidates, _extend, _findings
from gateway.audit.knowledge import RowInfo, shared
from gateway.audit.normalise import Undecidable
from gateway.audit.predicates import DimensionKey, Formula, FormulaBuilder, conj
from gateway.audit.resident import ResidentScopes
from gateway.audit.space import SpaceTooLarge
from gateway.audit.span import Doubt
from gateway.core.config import TableConfig
from gateway.core.joins import PublicLookup, audit_relations, translations
from gateway.core.plan import QueryPlan
from gateway.ops.heap import retain_freed_memory

MAX_PRE_AUDIT_CELLS = 10_000
#: How many times a post-audit leaves cells out and audits the rest again before it
#: withholds the whole answer (``Auditor.post_audit_cells``).
SUPPRESSION_ROUNDS = 4
DEFAULT_CONFIDENCE = 0.999
"""The level of the lower confidence bound a determined group's size must reach k at
(``audit.confidence``; docs/privacy.md, "Sizes from noisy answers")."""


@dataclass(frozen=True)
class AnsweredCell:
    """One released cell: the region ``plan.where ∧ (group keys == group_values)``, its
    noisy count (None: the query released none) and that count's public noise."""

    group_values: tuple[Any, ...]
    count: float | None
    sums: Mapping[str, float]
    noise: CountNoise | None = None


@dataclass(frozen=True)
class AnsweredQuery:
    """A released answer as the auditor sees it: the plan and its noisy cells."""

    query_id: str
    plan: QueryPlan
    cells: tuple[AnsweredCell, ...]


@dataclass(frozen=True)
class AuditDecision:
    """The auditor's verdict; ``reason`` reveals no sizes or values."""

    allowed: bool
    combined_with: tuple[str, ...]
    reason: str
    groups: tuple[str, ...] = ()  # the groups it would determine, as WHERE clauses
    # a post-audit's refusal: for each group found, the audited answer's cells (their
    # positions in it) its estimate needs — leaving one out breaks it (``post_audit_cells``)
    cells: tuple[tuple[int, ...], ...] = ()
    # a group only SUMs or quantiles describe: a count must size it (``refusal_reason``)
    uncounted: bool = False


@dataclass(frozen=True)
class AuditPrediction:
    """What the audit will do with a query, decided before anything is spent (a dry
    run): ``refused`` now (free), ``answered_in_part`` (the rows at ``left_out`` left
    out: with earlier answers they determine ``groups``, too small), ``may_be_withheld``
    after execution (it determines ``groups`` whose size only its own noisy answer can
    show), or ``answered``."""

    verdict: str
    reason: str
    groups: tuple[str, ...] = ()
    combined_with: tuple[str, ...] = ()
    # ``answered_in_part``: the group keys of the rows that will be left out
    left_out: tuple[tuple[Any, ...], ...] = ()
    uncounted: bool = False  # as ``AuditDecision.uncounted``
    # queries to ask instead, runnable as they are (``gateway/pipeline/audit_advice.py``)
    ask_instead: tuple[str, ...] = ()


ALLOWED = AuditDecision(True, (), "no small group is determined")

#: Plans whose regions the auditor keeps built (``Auditor._plan_cache``): more than the
#: queries of one scope between a pre-audit and its post-audit.
_WHERE_CACHE = 64


@dataclass(frozen=True)
class _PlanRegions:
    """One plan object's regions: its WHERE (with the rows its join keeps and its count
    counts) and, per list of cells asked for, each cell's region."""

    plan: QueryPlan
    where: Formula
    formulas: dict[tuple[Any, ...], list[Formula]]


# (base, the regions tried, base with them, their candidates, the components changed)
_Tried = tuple[
    "TableKnowledge", tuple[Formula, ...], "TableKnowledge", list["Candidate"], tuple[int, ...]
]


class Auditor:
    """Per-scope knowledge of answered regions, and the checks made against it."""

    def __init__(
        self,
        tables: Mapping[str, TableConfig],
        *,
        min_group_size: int,
        confidence: float = DEFAULT_CONFIDENCE,
        max_bytes: int | None = None,
        public: Mapping[tuple[str, str], PublicLookup] | None = None,
    ) -> None:
        # Each table with the columns of the tables it may join (gateway/core/joins.py): a
        # join's regions live in its anchor table's cell space.
        self.tables = audit_relations(tables, public)
        through = translations(tables, self.tables, public)
        self.min_group_size = min_group_size
        self.alpha = 1 - confidence
        self.observe: Callable[[Sizing], None] | None = None  # sees every region sized
        self._builders = {
            name: FormulaBuilder(t, through.get(name)) for name, t in self.tables.items()
        }
        # what every row of a table meets by declaration (``null_when``), read once
        self._constraints = {
            name: builder.domain_constraints() for name, builder in self._builders.items()
        }
        self._state: dict[tuple[str, str], TableKnowledge] = {}
        self._saturated: set[tuple[str, str]] = set()
        self._pending: dict[tuple[str, str], tuple[str, TableKnowledge, TableKnowledge]] = {}
        self._tried: dict[
            tuple[str, str],
            tuple[
                TableKnowledge,
                tuple[tuple[Formula, ...], tuple[frozenset[str] | None, ...]],
                TableKnowledge,
                list[Candidate],
                tuple[int, ...],
            ],
        ] = {}
        # scopes beyond ``max_bytes`` wait on disk, exactly as they were (``resident``)
        self._resident = ResidentScopes(max_bytes)
        # Answers remembered before their release moment (``remember``'s ``visible_at``):
        # per (scope, table), in the order remembered, the moment each becomes visible
        # and the knowledge (and saturation) before it — what a pre-audit sees until then.
        self._unreleased: dict[tuple[str, str], list[tuple[float, TableKnowledge, bool]]] = {}
        self._lock = threading.Lock()
        self._wheres: OrderedDict[int, _PlanRegions] = OrderedDict()
        self._wheres_lock = threading.Lock()
        retain_freed_memory()  # the span's arrays: reused, not page-faulted afresh

    # -- public interface -------------------------------------------------------------

    def min_rows(self, table: str) -> int:
        """The fewest rows of ``table`` a region must be shown to hold: enough that they
        are at least ``min_group_size`` people. The released counts count rows, and one
        person has up to ``max_rows_per_unit`` of them (the statement bounds each unit to
        that many), so k − 1 people hold at most (k − 1)·m rows, and (k − 1)·m + 1 rows
        are k people or more. A table without a privacy unit has a person per row."""
        t = self.tables[table]
        per_person = t.max_rows_per_unit if t.privacy_unit is not None else 1
        return (self.min_group_size - 1) * max(1, per_person) + 1

    def pre_audit(
        self,
        scope: str,
        plan: QueryPlan,
        noise: CountNoise | None = None,
        *,
        at: float | None = None,
    ) -> AuditDecision:
        """Refuse, before anything is spent, a query that earlier noisy answers alone show
        would determine a small group, or whose conditions the auditor cannot relate to
        earlier ones. Its own answer is unknown here; ``noise`` is its counts' public
        noise (from the calibration), which the post-audit's margin will include: a group
        that cannot clear k even with the most favourable answer is refused now, free.
        ``at`` (``time.monotonic()``): decide on the answers visible then — those
        remembered with a ``visible_at`` still to come are left out (``remember``);
        ``None``: on everything remembered."""
        return self._pre_audit(scope, plan, None, noise, at)

    def _pre_audit(
        self,
        scope: str,
        plan: QueryPlan,
        open_groups: list[str] | None,
        noise: CountNoise | None = None,
        at: float | None = None,
        only: frozenset[int] | None = None,
    ) -> AuditDecision:
        """The pre-audit; ``only``: of the query's cells, those at these positions."""
        try:
            cells = _declared_cells(plan)
            if cells is None:  # partition selection: the keys' dimensions, at least
                samples = [_sample(g.type) for g in plan.group_keys]
                formulas = self._formulas(plan, [tuple(samples)])
                with self._lock:
                    seen, _ = self._visible((scope, plan.table), at)
                    unrelated = self._unrelated(seen, formulas)
                if unrelated is None and open_groups is not None:
                    open_groups.append("one of the groups partition selection releases")
                return unrelated or AuditDecision(True, (), "cells known only after the answer")
            stats = statistics(plan)
            rows = [
                (RowInfo("", j, None, pending=True, stats=stats), f)
                for j, f in enumerate(self._formulas(plan, cells))
                if only is None or j in only
            ]
        except Undecidable as e:
            return AuditDecision(False, (), f"{e}: the auditor cannot decide on it.")
        return self._decide(
            scope,
            plan.table,
            rows,
            pre=True,
            query_id=None,
            open_groups=open_groups,
            pending_counts=releases_counts(plan),
            pending_noise=noise,
            at=at,
        )

    def pre_audit_cells(
        self,
        scope: str,
        plan: QueryPlan,
        noise: CountNoise | None = None,
        *,
        at: float | None = None,
        open_groups: list[str] | None = None,
    ) -> tuple[AuditDecision, tuple[int, ...] | None, tuple[str, ...]]:
        """The pre-audit, leaving cells out rather than refusing the whole query: the
        cells that a group the earlier answers already show to be too small needs are
        left out, and the rest pre-audited again (``post_audit_cells``, before the
        answer: every choice here is a function of query texts, the public schema and
        answers already released, so which cells go is public, and free). Returns the
        decision on the cells kept, their positions among the query's declared cells
        (None: all of them, or a query whose cells are known only after its answer), and
        the groups that made cells go."""

        def audit(kept: tuple[int, ...] | None) -> AuditDecision:
            if open_groups is not None:
                del open_groups[:]  # what the last audit, of the cells kept, leaves open
            only = None if kept is None else frozenset(kept)
            return self._pre_audit(scope, plan, open_groups, noise, at, only)

        def cells() -> int | None:  # (none to leave out when known only after the answer)
            declared = _declared_cells(plan)
            return None if declared is None else len(declared)

        # a pre-audit's rows keep their positions among the declared cells
        return _leaving_out(cells, audit, lambda i: 0.0, relative=False)

    def predict(
        self,
        scope: str,
        plan: QueryPlan,
        noise: CountNoise | None = None,
        *,
        at: float | None = None,
    ) -> AuditPrediction:
        """The pre-audit's verdict, and whether a post-audit could still withhold the
        answer: the groups the query would newly determine, whose size depends on its own
        noisy answer. Changes nothing (a dry run); public information only (``at``: as
        for ``pre_audit``)."""
        open_groups: list[str] = []
        decision, kept, left_groups = self.pre_audit_cells(
            scope, plan, noise, at=at, open_groups=open_groups
        )
        if not decision.allowed:
            return AuditPrediction(
                "refused",
                decision.reason,
                decision.groups,
                decision.combined_with,
                uncounted=decision.uncounted,
            )
        if kept is not None:
            cells = _declared_cells(plan) or []
            staying = set(kept)
            left = tuple(c for i, c in enumerate(cells) if i not in staying)
            return AuditPrediction(
                "answered_in_part",
                left_out_reason(left_groups)
                + (" Other rows may be left out once its answer is known." if open_groups else ""),
                left_groups,
                left_out=left,
            )
        if open_groups:
            groups = tuple(dict.fromkeys(open_groups))
            return AuditPrediction(
                "may_be_withheld",
                "the query would determine "
                + "; ".join(f"WHERE {g}" for g in groups[:3])
                + (f" (and {len(groups) - 3} more)" if len(groups) > 3 else "")
                + " with earlier answers; whether the noisy answers show that group to hold "
                "the minimum group size is known only once this query's own answer is "
                "computed (and charged); if it does not, the rows that group needs are "
                "left out (or, when no row can stay, the whole answer is withheld). Asking "
                "that group directly first, at the ε you use, makes the answer certain.",
                groups,
            )
        return AuditPrediction("answered", decision.reason)

    def post_audit(self, scope: str, answer: AnsweredQuery) -> AuditDecision:
        """Withhold a charged answer that, with earlier ones, determines a small group."""
        try:
            rows = self._rows(answer)
        except Undecidable as e:
            return AuditDecision(False, (), f"{e}: the auditor cannot decide on it.")
        return self._decide(scope, answer.plan.table, rows, pre=False, query_id=answer.query_id)

    def post_audit_cells(
        self, scope: str, answer: AnsweredQuery
    ) -> tuple[AuditDecision, tuple[int, ...], tuple[str, ...]]:
        """The post-audit, leaving cells out rather than withholding the whole answer.

        When the answer, with earlier ones, determines groups it cannot show to hold k,
        the cells of it that those groups' estimates combine are left out and the rest
        is audited again, as it would be released — cell suppression, as statistical
        offices practise it (primary cells, then the secondary ones a re-audit finds),
        up to ``SUPPRESSION_ROUNDS`` times. Returns the decision on the cells kept, their
        positions in ``answer.cells`` (all of them when nothing was left out; none when
        the answer is withheld), and the groups that made cells go (public: WHERE
        clauses from query texts). Which cells go depends on the noisy answer, as the
        withholding does: post-processing of the charged release. What is released is
        exactly what the last audit passed, so a differencing pair through the kept
        cells is refused as through any answer."""

        def audit(kept: tuple[int, ...] | None) -> AuditDecision:
            if kept is None:
                return self.post_audit(scope, answer)
            return self.post_audit(
                scope, replace(answer, cells=tuple(answer.cells[i] for i in kept))
            )

        # a post-audit's rows are numbered within the cells it was given
        decision, kept, groups = _leaving_out(
            lambda: len(answer.cells), audit, lambda i: answer.cells[i].count or 0.0, relative=True
        )
        return decision, tuple(range(len(answer.cells))) if kept is None else kept, groups

    def remember(
        self, scope: str, answer: AnsweredQuery, *, visible_at: float | None = None
    ) -> None:
        """Add a released answer to the scope's knowledge (a no-op for a known query_id).
        ``visible_at`` (``time.monotonic()``): the answer's release moment, when it is
        remembered before it (post-audits run in ticket order as soon as the statements
        are done, which depends on the rows): post-audits see it at once, a pre-audit
        or a prediction ``at`` an earlier moment does not (what it decides leaves at
        once, and may only depend on answers already released)."""
        key = (scope, answer.plan.table)
        with self._lock:
            base = self._knowledge(key)
            if answer.query_id in base.query_ids:
                return
            now = time.monotonic()
            hidden = [h for h in self._unreleased.pop(key, []) if h[0] > now]
            if visible_at is not None and visible_at > now:
                hidden.append((visible_at, base, key in self._saturated))
            if hidden:
                self._unreleased[key] = hidden
            pending = self._pending.pop(key, None)
            if pending is not None and pending[0] == answer.query_id and pending[1] is base:
                self._state[key] = pending[2]
                self._tried.pop(key, None)
                self._fit(scope)
                return
            try:
                self._state[key] = base.extend(self._rows(answer), _extend)[0]
            except (SpaceTooLarge, Doubt):  # cannot follow: refuse everything after
                self._saturated.add(key)
                self._state[key] = replace(base, query_ids=base.query_ids | {answer.query_id})
            # what a pre-audit tried was against the knowledge before this answer: stale
            self._tried.pop(key, None)
            self._fit(scope)

    def forget_scope(self, scope: str) -> None:
        """Drop what one scope knows (its data version changed)."""
        with self._lock:
            self._resident.drop(scope)
            for key in [k for k in self._unreleased if k[0] == scope]:
                del self._unreleased[key]
            for key in [k for k in self._state if k[0] == scope]:
                self._state.pop(key, None)
                self._pending.pop(key, None)
                self._tried.pop(key, None)
                self._saturated.discard(key)

    def reset(self) -> None:
        """Drop all knowledge (the data version changed)."""
        with self._lock:
            self._resident.drop()
            self._state.clear()
            self._unreleased.clear()
            self._pending.clear()
            self._tried.clear()
            self._saturated.clear()

    def knows(self, scope: str, query_id: str) -> bool:
        """Whether ``query_id`` has been remembered in ``scope``."""
        with self._lock:
            self._bring_back(scope)
            return any(query_id in kn.query_ids for (s, _), kn in self._state.items() if s == scope)

    def held_scopes(self) -> frozenset[str]:
        """The scopes whose knowledge is in memory now (the others wait on disk)."""
        with self._lock:
            return frozenset(s for s, _ in self._state)

    def held_bytes(self) -> int:
        """The estimated bytes of the knowledge held in memory (``resident.footprint``)."""
        with self._lock:
            return self._resident.held_bytes(self._state)

    def knowledge(self, scope: str, table: str) -> TableKnowledge:
        """What ``scope`` knows about ``table`` (an immutable snapshot, for inspection)."""
        with self._lock:
            return self._knowledge((scope, table))

    # -- internals ----------------------------------------------------------------------

    def _unrelated(self, base: TableKnowledge, formulas: list[Formula]) -> AuditDecision | None:
        """A refusal when the formulas would put two dimensions on one column: the
        auditor cannot relate, say, ``LENGTH(zip) = 4`` to ``zip = '8423'``, and treating
        them as unrelated could hide a differencing pair (conservative: refuse)."""
        known: dict[DimensionKey, None] = {}
        for part in base.parts:
            known.update(dict.fromkeys(part.space.index))
        new: dict[DimensionKey, None] = {}
        seen: set[int] = set()
        for f in formulas:  # a query's cells share their WHERE formula: read it once
            for piece in f.children if f.op == "and" else (f,):
                if id(piece) not in seen:
                    seen.add(id(piece))
                    new.update(dict.fromkeys(c.dimension for c in piece.conditions()))
        # the declared constraints on the columns it reads come with it (``components``)
        new.update(dict.fromkeys(base.constrained(frozenset(new))[0]))
        owner: dict[str, DimensionKey] = {}
        for dim in [*known, *new]:
            for column in sorted(dim.columns):
                first = owner.setdefault(column, dim)
                if first == dim:
                    continue
                earlier = first if first in known else None
                users = _queries_using(base, earlier) if earlier is not None else ()
                a, b = _shown(first), _shown(dim)
                where = f" (in {', '.join(users)})" if users else ""
                return AuditDecision(
                    False,
                    tuple(users),
                    f"the auditor cannot relate {b} to {a}{where}, both conditions on "
                    f"'{column}', so it cannot rule out a differencing pair. Nothing was "
                    f"charged. Write conditions on '{column}' as plain comparisons (=, <, "
                    "IN, BETWEEN, LIKE without wildcards, IS NULL) or use one expression "
                    "consistently.",
                )
        return None

    def _bring_back(self, scope: str) -> None:
        """Read a scope written out to disk back into memory (before any use of it)."""
        self._resident.used(scope)
        if not self._resident.on_disk(scope):
            return
        state, saturated = self._resident.read(scope)
        self._state.update(state)
        self._saturated.update(saturated)
        self._fit(scope)

    def _fit(self, keep: str) -> None:
        """Write the least recently used scopes (never ``keep``) to disk until the
        knowledge held in memory fits ``max_bytes`` (``resident``)."""
        for scope in self._resident.to_write(self._state, keep):
            keys = [k for k in self._state if k[0] == scope]
            payload = (
                {k: self._state[k] for k in keys},
                {k for k in self._saturated if k[0] == scope},
            )
            self._resident.write(scope, payload)
            for k in keys:
                del self._state[k]
                self._pending.pop(k, None)
                self._tried.pop(k, None)
                self._saturated.discard(k)

    def _visible(self, key: tuple[str, str], at: float | None) -> tuple[TableKnowledge, bool]:
        """The knowledge of ``key`` (and whether it is saturated) as it was with only the
        answers visible ``at`` (every answer, for ``None``): answers are remembered in
        ticket order and become visible in that order, so the hidden ones are the last."""
        hidden = self._unreleased.get(key)
        if at is not None and hidden:
            first = next((h for h in hidden if h[0] > at), None)
            if first is not None:
                return first[1], first[2]
            del self._unreleased[key]  # all released by now (one scope decides at a time)
        return self._knowledge(key), key in self._saturated

    def _knowledge(self, key: tuple[str, str]) -> TableKnowledge:
        self._bring_back(key[0])
        kn = self._state.get(key)
        if kn is None:
            kn = TableKnowledge(self.tables[key[1]], constraints=self._constraints[key[1]])
            self._state[key] = kn
        return kn

    def _formulas(self, plan: QueryPlan, cells: list[tuple[Any, ...]]) -> list[Formula]:
        """The region of each cell; the WHERE formula object is shared by all of them.
        Built once per plan object and cells: the post-audit asks for the pre-audit's
        cells again (and then finds the pre-audit's work by identity, ``_extended``)."""
        plan_cache = self._plan_cache(plan)
        key = tuple(cells)
        try:
            hit, hashable = plan_cache.formulas.get(key), True
        except TypeError:  # an unhashable group value: built each time
            hit, hashable = None, False
        if hit is not None:
            return hit
        builder = self._builders[plan.table]
        where = plan_cache.where
        keys = tuple(g.expression for g in plan.group_keys)
        out = [
            conj(where, *(builder.group_condition(k, v) for k, v in zip(keys, values, strict=True)))
            for values in cells
        ]
        if hashable:
            plan_cache.formulas[key] = out
        return out

    def _where(self, plan: QueryPlan) -> Formula:
        """The region every cell of ``plan`` lies in (its WHERE, the rows its join keeps,
        the rows its count counts)."""
        return self._plan_cache(plan).where

    def _plan_cache(self, plan: QueryPlan) -> _PlanRegions:
        """``plan``'s regions, built once per plan object: the pre-audit and the
        post-audit of one query ask for them alike (``_WHERE_CACHE`` recent plans)."""
        with self._wheres_lock:
            hit = self._wheres.get(id(plan))
        if hit is not None and hit.plan is plan:
            return hit
        builder = self._builders[plan.table]
        where = builder.build(plan.where)
        if plan.join is not None and plan.join.matched is not None:
            # the anchor's rows an inner join keeps: those whose lookups matched
            where = conj(where, builder.build(plan.join.matched))
        counted = counted_expression(plan)
        if counted is not None:
            # COUNT(x) and AVG(x) count the rows where x is not NULL: that is the region
            # their count describes
            where = conj(where, builder.counted(counted))
        made = _PlanRegions(plan, where, {})
        with self._wheres_lock:  # the plan is kept with it: its id is not reused meanwhile
            self._wheres[id(plan)] = made
            while len(self._wheres) > _WHERE_CACHE:
                self._wheres.popitem(last=False)
        return made

    def _rows(self, answer: AnsweredQuery) -> list[tuple[RowInfo, Formula]]:
        formulas = self._formulas(answer.plan, [c.group_values for c in answer.cells])
        # rows of every answer share one object per noise distribution and statistics
        stats = shared(statistics(answer.plan))
        return [
            (
                RowInfo(
                    answer.query_id,
                    j,
                    c.count,
                    noise=None
                    if c.noise is None
                    else (((answer.query_id, j), 1.0, shared(c.noise)),),
                    stats=stats,
                ),
                f,
            )
            for j, (c, f) in enumerate(zip(answer.cells, formulas, strict=True))
        ]

    def _extended(
        self, key: tuple[str, str], base: TableKnowledge, rows: list[tuple[RowInfo, Formula]]
    ) -> tuple[TableKnowledge, list[Candidate]]:
        """``_extend`` and its candidate regions, reusing the pre-audit's work when the
        post-audit adds the same regions to the same knowledge (only the counts differ)."""
        formulas = tuple(f for _, f in rows)
        # The candidates depend on the regions and on what each row releases: a COUNT
        # and an AVG over the same cells are searched in different spans (a SUM's row
        # combines with SUMs only), so a COUNT's dry run must not stand in for an AVG.
        shape = (formulas, tuple(r.stats for r, _ in rows))
        tried = self._tried.get(key)
        if tried is not None and tried[0] is base and tried[1] == shape:
            shaped, candidates, changed = tried[2], tried[3], tried[4]
            fresh = tuple(r.with_formula(f) for r, f in rows)
            parts = list(shaped.parts)
            for i in changed:
                info = parts[i].info
                parts[i] = replace(parts[i], info=info[: len(info) - len(rows)] + fresh)
            constant = shaped.constant_rows
            if not any(f.conditions() for f in formulas):  # copied into every component
                kept = constant[: len(constant) - len(rows)]
                constant = kept + tuple(zip(fresh, formulas, strict=True))
            ids = base.query_ids | {r.query_id for r, _ in rows}
            return (
                replace(shaped, parts=tuple(parts), constant_rows=constant, query_ids=ids),
                candidates,
            )
        new, changes = base.extend(rows, _extend)
        candidates = _candidates(changes)
        if new.universe_added:  # the derived row's count depends on the answer: redo
            self._tried.pop(key, None)
        else:
            self._tried[key] = (base, shape, new, candidates, tuple(c.part for c in changes))
        return new, candidates

    def _decide(
        self,
        scope: str,
        table: str,
        rows: list[tuple[RowInfo, Formula]],
        *,
        pre: bool,
        query_id: str | None,
        open_groups: list[str] | None = None,
        pending_counts: bool = True,
        pending_noise: CountNoise | None = None,
        at: float | None = None,
    ) -> AuditDecision:
        key = (scope, table)
        with self._lock:
            base, saturated = self._visible(key, at if pre else None)
            if saturated:
                return AuditDecision(
                    False, (), "the audit record of this table is too complex to extend"
                )
            if query_id is not None and query_id in base.query_ids:
                return ALLOWED
            unrelated = self._unrelated(base, [f for _, f in rows])
            if unrelated is not None:
                return unrelated
            try:
                new, candidates = self._extended(key, base, rows)
                findings = _findings(
                    new,
                    candidates,
                    self.min_rows(table),
                    self.alpha,
                    pre=pre,
                    observe=self.observe,
                    open_groups=open_groups,
                    pending_counts=pending_counts,
                    pending_noise=pending_noise,
                    lookups=self._builders[table].lookups,
                )
            except SpaceTooLarge:
                return AuditDecision(
                    False, (), "the query's conditions make the audit too large to decide"
                )
            except Doubt:
                return AuditDecision(False, (), "the audit could not be decided exactly")
            if not pre and query_id is not None:
                self._pending[key] = (query_id, base, new)
        if not findings:
            return ALLOWED
        combined = tuple(sorted({q for f in findings for q in f.combined_with if q != query_id}))
        groups = tuple(dict.fromkeys(f.group for f in findings if f.group))
        mine = "" if pre else query_id  # a pre-audit's rows are the query's, unnamed yet
        cells = tuple(tuple(c for q, c in f.cells if q == mine) for f in findings)
        uncounted = any(f.uncounted for f in findings)
        # (advice to add COUNT(*) only to a query that has none)
        counts_here = pending_counts if pre else any(r.count is not None for r, _ in rows)
        reason = refusal_reason(combined, groups, uncounted=uncounted, counts_here=counts_here)
        return AuditDecision(False, combined, reason, groups, cells, uncounted)


def _leaving_out(
    cells: Callable[[], int | None],
    audit: Callable[[tuple[int, ...] | None], AuditDecision],
    count: Callable[[int], float],
    *,
    relative: bool,
) -> tuple[AuditDecision, tuple[int, ...] | None, tuple[str, ...]]:
    """Audit a query's cells (``audit(None)``), and while it refuses, leave out the cells
    its groups need (``_hitting_cells``) and audit the rest (``audit(kept)``), up to
    ``SUPPRESSION_ROUNDS`` times. ``cells()``: how many (None: unknown, none can go),
    asked only on a refusal. ``relative``: a refusal numbers the cells within those
    audited, not among all. Returns the last decision, the cells kept (None: all, nothing
    left out; empty: refused) and the groups that made cells go."""
    decision = audit(None)
    n = None if decision.allowed else cells()
    if n is None:
        return decision, (None if decision.allowed else ()), ()
    kept = tuple(range(n))
    groups: tuple[str, ...] = ()
    for _ in range(SUPPRESSION_ROUNDS):
        if decision.allowed or not decision.cells or not all(decision.cells):
            break  # (a group found without a cell of this query: nothing to leave out)
        needs = [[kept[i] if relative else i for i in need] for need in decision.cells]
        gone = _hitting_cells(needs, count)
        if len(gone) >= len(kept):
            break
        groups = tuple(dict.fromkeys(groups + decision.groups))
        kept = tuple(i for i in kept if i not in gone)
        decision = audit(kept)
    if not decision.allowed:
        # named: the groups of every round, this one's first (what to ask instead)
        return replace(decision, groups=tuple(dict.fromkeys(decision.groups + groups))), (), groups
    return decision, (kept if groups else None), groups


def _hitting_cells(needs: list[list[int]], count: Callable[[int], float]) -> set[int]:
    """Few cells that leave every group's estimate without one of the cells it needs:
    greedily, the cell most estimates need, and among those the one with the largest
    noisy count — the group a later estimate then takes it into (this group with that
    cell's) is the likeliest to be large, as secondary suppression chooses its cells."""
    gone: set[int] = set()
    open_needs = [set(n) for n in needs]
    while open_needs:
        uses: dict[int, int] = {}
        for need in open_needs:
            for i in need:
                uses[i] = uses.get(i, 0) + 1
        best = max(uses, key=lambda i: (uses[i], count(i), -i))
        gone.add(best)
        open_needs = [n for n in open_needs if best not in n]
    return gone


def left_out_reason(groups: tuple[str, ...]) -> str:
    """Why rows of an answer are left out, in the analyst's terms (never a size)."""
    said = "; ".join(f"WHERE {g}" for g in groups[:3]) + (
        f" (and {len(groups) - 3} more)" if len(groups) > 3 else ""
    )
    return (
        "the audit leaves these rows out: with earlier answers they would determine "
        f"{said or 'a group'}, which the noisy answers cannot show to hold the minimum group "
        "size. The other rows are released as usual; the query's charge is the whole "
        "query's. To have every row, ask that group directly (a COUNT with that WHERE "
        "clause) and then this query again at another ε (the identical request gives back "
        "this answer, free), or use coarser groups."
    )


def refusal_reason(
    combined: tuple[str, ...],
    groups: tuple[str, ...],
    *,
    uncounted: bool = False,
    counts_here: bool = False,
) -> str:
    """Why a query is refused, in the analyst's terms: the group it would determine (a
    WHERE clause over declared columns, from query texts only), the earlier answers it
    combines with, and what to ask instead. Never a size or a value. ``uncounted``: a
    group only SUMs or quantiles describe, which a count must size; ``counts_here``:
    the query releases counts already (adding COUNT(*) to it would change nothing)."""
    names = ", ".join(combined) if combined else "earlier answers"
    if not groups:
        said = "a group"
    elif len(groups) == 1:
        said = f"the group WHERE {groups[0]}"
    else:
        said = "the groups " + "; ".join(f"WHERE {g}" for g in groups[:3])
        said += f" (and {len(groups) - 3} more)" if len(groups) > 3 else ""
    if uncounted:
        add = (
            ""
            if counts_here
            else "add COUNT(*) to this query — its counts, with the earlier ones, can then "
            "show the group's size — or "
        )
        return (
            f"this query would, with {names}, determine the sum or quantile of {said}, and "
            "no count answered shows that group to hold the minimum group size "
            f"(differencing). To go on, {add}ask that group's COUNT first (a COUNT with "
            "that WHERE clause), or use coarser groups."
        )
    return (
        f"this query would, with {names}, determine {said}, which the noisy answers "
        "cannot show to hold the minimum group size (differencing). To go on, ask for "
        "that group directly (a COUNT with that WHERE clause: it is then released with its "
        "own noise), or use coarser groups and fewer overlapping filters."
    )


def counted_expression(plan: QueryPlan) -> exp.Expr | None:
    """The expression whose non-NULL rows a released count counts, when the count comes
    from COUNT(x) (or an AVG's count) rather than COUNT(*): the cell's count is the
    first of COUNT(*), COUNT(DISTINCT unit), COUNT(x), as ``gateway/pipeline/noising.py`` picks."""
    kinds = [m.kind for m in plan.measures]
    if "count_rows" in kinds or "count_units" in kinds or "count_values" not in kinds:
        return None
    return plan.measures[kinds.index("count_values")].expression


def statistics(plan: QueryPlan) -> frozenset[str]:
    """What each of the query's cells releases about its region: ``count`` (COUNT, or
    the count inside an AVG or a VARIANCE), ``sum:<expr>``, ``sum_squares:<expr>``,
    ``histogram:<expr>`` (a quantile). Only answers that release the same statistic
    combine into an estimate of it for another region."""
    out: set[str] = set()
    for m in plan.measures:
        if m.kind in ("count_rows", "count_units", "count_values"):
            out.add("count")
        else:
            out.add(f"{m.kind}:{m.expression.sql() if m.expression is not None else ''}")
    return frozenset(out)


def releases_counts(plan: QueryPlan) -> bool:
    """Whether the query's cells carry a noisy count (COUNT, or an AVG's, a VARIANCE's
    count), as ``gateway/pipeline/noising.py`` picks it; a SUM or a quantile carries none."""
    return any(m.kind in ("count_rows", "count_units", "count_values") for m in plan.measures)


def _sample(value_type: str) -> Any:
    """A value of a group key's type, to find the dimensions its cells will use."""
    return {"integer": 0, "real": 0.0, "boolean": False, "date": "2000-01-01"}.get(value_type, "")


def _shown(dim: DimensionKey) -> str:
    if dim.column is not None:
        return f"plain conditions on {dim.column}"
    return f"'{dim.sql}'"


def _queries_using(tk: TableKnowledge, dim: DimensionKey) -> tuple[str, ...]:
    names: set[str] = set()
    for part in tk.parts:
        if dim not in part.space.index:
            continue
        for info in part.info:
            if info.formula is not None and any(
                c.dimension == dim for c in info.formula.conditions()
            ):
                names.update(q for q in info.query_id.split(",") if q)
    return tuple(sorted(names))


def _declared_cells(plan: QueryPlan) -> list[tuple[Any, ...]] | None:
    """The cells a query will release, when its group keys have declared domains."""
    if not plan.group_keys:
        return [()]
    domains: list[tuple[Any, ...]] = []
    size = 1
    for g in plan.group_keys:
        if g.domain is None:
            return None
        domains.append(g.domain)
        size *= len(g.domain)
    if size > MAX_PRE_AUDIT_CELLS:
        return None
    return list(itertools.product(*domains))


"""Blocks with more answered rows than this keep the basis's own combination."""
"""Singular values below this share of the largest are rank deficiency, not signal (the
rows are 0/1 over at most ``LEAST_NOISE_MAX_ROWS`` answers, weighted by noise scales
within a few orders of magnitude: true singular values are far above it)."""
