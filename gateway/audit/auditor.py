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
import math
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from sqlglot import exp

from gateway.audit.components import Extension, TableKnowledge, add_noise_terms
from gateway.audit.confidence import CountNoise, noise_quantile, quantile_upper_bound
from gateway.audit.describe import describe_region
from gateway.audit.knowledge import Knowledge, RowInfo
from gateway.audit.normalise import Undecidable
from gateway.audit.predicates import DimensionKey, Formula, FormulaBuilder, conj
from gateway.audit.resident import ResidentScopes
from gateway.audit.space import SpaceTooLarge
from gateway.audit.span import (
    DOUBT_TOL,
    ZERO_TOL,
    Block,
    Doubt,
    coefficients,
    determined_regions,
    in_span,
)
from gateway.core.config import TableConfig
from gateway.core.joins import audit_relations
from gateway.core.plan import QueryPlan
from gateway.ops.heap import retain_freed_memory

MAX_PRE_AUDIT_CELLS = 10_000
DEFAULT_CONFIDENCE = 0.999
"""The level of the lower confidence bound a determined group's size must reach k at
(``audit.confidence``; docs/privacy.md, "Sizes from noisy answers")."""
MAX_FINDINGS = 8
COEF_TOL = 1e-9


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


@dataclass(frozen=True)
class AuditPrediction:
    """What the audit will do with a query, decided before anything is spent (a dry
    run): ``refused`` now (free), ``may_be_withheld`` after execution (it determines
    ``groups`` whose size only its own noisy answer can show), or ``answered``."""

    verdict: str
    reason: str
    groups: tuple[str, ...] = ()
    combined_with: tuple[str, ...] = ()


@dataclass(frozen=True)
class Sizing:
    """How one determined region was sized (``Auditor.observe``, for inspection): its
    estimate from the noisy answers known (in a pre-audit, before the query's own), the
    confidence margin subtracted from it, the noise terms behind both, the verdict."""

    pre: bool
    estimate: float
    margin: float
    terms: tuple[tuple[float, CountNoise], ...] | None
    small: bool


@dataclass(frozen=True)
class Finding:
    """A determined region that is too small (or whose size cannot be shown large), and
    that region as a WHERE clause over the declared columns (public: query texts)."""

    combined_with: tuple[str, ...]
    group: str = ""


