"""The span of answered regions, kept as independent blocks in reduced row echelon form.

Answered regions are 0/1 indicator vectors over atoms. A region R is *determined* when
its indicator lies in their span over the rationals: some linear combination of the
released answers is then an estimate of R's count (and, for SUM and AVG, of its sum).

Regions that share no atom never combine, so the span splits into blocks: connected
groups of atoms with their own small RREF basis. Each basis row also records which
answered rows it is a combination of (``origin``), so that a determined region's
estimate and the earlier queries it combines are read off directly.

Arithmetic is float64 with partial pivoting; any value within the doubt band of 0 or 1
makes the block be recomputed exactly in rationals (``Fraction``), and if doubt remains
the caller refuses (``Doubt``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from fractions import Fraction

import numpy as np

ZERO_TOL = 1e-9
DOUBT_TOL = 1e-6
EXACT_MAX_ROWS = 400
"""Blocks with more answered rows than this are not recomputed exactly (doubt refuses)."""
EXHAUSTIVE_ATOMS = 12
"""Blocks with at most this many atoms get every minimal determined region, exactly."""


class Doubt(Exception):
    """Floating point could not decide, and neither could the exact recomputation."""


@dataclass(frozen=True)
class Block:
    """One connected part of the span: ``cols`` (atom ids), RREF ``basis`` rows, their
    ``pivots`` (column positions) and ``origin`` (basis row → answered-row coefficients
    over ``members``, the answered rows that were independent when added). ``asked``
    holds every answered region inside the block (dependent ones too) as a Boolean
    matrix over ``cols``, with their row ids in ``asked_ids``."""

    cols: np.ndarray
    basis: np.ndarray
    pivots: np.ndarray
    origin: np.ndarray
    members: tuple[int, ...]
    asked: np.ndarray
    asked_ids: tuple[int, ...]
    dirty: np.ndarray | None = None  # basis rows changed since ``clean()`` (None: all)

    def clean(self) -> Block:
        """The same block with no basis row marked as changed."""
        # built directly: ``dataclasses.replace`` costs more than the rest (every block
        # touched by every row is cleaned)
        return Block(
            self.cols,
            self.basis,
            self.pivots,
            self.origin,
            self.members,
            self.asked,
            self.asked_ids,
            np.zeros(self.rank, dtype=bool),
        )

    def dirty_rows(self) -> np.ndarray:
        return np.ones(self.rank, dtype=bool) if self.dirty is None else self.dirty

    @staticmethod
    def empty(cols: np.ndarray) -> Block:
        n = len(cols)
        return Block(
            cols,
            np.zeros((0, n)),
            np.zeros(0, dtype=np.intp),
            np.zeros((0, 0)),
            (),
            np.zeros((0, n), dtype=bool),
            (),
        )

    @property
    def rank(self) -> int:
        return len(self.pivots)

    def residual(self, x: np.ndarray) -> np.ndarray:
        """``x`` minus its reduction by the basis (zero iff ``x`` is in the span)."""
        if self.rank == 0:
            return x.astype(float)
        return x - x[..., self.pivots] @ self.basis

    def insert(self, x: np.ndarray, row_id: int) -> tuple[Block, bool]:
        """The block with answered row ``x`` (0/1 over ``cols``) added; False if dependent."""
        res = self.residual(x)
        o = -(x[self.pivots] @ self.origin) if self.rank else np.zeros(0)
        big = float(np.max(np.abs(res))) if res.size else 0.0
        asked = np.vstack([self.asked, x[None, :] > 0.5])
        asked_ids = (*self.asked_ids, row_id)
        if big < ZERO_TOL:
            return (
                Block(
                    self.cols,
                    self.basis,
                    self.pivots,
                    self.origin,
                    self.members,
                    asked,
                    asked_ids,
                    self.dirty,
                ),
                False,
            )
        if big < DOUBT_TOL:
            if len(asked_ids) > EXACT_MAX_ROWS:
                raise Doubt
            rebuilt = exact_block(replace(self, asked=asked, asked_ids=asked_ids))
            return rebuilt, rebuilt.rank > self.rank
        p = int(np.argmax(np.abs(res)))
        scale = res[p]
        res = res / scale
        o = np.append(o, 1.0) / scale
        r, n = self.basis.shape
        c = self.basis[:, p].copy()
        hit = np.nonzero(c)[0]  # only rows with an entry in the new pivot column change
        basis = np.empty((r + 1, n))
        if 2 * len(hit) > r:  # dense: the updated copy written in place (no temporary)
            origin = np.empty((r + 1, r + 1))
            np.multiply.outer(c, res, out=basis[:r])
            np.subtract(self.basis, basis[:r], out=basis[:r])
            np.multiply.outer(c, o[:r], out=origin[:r, :r])
            np.subtract(self.origin, origin[:r, :r], out=origin[:r, :r])
            origin[:r, r] = -c * o[r]
        else:
            origin = np.zeros((r + 1, r + 1))
            basis[:r] = self.basis
            basis[hit] -= np.outer(c[hit], res)
            origin[:r, :r] = self.origin
            origin[hit] -= np.outer(c[hit], o)
        basis[hit, p] = 0.0
        basis[r] = res
        origin[r] = o
        return (
            Block(
                self.cols,
                basis,
                np.append(self.pivots, p).astype(np.intp),
                origin,
                (*self.members, row_id),
                asked,
                asked_ids,
                np.append(self.dirty_rows() | (c != 0), True),
            ),
            True,
        )

    def reordered(self, cols: np.ndarray, take: np.ndarray) -> Block:
        """The same span over refined atoms: new column j copies old column ``take[j]``."""
        if len(take) == len(self.cols) and np.array_equal(take, np.arange(len(take))):
            return replace(self, cols=cols)
        # each old pivot column goes to the first new column copying it
        old, first_new = np.unique(take, return_index=True)
        first = np.zeros(int(old[-1]) + 1 if len(old) else 0, dtype=np.intp)
        first[old] = first_new
        pivots = first[self.pivots].astype(np.intp)
        return Block(
            cols,
            self.basis[:, take],
            pivots,
            self.origin,
            self.members,
            self.asked[:, take],
            self.asked_ids,
            self.dirty,
        )


def merge(blocks: list[Block], free: np.ndarray) -> Block:
    """One block made of several (block-diagonal) plus atoms no row touched yet."""
    cols = np.concatenate([b.cols for b in blocks] + [free])
    n = len(cols)
    r = sum(b.rank for b in blocks)
    basis = np.zeros((r, n))
    origin = np.zeros((r, r))
    pivots: list[int] = []
    members: list[int] = []
    asked = np.zeros((sum(len(b.asked_ids) for b in blocks), n), dtype=bool)
    asked_ids: list[int] = []
    ro, co, ao = 0, 0, 0
    for b in blocks:
        basis[ro : ro + b.rank, co : co + len(b.cols)] = b.basis
        origin[ro : ro + b.rank, ro : ro + b.rank] = b.origin
        asked[ao : ao + len(b.asked_ids), co : co + len(b.cols)] = b.asked
        pivots.extend((b.pivots + co).tolist())
        members.extend(b.members)
        asked_ids.extend(b.asked_ids)
        ro += b.rank
        co += len(b.cols)
        ao += len(b.asked_ids)
    return Block(
        cols,
        basis,
        np.array(pivots, dtype=np.intp),
        origin,
        tuple(members),
        asked,
        tuple(asked_ids),
        np.concatenate([b.dirty_rows() for b in blocks] + [np.zeros(0, dtype=bool)]),
    )


def exact_block(block: Block) -> Block:
    """The block rebuilt in exact rational arithmetic from its answered rows."""
    cols = block.cols
    rows = list(zip(block.asked_ids, block.asked, strict=True))
    n = len(cols)
    basis: list[list[Fraction]] = []
    origin: list[dict[int, Fraction]] = []
    pivots: list[int] = []
    members: list[int] = []
    for row_id, x in rows:
        v = [Fraction(int(a)) for a in x]
        o: dict[int, Fraction] = {}
        for b, ob, p in zip(basis, origin, pivots, strict=True):
            f = v[p]
            if f:
                v = [a - f * c for a, c in zip(v, b, strict=True)]
                for k, w in ob.items():
                    o[k] = o.get(k, Fraction(0)) - f * w
        p = next((j for j, a in enumerate(v) if a), -1)
        if p < 0:
            continue
        s = v[p]
        v = [a / s for a in v]
        o[len(members)] = o.get(len(members), Fraction(0)) + 1
        o = {k: w / s for k, w in o.items()}
        for i, b in enumerate(basis):
            f = b[p]
            if f:
                basis[i] = [a - f * c for a, c in zip(b, v, strict=True)]
                for k, w in o.items():
                    origin[i][k] = origin[i].get(k, Fraction(0)) - f * w
        basis.append(v)
        origin.append(o)
        pivots.append(p)
        members.append(row_id)
    r = len(basis)
    origin_f = np.zeros((r, r))
    for i, coeffs in enumerate(origin):
        for k, w in coeffs.items():
            origin_f[i, k] = float(w)
    fb = np.array([[float(a) for a in b] for b in basis]) if r else np.zeros((0, n))
    return Block(
        cols,
        fb,
        np.array(pivots, dtype=np.intp),
        origin_f,
        tuple(members),
        block.asked,
        block.asked_ids,
    )


def classify(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per entry: clearly 0, clearly 1, in doubt."""
    a = np.abs(values)
    b = np.abs(values - 1.0)
    zero = a < ZERO_TOL
    one = b < ZERO_TOL
    doubt = ~zero & ~one & ((a < DOUBT_TOL) | (b < DOUBT_TOL))
    return zero, one, doubt


