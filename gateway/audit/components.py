"""A scope's knowledge of one table, split into independent components by dimension.

Queries that never mention a common dimension cannot combine into a narrower region:
if f(age) + g(city) is a 0/1 indicator for every age and city, one of f and g is
constant. So the span of all answered regions is the sum of the spans of *components*
— groups of rows connected through the dimensions they use — provided every component
also knows the regions that use no dimension at all (``COUNT(*)`` over everyone), which
are therefore copied into each. Each component has its own, much smaller, cell space;
a query that bridges components merges them (replaying their rows in a fresh space).

A declared domain constraint (``null_when``) ties its dimensions together: a component
using any of them holds them all, and the constraint with them (``CellSpace``). A
component that comes to need a constraint it did not hold replays its rows in a fresh
space holding it, so that every region of the component leaves out the cells the
constraint rules out, the old ones too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from gateway.audit.confidence import CountNoise
from gateway.audit.knowledge import Knowledge, NoiseTerms, RowInfo
from gateway.audit.predicates import TRUE, DimensionKey, DomainConstraint, Formula
from gateway.audit.space import CellSpace
from gateway.audit.span import coefficients, in_span
from gateway.core.config import TableConfig

COEF_TOL = 1e-9

Rows = list[tuple[RowInfo, Formula]]
ExtendFn = Callable[[Knowledge, Rows], tuple[Knowledge, Knowledge, set[int]]]
"""``(knowledge, rows) → (knowledge refined and split for rows, with rows, touched)``."""


@dataclass(frozen=True)
class Extension:
    """One component changed by new rows: its index, before and after, touched blocks."""

    part: int
    old: Knowledge
    new: Knowledge
    touched: set[int]
    rescan: bool = False  # changed by two extensions: look at every basis row again


@dataclass(frozen=True)
class TableKnowledge:
    """Components (``parts``) with the dimensions each uses, plus the dimensionless rows
    every component holds a copy of."""

    table: TableConfig
    parts: tuple[Knowledge, ...] = ()
    dims: tuple[frozenset[DimensionKey], ...] = ()
    constant_rows: tuple[tuple[RowInfo, Formula], ...] = ()
    query_ids: frozenset[str] = frozenset()
    universe_added: bool = False  # the last ``extend`` shared a derived everyone-row
    constraints: tuple[DomainConstraint, ...] = ()  # the table's declared (``null_when``)

    def constrained(
        self, used: frozenset[DimensionKey]
    ) -> tuple[frozenset[DimensionKey], tuple[DomainConstraint, ...]]:
        """``used`` with the dimensions of every constraint on a column they claim
        (repeatedly: constraints sharing a column come together), and those constraints."""
        found: list[DomainConstraint] = []
        changed = True
        while changed:
            changed = False
            claimed = frozenset().union(*(d.columns for d in used))
            for c in self.constraints:
                if c not in found and c.columns & claimed:
                    found.append(c)
                    used = used | c.dimensions
                    changed = True
        return used, tuple(c for c in self.constraints if c in found)

    def extend(self, rows: Rows, extend_one: ExtendFn) -> tuple[TableKnowledge, list[Extension]]:
        """The knowledge with ``rows`` added, and the components that changed."""
        rows = [(r.with_formula(f), f) for r, f in rows]
        used = self.constrained(frozenset(c.dimension for _, f in rows for c in f.conditions()))[0]
        parts = list(self.parts)
        dims = list(self.dims)
        constant_rows = self.constant_rows
        changes: list[Extension] = []
        if not used:
            constant_rows = constant_rows + tuple(rows)
            if not parts:
                parts.append(Knowledge(space=CellSpace(self.table)))
                dims.append(frozenset())
            for i, part in enumerate(parts):
                old, new, touched = extend_one(part, rows)
                parts[i] = new
                changes.append(Extension(i, old, new, touched))
        else:
            hit = [i for i, d in enumerate(dims) if (d & used) or not d]
            merged_dims = frozenset().union(used, *(dims[i] for i in hit))
            needed = self.constrained(merged_dims)[1]
            if len(hit) == 1 and set(needed) <= set(parts[hit[0]].space.constraints):
                base = parts[hit[0]]
            else:
                base = _replay(self, hit, extend_one, needed)
            old, new, touched = extend_one(base, rows)
            keep = [i for i in range(len(parts)) if i not in hit]
            parts = [parts[i] for i in keep] + [new]
            dims = [dims[i] for i in keep] + [merged_dims]
            changes.append(Extension(len(parts) - 1, old, new, touched))
        out = replace(
            self,
            parts=tuple(parts),
            dims=tuple(dims),
            constant_rows=constant_rows,
            query_ids=self.query_ids | {r.query_id for r, _ in rows if r.cell >= 0},
            universe_added=False,  # (set below when it shares a derived everyone-row)
        )
        if out.constant_rows:
            return out, changes
        for change in changes:
            universe = _universe(change.new)
            if universe is None:
                continue
            # one component now determines everyone: every other component must know it
            # too (not this one: there the row is already in the span)
            row = (universe, TRUE)
            first = {c.part: c for c in changes}
            parts = list(out.parts)
            merged = [first[change.part]]
            for i, part in enumerate(parts):
                if i == change.part:
                    continue
                old, new, touched = extend_one(part, [row])
                parts[i] = new
                before = first.get(i)
                if before is not None:
                    merged.append(Extension(i, before.old, new, set(range(len(new.blocks))), True))
                else:
                    merged.append(Extension(i, old, new, touched))
            shared = replace(
                out,
                parts=tuple(parts),
                constant_rows=(*out.constant_rows, row),
                universe_added=True,
            )
            return shared, merged
        return out, changes


def _replay(
    tk: TableKnowledge,
    hit: list[int],
    extend_one: ExtendFn,
    constraints: tuple[DomainConstraint, ...],
) -> Knowledge:
    """One component holding the dimensionless rows and the rows of components ``hit``,
    in a space that holds ``constraints``."""
    kn = Knowledge(space=CellSpace(tk.table, constraints))
    replay: Rows = list(tk.constant_rows)
    for i in hit:
        for info in tk.parts[i].info:
            if info.formula is not None and info.formula.conditions():
                replay.append((info, info.formula))
    # rows of one query are replayed together (its cells are disjoint)
    start = 0
    while start < len(replay):
        end = start + 1
        qid = replay[start][0].query_id
        while end < len(replay) and replay[end][0].query_id == qid:
            end += 1
        kn = extend_one(kn, replay[start:end])[1]
        start = end
    return kn


def _universe(kn: Knowledge) -> RowInfo | None:
    """A row for "everyone" when ``kn``'s span holds it: its count is the same
    combination of noisy answers (unknown if it needs an unanswered or count-less row).
    Atoms empty by declaration (``CellSpace.possible_atoms``) are in no region and need
    not be: everyone is every row there can be."""
    if kn.space.n_atoms == 0:
        return None
    untouched = kn.block_of[: kn.space.n_atoms] < 0
    if np.any(untouched) and (
        not kn.space.constraints or np.any(untouched & kn.space.possible_atoms())
    ):
        return None
    estimate = 0.0
    pending = unknown = False
    sources: set[str] = set()
    stats: frozenset[str] | None = None  # what every row it combines releases
    noise: dict[tuple[str, int], tuple[float, CountNoise]] | None = {}
    for block in kn.blocks:
        ones = np.ones(len(block.cols), dtype=bool)
        if not in_span(block, ones[None, :].astype(float))[0]:
            return None
        for c, member in zip(coefficients(block, ones), block.members, strict=True):
            if abs(c) <= COEF_TOL:
                continue
            info = kn.info[member]
            sources.update(q for q in info.query_id.split(",") if q)
            if info.stats is not None:
                stats = info.stats if stats is None else stats & info.stats
            if info.pending:
                pending = True
            elif info.count is None:
                unknown = True
            else:
                estimate += float(c) * info.count
                noise = add_noise_terms(noise, float(c), info.noise)
    count = None if (pending or unknown) else estimate
    terms = None if noise is None else pack_noise_terms(noise)
    # the derived row names the queries it comes from (cell −1 marks it as derived)
    return RowInfo(
        ",".join(sorted(sources)),
        -1,
        count,
        pending=pending,
        formula=TRUE,
        noise=terms,
        stats=stats or None,  # none in common: treated as releasing anything
    )


def add_noise_terms(
    acc: dict[tuple[str, int], tuple[float, CountNoise]] | None,
    coef: float,
    terms: NoiseTerms | None,
) -> dict[tuple[str, int], tuple[float, CountNoise]] | None:
    """``acc`` plus ``coef`` times a row's noise terms, by source (None: unknown)."""
    if acc is None or terms is None:
        return None
    for source, c, noise in terms:
        before = acc.get(source, (0.0, noise))[0]
        acc[source] = (before + coef * c, noise)
    return acc


def pack_noise_terms(acc: dict[tuple[str, int], tuple[float, CountNoise]]) -> NoiseTerms:
    return tuple((s, c, n) for s, (c, n) in sorted(acc.items()) if abs(c) > COEF_TOL)
