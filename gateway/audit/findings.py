"""What answered regions determine, and which of those groups are too small.

Given a scope's knowledge and a query's new regions, ``_extend`` finds how the span of
answered regions grows; ``_candidates`` the regions that become determined; ``_findings``
sizes each from the noisy answers (a lower confidence bound, ``confidence``) and reports
those below ``min_group_size`` (a ``Finding``, with the ``Sizing`` behind it). Everything
here reads query texts, the public schema and noisy answers only (docs/privacy.md,
"Sizes from noisy answers"); the ``Auditor`` (``auditor``) decides with it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from gateway.audit.components import Extension, TableKnowledge, add_noise_terms
from gateway.audit.confidence import CountNoise, noise_quantile, quantile_upper_bound
from gateway.audit.describe import Lookups, describe_region
from gateway.audit.knowledge import Knowledge, RowInfo
from gateway.audit.predicates import Formula
from gateway.audit.span import DOUBT_TOL, ZERO_TOL, Block, coefficients, determined_regions, in_span

MAX_FINDINGS = 8
COEF_TOL = 1e-9


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
    # the answered cells its estimate needs, as (query id, cell): a post-audit names
    # those of the query it audits (``AuditDecision.cells``)
    cells: tuple[tuple[str, int], ...] = ()
    # no count can size the group (SUMs or quantiles describe it): only a count of it,
    # or one this query brings, can show it large (``refusal_reason`` says so)
    uncounted: bool = False


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
        # already split by the cells (their regions are unions of atoms): nothing to do
        atom_label = kn.space.aligned(label)
        if atom_label is None:
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
    lookups: Lookups | None = None,
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
        uncounted = False
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
            uncounted = True
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
            uncounted = True
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
            open_groups.append(describe_region(new.space, block.cols[local], lookups))
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
            group = describe_region(new.space, block.cols[local], lookups)
            # the answered cells its structural combination uses (one per basis row, so
            # no more than the group needs; the least-noise one may spread over all)
            basis = (new.blocks[cand.block] if cand.counts is None else cand.counts).members
            cells = sorted(
                {
                    (new.info[basis[i]].query_id, new.info[basis[i]].cell)
                    for i in np.nonzero(np.abs(cand.coefs) > COEF_TOL)[0]
                }
            )
            out.append(Finding(tuple(sorted(names)), group, tuple(cells), uncounted))
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


PINV_RCOND = 1e-10


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