ALLOWED = AuditDecision(True, (), "no small group is determined")

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
    ) -> None:
        # Each table with the columns of the tables it may join (gateway/core/joins.py): a
        # join's regions live in its anchor table's cell space.
        self.tables = audit_relations(tables)
        self.min_group_size = min_group_size
        self.alpha = 1 - confidence
        self.observe: Callable[[Sizing], None] | None = None  # sees every region sized
        self._builders = {name: FormulaBuilder(t) for name, t in self.tables.items()}
        self._state: dict[tuple[str, str], TableKnowledge] = {}
        self._saturated: set[tuple[str, str]] = set()
        self._pending: dict[tuple[str, str], tuple[str, TableKnowledge, TableKnowledge]] = {}
        self._tried: dict[
            tuple[str, str],
            tuple[
                TableKnowledge,
                tuple[Formula, ...],
                TableKnowledge,
                list[Candidate],
                tuple[int, ...],
            ],
        ] = {}
        # scopes beyond ``max_bytes`` wait on disk, exactly as they were (``resident``)
        self._resident = ResidentScopes(max_bytes)
        self._lock = threading.Lock()
        retain_freed_memory()  # the span's arrays: reused, not page-faulted afresh

    # -- public interface -------------------------------------------------------------

    def pre_audit(
        self, scope: str, plan: QueryPlan, noise: CountNoise | None = None
    ) -> AuditDecision:
        """Refuse, before anything is spent, a query that earlier noisy answers alone show
        would determine a small group, or whose conditions the auditor cannot relate to
        earlier ones. Its own answer is unknown here; ``noise`` is its counts' public
        noise (from the calibration), which the post-audit's margin will include: a group
        that cannot clear k even with the most favourable answer is refused now, free."""
        return self._pre_audit(scope, plan, None, noise)

    def _pre_audit(
        self,
        scope: str,
        plan: QueryPlan,
        open_groups: list[str] | None,
        noise: CountNoise | None = None,
    ) -> AuditDecision:
        try:
            cells = _declared_cells(plan)
            if cells is None:  # partition selection: the keys' dimensions, at least
                samples = [_sample(g.type) for g in plan.group_keys]
                formulas = self._formulas(plan, [tuple(samples)])
                with self._lock:
                    unrelated = self._unrelated(self._knowledge((scope, plan.table)), formulas)
                if unrelated is None and open_groups is not None:
                    open_groups.append("one of the groups partition selection releases")
                return unrelated or AuditDecision(True, (), "cells known only after the answer")
            stats = statistics(plan)
            rows = [
                (RowInfo("", j, None, pending=True, stats=stats), f)
                for j, f in enumerate(self._formulas(plan, cells))
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
        )

    def predict(
        self, scope: str, plan: QueryPlan, noise: CountNoise | None = None
    ) -> AuditPrediction:
        """The pre-audit's verdict, and whether a post-audit could still withhold the
        answer: the groups the query would newly determine, whose size depends on its own
        noisy answer. Changes nothing (a dry run); public information only."""
        open_groups: list[str] = []
        decision = self._pre_audit(scope, plan, open_groups, noise)
        if not decision.allowed:
            return AuditPrediction(
                "refused", decision.reason, decision.groups, decision.combined_with
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
                "computed (and charged). Asking that group directly first, at the ε you "
                "use, makes the answer certain.",
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

    def remember(self, scope: str, answer: AnsweredQuery) -> None:
        """Add a released answer to the scope's knowledge (a no-op for a known query_id)."""
        key = (scope, answer.plan.table)
        with self._lock:
            base = self._knowledge(key)
            if answer.query_id in base.query_ids:
                return
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

    def _knowledge(self, key: tuple[str, str]) -> TableKnowledge:
        self._bring_back(key[0])
        kn = self._state.get(key)
        if kn is None:
            kn = TableKnowledge(self.tables[key[1]])
            self._state[key] = kn
        return kn

    def _formulas(self, plan: QueryPlan, cells: list[tuple[Any, ...]]) -> list[Formula]:
        """The region of each cell; the WHERE formula object is shared by all of them."""
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
        keys = tuple(g.expression for g in plan.group_keys)
        return [
            conj(where, *(builder.group_condition(k, v) for k, v in zip(keys, values, strict=True)))
            for values in cells
        ]

    def _rows(self, answer: AnsweredQuery) -> list[tuple[RowInfo, Formula]]:
        formulas = self._formulas(answer.plan, [c.group_values for c in answer.cells])
        stats = statistics(answer.plan)
        return [
            (
                RowInfo(
                    answer.query_id,
                    j,
                    c.count,
                    noise=None if c.noise is None else (((answer.query_id, j), 1.0, c.noise),),
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
        tried = self._tried.get(key)
        if tried is not None and tried[0] is base and tried[1] == formulas:
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
            self._tried[key] = (base, formulas, new, candidates, tuple(c.part for c in changes))
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
    ) -> AuditDecision:
        key = (scope, table)
        with self._lock:
            base = self._knowledge(key)
            if key in self._saturated:
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
                    self.min_group_size,
                    self.alpha,
                    pre=pre,
                    observe=self.observe,
                    open_groups=open_groups,
                    pending_counts=pending_counts,
                    pending_noise=pending_noise,
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
        return AuditDecision(False, combined, refusal_reason(combined, groups), groups)


def refusal_reason(combined: tuple[str, ...], groups: tuple[str, ...]) -> str:
    """Why a query is refused, in the analyst's terms: the group it would determine (a
    WHERE clause over declared columns, from query texts only), the earlier answers it
    combines with, and what to ask instead. Never a size or a value."""
    names = ", ".join(combined) if combined else "earlier answers"
    if not groups:
        said = "a group"
    elif len(groups) == 1:
        said = f"the group WHERE {groups[0]}"
    else:
        said = "the groups " + "; ".join(f"WHERE {g}" for g in groups[:3])
        said += f" (and {len(groups) - 3} more)" if len(groups) > 3 else ""
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


def _extend(
    base: Knowledge, rows: list[tuple[RowInfo, Formula]]
) -> tuple[Knowledge, Knowledge, set[int]]:
    """(base refined and split by the rows' regions, that plus the rows, touched blocks)."""
    formulas = [f for _, f in rows]
    kn = base.refined(formulas)
    memo: dict[int, np.ndarray] = {}
    # a query's cells are disjoint: label each grid cell with the row holding it (0: none)
    label = np.zeros(kn.space.atom_of.shape, dtype=np.int32)
    disjoint = True
    for j, f in enumerate(formulas):
        m = kn.space.mask(f, memo)
        if disjoint and label[m].any():
            disjoint = False  # e.g. opaque group keys: split by one region at a time
        label[m] = j + 1
    if disjoint:
        kn = kn.split(label, len(formulas))
        atom_label = np.zeros(kn.space.n_atoms, dtype=np.int32)
        atom_label[kn.space.atom_of.ravel()] = label.ravel()
        masks_of_rows = [atom_label == j + 1 for j in range(len(formulas))]
    else:
        for f in formulas:
            kn = kn.split(kn.space.mask(f, memo).astype(np.int32), 1)
        masks_of_rows = []
        for f in formulas:
            a = np.zeros(kn.space.n_atoms, dtype=bool)
            a[kn.space.atom_of[kn.space.mask(f, memo)]] = True
            masks_of_rows.append(a)
    old = kn
    new, touched = kn.with_rows(
        [(info, a) for (info, _), a in zip(rows, masks_of_rows, strict=True)]
    )
    return old, new, touched


def _in_old_span(old: Knowledge, region: np.ndarray) -> bool:
    atoms = np.nonzero(region)[0]
    owners = old.block_of[atoms]
    if np.any(owners < 0):
        return False
    for b in {int(o) for o in owners}:
        block = old.blocks[b]
        if not in_span(block, region[block.cols][None, :].astype(float))[0]:
            return False
    return True


def _in_old_spans(old: Knowledge, cols: np.ndarray, locals_: list[np.ndarray]) -> list[bool] | None:
    """``_in_old_span`` of many regions (atom masks over ``cols``) at once: one residual
    per old block for all of them. None when a region is in doubt in a block the one by
    one test might not reach (it stops at a block that does not hold its region): the
    caller then tests them one by one, exactly as before."""
    if not locals_:
        return []
    masks = np.zeros((len(locals_), old.space.n_atoms), dtype=bool)
    for i, local in enumerate(locals_):
        masks[i, cols[local]] = True
    out = np.ones(len(locals_), dtype=bool)
    owners = old.block_of
    free = owners[: old.space.n_atoms] < 0
    out &= ~np.any(masks & free[None, :], axis=1)
    for block in old.blocks:
        sub = masks[:, block.cols]
        hit = out & np.any(sub, axis=1)
        if not hit.any():
            continue
        res = np.abs(block.residual(sub[hit].astype(float)))
        if np.any((res >= ZERO_TOL) & (res < DOUBT_TOL)):
            return None
        out[np.nonzero(hit)[0][~np.all(res < ZERO_TOL, axis=-1)]] = False
    return out.tolist()


def _statistics_apart(kn: Knowledge, block: Block) -> list[str]:
    """The statistics a block's answers release, when no one statistic is released by
    all of them (empty: they share one, or release unknown ones — one span for all)."""
    # a block's answers release a few distinct statistic sets: read each set once
    info = kn.info
    kinds = {info[i].stats for i in block.asked_ids}
    kinds.discard(None)
    if not kinds:
        return []
    sets = [k for k in kinds if k is not None]
    return [] if frozenset.intersection(*sets) else sorted(frozenset().union(*sets))


def _sub_block(kn: Knowledge, block: Block, statistic: str) -> Block:
    """The span of the block's answers that release ``statistic`` (or anything)."""
    sub = Block.empty(block.cols)
    for j, row_id in enumerate(block.asked_ids):
        stats = kn.info[row_id].stats
        if stats is None or statistic in stats:
            sub, _ = sub.insert(block.asked[j].astype(float), row_id)
    return sub


def _in_old_sub_span(old: Knowledge, region: np.ndarray, statistic: str) -> bool:
    """``_in_old_span`` within the answers that release ``statistic``."""
    atoms = np.nonzero(region)[0]
    owners = old.block_of[atoms]
    if np.any(owners < 0):
        return False
    for b in {int(o) for o in owners}:
        block = _sub_block(old, old.blocks[b], statistic)
        if not in_span(block, region[old.blocks[b].cols][None, :].astype(float))[0]:
            return False
    return True


@dataclass(frozen=True)
class Candidate:
    """A determined region never asked and not determined before: where it lies
    (component, block, atoms over the block's columns) and its coefficients over the
    block's members."""

    part: int
    block: int
    local: np.ndarray
    coefs: np.ndarray
    counts: Block | None = None  # the span ``coefs`` are over (None: the whole block)


def _candidates(changes: list[Extension]) -> list[Candidate]:
    """The regions the new rows determine that must be sized (structure only)."""
    out: list[Candidate] = []
    for change in changes:
        out += _part_candidates(
            change.part, change.old, change.new, change.touched, rescan=change.rescan
        )
    return out


def _part_candidates(
    part: int, old: Knowledge, new: Knowledge, touched: set[int], *, rescan: bool
) -> list[Candidate]:
    out: list[Candidate] = []
    for b in sorted(touched):
        block = new.blocks[b]
        apart = _statistics_apart(new, block)
        # Only answers releasing one statistic combine into an estimate of it (a COUNT
        # minus a SUM estimates nothing): a block whose answers share none is searched
        # per statistic, in the span of the answers that release it.
        searched: list[tuple[str | None, np.ndarray]] = (
            [(None, r) for r in determined_regions(block, changed_only=not rescan)]
            if not apart
            else [
                (name, r)
                for name in apart
                for r in determined_regions(_sub_block(new, block, name), changed_only=False)
            ]
        )
        seen: set[bytes] = set()
        counts = _sub_block(new, block, "count") if apart else None
        direct = {row.tobytes() for row in block.asked} if searched else set()
        searched = [(name, local) for name, local in searched if local.tobytes() not in direct]
        # (what is not released directly: with its own noise, it is no candidate)
        plain = [j for j, (name, _) in enumerate(searched) if name is None]
        spans = _in_old_spans(old, block.cols, [searched[j][1] for j in plain])
        old_spans = {} if spans is None else dict(zip(plain, spans, strict=True))
        for j, (name, local) in enumerate(searched):
            region = np.zeros(new.space.n_atoms, dtype=bool)
            region[block.cols[local]] = True
            if name is not None:
                known = _in_old_sub_span(old, region, name)
            elif j in old_spans:
                known = old_spans[j]
            else:
                known = _in_old_span(old, region)
            if known or local.tobytes() in seen:
                continue
            seen.add(local.tobytes())
            if counts is not None and in_span(counts, local[None, :].astype(float))[0]:
                # its size from the answers that release a count, whatever statistic
                # found it: a SUM's or a quantile's row, combined in, would leave the
                # estimate unknown where the counts alone give one
                out.append(Candidate(part, b, local, coefficients(counts, local), counts))
            else:
                out.append(Candidate(part, b, local, coefficients(block, local)))
    return out


def _findings(
    tk: TableKnowledge,
    candidates: list[Candidate],
    k: int,
    alpha: float,
    *,
    pre: bool,
    observe: Callable[[Sizing], None] | None = None,
    open_groups: list[str] | None = None,
    pending_counts: bool = True,
    pending_noise: CountNoise | None = None,
) -> list[Finding]:
    """The candidates not shown to hold ``k`` people or more with confidence 1 − ``alpha``
    (a lower confidence bound from the noisy answers and their public noise scales)."""
    out: list[Finding] = []
    cache: dict[tuple[int, int, bool], _BlockCounts] = {}
    least: dict[tuple[int, int, bool], tuple[Block, _BlockCounts, _LeastNoise | None]] = {}
    for cand in candidates:
        new = tk.parts[cand.part]
        block = new.blocks[cand.block] if cand.counts is None else cand.counts
        at = (cand.part, cand.block, cand.counts is not None)
        if at not in cache:
            every = replace(block, members=block.asked_ids)
            cache[at] = _BlockCounts.of(new, block)
            everyone = _BlockCounts.of(new, every)
            least[at] = (every, everyone, _LeastNoise.of(new, block, pending_noise))
        bc = cache[at]
        local = cand.local
        coefs = cand.coefs
        every, everyone, solver = least[at]
        better = solver.coefficients(local) if solver is not None else None
        if better is not None:
            # the same region from the answers combined with the least noise (chosen from
            # the public scales only, never the values): a tighter, equally valid bound
            block, bc, coefs = every, everyone, better
        asked = block.asked
        used = np.abs(coefs) > COEF_TOL
        known = used & bc.member_known
        estimate = float(coefs[known] @ bc.member_counts[known])
        unknown = bool(np.any(used & bc.member_unknown))
        noise: dict[tuple[str, int], tuple[float, CountNoise]] | None = {}
        if bc.own_noise:  # what ``add_noise_terms`` gives, read off directly
            direct_terms: dict[tuple[str, int], tuple[float, CountNoise]] = {}
            for i in np.nonzero(known)[0]:
                ((source, _, own),) = bc.member_info[i].noise or ()
                direct_terms[source] = (float(coefs[i]), own)
            noise = direct_terms
        else:
            for i in np.nonzero(known)[0]:
                noise = add_noise_terms(noise, float(coefs[i]), bc.member_info[i].noise)
        # the confidence margin of ``noise``, computed only where a decision needs it
        # exactly: a size that clears k with ``quantile_upper_bound`` (no smaller) clears
        # it with the margin itself, for a fraction of the cost
        margin: float | None = math.inf if noise is None else None
        extra = 0.0
        bounds: set[int] = set()
        for i in np.nonzero(used & bc.member_pending)[0]:
            c = float(coefs[i])
            if c <= 0:
                continue  # a pending count is ≥ 0: a negative term only lowers the bound
            mine = asked[bc.position[block.members[i]]]
            contains = ~np.any(mine[None, :] & ~asked, axis=1) & bc.counted
            if contains.any():
                best = int(np.nonzero(contains)[0][np.argmin(bc.counts[contains])])
                bounds.add(block.asked_ids[best])
                extra += c * float(bc.counts[best])
            else:
                extra = math.inf
        direct: set[int] | None = None
        upper = math.inf if unknown else estimate + extra
        pending_used = bool(np.any(used & bc.member_pending))
        if pre and (unknown or (pending_used and not pending_counts)):
            # No count estimate, before or after the answer (a SUM's or a quantile's
            # region, or this query releases no count): the post-audit would decide from
            # the answered counts inside the region alone, and those are known now —
            # unless one of this query's own cells lies inside it and brings a count.
            # So decide now, for free (the same rule, the same noisy counts).
            inside = ~np.any(asked & ~local[None, :], axis=1)
            lows = [
                bc.counts[j] - noise_quantile(_terms(new.info[block.asked_ids[j]]), alpha)
                for j in np.nonzero(inside & bc.counted)[0]
            ]
            shown = bool(lows) and max(lows) >= k
            small = not shown and not (pending_counts and bool(np.any(inside & bc.pending)))
        elif pre:
            # a region inside an answered region is no larger than its noisy count
            supersets = ~np.any(local[None, :] & ~asked, axis=1) & bc.counted
            upper_direct = float(np.min(bc.counts[supersets])) if supersets.any() else math.inf
            # the post-audit's margin will include this query's own noise (public: its
            # calibration), so count it in now
            full_terms = None if noise is None else list(noise.values())
            if pending_noise is not None and noise is not None and pending_used:
                with_new = dict(noise)
                for i in np.nonzero(used & bc.member_pending)[0]:
                    source = ("", bc.member_info[i].cell)
                    with_new[source] = (float(coefs[i]), pending_noise)
                full_terms = list(with_new.values())
            # refuse before spending only when the answer cannot help: even at its upper
            # bound, the confidence bound (with every noise it will carry) stays below k
            if full_terms is None:
                small = min(upper - math.inf, upper_direct) < k
            elif (
                observe is None
                and upper_direct >= k
                and math.isfinite(upper)
                and upper - quantile_upper_bound(full_terms, alpha) >= k
            ):
                small = False  # then upper − full ≥ k too
            else:
                small = min(upper - noise_quantile(full_terms, alpha), upper_direct) < k
            if small and upper_direct < upper:
                best = int(np.nonzero(supersets)[0][np.argmin(bc.counts[supersets])])
                direct = {block.asked_ids[best]}
        elif unknown:
            # no count estimate: only an answered region inside it can show it is large
            subsets = ~np.any(asked & ~local[None, :], axis=1) & bc.counted
            lows = [
                bc.counts[j] - noise_quantile(_terms(new.info[block.asked_ids[j]]), alpha)
                for j in np.nonzero(subsets)[0]
            ]
            small = not lows or max(lows) < k
        elif (
            margin is None
            and observe is None
            and noise is not None
            and estimate - quantile_upper_bound(list(noise.values()), alpha) >= k
        ):
            small = False  # then estimate − margin ≥ k too
        else:
            if margin is None:
                assert noise is not None
                margin = noise_quantile(list(noise.values()), alpha)
            small = estimate - margin < k
        waits = pre and not small and open_groups is not None and len(open_groups) < MAX_FINDINGS
        if waits and open_groups is not None and pending_used:
            # its size rests on the new answer too: the post-audit decides
            open_groups.append(describe_region(new.space, block.cols[local]))
        if observe is not None:
            terms = None if noise is None else tuple(noise.values())
            if margin is None:
                margin = noise_quantile(list(noise.values()), alpha) if noise else 0.0
            observe(Sizing(pre, upper if pre else estimate, margin, terms, small))
        if small:
            rows = (
                direct
                if direct is not None
                else set(block.members[i] for i in np.nonzero(used)[0]) | bounds
            )
            names = {q for r in rows for q in new.info[r].query_id.split(",") if q}
            group = describe_region(new.space, block.cols[local])
            out.append(Finding(tuple(sorted(names)), group))
            if len(out) >= MAX_FINDINGS:
                break  # enough to refuse and to name the queries involved
    return out


def _terms(info: RowInfo) -> list[tuple[float, CountNoise]]:
    if info.noise is None:
        return [(1.0, CountNoise("laplace", math.inf))]
    return [(c, n) for _, c, n in info.noise]


@dataclass(frozen=True)
class _BlockCounts:
    """A block's noisy counts, over its asked rows and over its basis members."""

    counted: np.ndarray
    counts: np.ndarray
    pending: np.ndarray  # asked rows of the query being pre-audited
    position: dict[int, int]
    member_counts: np.ndarray
    member_known: np.ndarray
    member_unknown: np.ndarray
    member_pending: np.ndarray
    member_info: list[RowInfo]
    # every counted member's noise is its own single term (coefficient 1, no source
    # shared): a combination's noise terms are then its coefficients, one per member
    own_noise: bool = False

    @staticmethod
    def of(new: Knowledge, block: Block) -> _BlockCounts:
        infos = [new.info[i] for i in block.asked_ids]
        position = {row_id: j for j, row_id in enumerate(block.asked_ids)}
        members = [new.info[i] for i in block.members]
        for i, (row_id, r) in enumerate(zip(block.members, members, strict=True)):
            if r.count is None and not r.pending:
                # a SUM released no count; the same region answered by another query
                # with one (an AVG, a COUNT) stands in for it
                same = np.all(block.asked == block.asked[position[row_id]][None, :], axis=1)
                for j in np.nonzero(same)[0]:
                    other = infos[j]
                    if other.count is not None and not other.pending:
                        members[i] = other
                        break
        pending = np.array([r.pending for r in members], dtype=bool)
        missing = np.array([r.count is None for r in members], dtype=bool)
        counted = [r.noise for r in members if not r.pending and r.count is not None]
        own = all(t is not None and len(t) == 1 and t[0][1] == 1.0 for t in counted)
        own = own and len({t[0][0] for t in counted if t is not None}) == len(counted)
        return _BlockCounts(
            counted=np.array([r.count is not None and not r.pending for r in infos], dtype=bool),
            counts=np.array([r.count if r.count is not None else np.nan for r in infos]),
            pending=np.array([r.pending for r in infos], dtype=bool),
            position=position,
            member_counts=np.array([r.count if r.count is not None else 0.0 for r in members]),
            member_known=~pending & ~missing,
            member_unknown=~pending & missing,
            member_pending=pending,
            member_info=members,
            own_noise=own,
        )


LEAST_NOISE_MAX_ROWS = 300
"""Blocks with more answered rows than this keep the basis's own combination."""
PINV_RCOND = 1e-10
"""Singular values below this share of the largest are rank deficiency, not signal (the
rows are 0/1 over at most ``LEAST_NOISE_MAX_ROWS`` answers, weighted by noise scales
within a few orders of magnitude: true singular values are far above it)."""


@dataclass(frozen=True)
class _LeastNoise:
    """The combination of a block's answered counts that estimates a region with the
    least noise variance: rows whose count carries its own noise (independent of every
    other row's) and this query's own cells, weighted by their public noise variance
    (generalised least squares, minimum weighted norm). The choice depends on the query
    texts and public scales only, so the bound it gives is as valid as any other's."""

    rows: np.ndarray  # the eligible rows (positions in the block's asked rows)
    solve: np.ndarray  # region (over the block's columns) → coefficients over ``rows``
    asked: np.ndarray
    n: int

    @staticmethod
    def of(kn: Knowledge, block: Block, pending: CountNoise | None) -> _LeastNoise | None:
        variance = []
        rows = []
        sources: set[tuple[str, int]] = set()
        for j, row_id in enumerate(block.asked_ids):
            info = kn.info[row_id]
            noise: CountNoise | None = None
            if info.pending:
                noise, source = pending, ("", -1 - j)
            elif info.count is not None and info.noise is not None and len(info.noise) == 1:
                source, c, own = info.noise[0]
                noise = own if abs(c - 1.0) <= COEF_TOL else None
            if noise is None or not math.isfinite(noise.scale) or noise.scale <= 0:
                continue
            if source in sources:
                continue  # the same noise twice (a row derived from another): dependent
            sources.add(source)
            rows.append(j)
            scale = noise.scale
            variance.append(2 * scale * scale if noise.mechanism == "laplace" else scale * scale)
        if not rows or len(rows) > LEAST_NOISE_MAX_ROWS:
            return None
        picked = np.array(rows, dtype=np.intp)
        asked = block.asked[picked].astype(float)  # rows × columns
        root = np.sqrt(np.array(variance))
        # minimise Σ (cᵢ·σᵢ)² subject to Σ cᵢ·aᵢ = region: u = σ·c, the least-norm u.
        # The answered regions are rarely independent (a breakdown's cells sum to an
        # earlier total): singular values that are rounding noise must count as zero, or
        # their inverses swamp the solution and every region looks undetermined here.
        solve = root[:, None] ** -1 * np.linalg.pinv(asked.T / root[None, :], rcond=PINV_RCOND)
        return _LeastNoise(picked, solve, asked, len(block.asked_ids))

    def coefficients(self, region: np.ndarray) -> np.ndarray | None:
        """Coefficients over every asked row (zero for the others), or None when the
        eligible rows alone do not determine ``region``."""
        target = region.astype(float)
        c = self.solve @ target
        if np.max(np.abs(c @ self.asked - target), initial=0.0) > 1e-7:
            return None
        out = np.zeros(self.n)
        out[self.rows] = np.where(np.abs(c) > COEF_TOL, c, 0.0)
        return out