def in_span(block: Block, xs: np.ndarray) -> np.ndarray:
    """For each 0/1 row of ``xs`` (over the block's columns): is it in the span?"""
    res = block.residual(xs.astype(float))
    a = np.abs(res)
    if np.any((a >= ZERO_TOL) & (a < DOUBT_TOL)):
        raise Doubt
    return np.all(a < ZERO_TOL, axis=-1)


def determined_regions(block: Block, *, changed_only: bool = True) -> list[np.ndarray]:
    """Determined regions of a block to check against k, as boolean masks over ``cols``.

    Exhaustive for small blocks: every minimal nonempty region whose indicator is in the
    span (every determined region is a disjoint union of minimal ones). For larger blocks:
    each basis row that is a 0/1 vector (single atoms included — an atom is determined
    iff some RREF row is its unit vector) and the whole block when it is determined.
    With ``changed_only``, a block whose span did not change since ``clean()`` yields
    nothing, and only basis rows changed since then are looked at in large blocks.
    """
    n = len(block.cols)
    if block.rank == 0:
        return []
    if changed_only and block.dirty is not None and not block.dirty.any():
        return []  # the span did not change: nothing new is determined
    if n <= EXHAUSTIVE_ATOMS:
        return _minimal_exhaustive(block)
    # a basis row no insertion changed was already a determined region before
    rows = np.nonzero(block.dirty_rows())[0] if changed_only else np.arange(block.rank)
    if len(rows):  # cheap first pass: a 0/1 row (even in doubt) lies within [0, 1]
        # (every row changed, as after most insertions: read the basis, not a copy)
        sub = block.basis if len(rows) == block.rank else block.basis[rows]
        inside = (sub.min(axis=1) > -DOUBT_TOL) & (sub.max(axis=1) < 1 + DOUBT_TOL)
        rows = rows[inside]
    zero, one, doubt = classify(block.basis[rows])
    ok = np.all(zero | one, axis=1)
    if np.any(np.all(zero | one | doubt, axis=1) & ~ok):
        raise Doubt
    out = [one[i].copy() for i in np.nonzero(ok)[0]]
    whole = np.ones(n, dtype=bool)
    if in_span(block, whole[None, :])[0]:
        out.append(whole)
    return out


def _minimal_exhaustive(block: Block) -> list[np.ndarray]:
    n = len(block.cols)
    idx = np.arange(1 << n, dtype=np.int64)
    bits = ((idx[:, None] >> np.arange(n)) & 1).astype(bool)
    member = in_span(block, bits)
    member[0] = False
    below = member.copy()  # below[s]: some nonempty subset of s is in the span
    for i in range(n):
        has = (idx >> i) & 1 == 1
        below[has] |= below[idx[has] ^ (1 << i)]
    proper = np.zeros_like(member)
    for i in range(n):
        has = (idx >> i) & 1 == 1
        proper[has] |= below[idx[has] ^ (1 << i)]
    return [bits[s] for s in np.nonzero(member & ~proper)[0]]


def coefficients(block: Block, region: np.ndarray) -> np.ndarray:
    """Coefficients over ``block.members`` expressing a determined region's indicator."""
    x = region.astype(float)[block.pivots]
    return x @ block.origin
