"""A quantile chosen among the buckets of a fine histogram by the exponential mechanism,
sampled exactly.

The candidates are the N buckets of a public grid (fixed by the declared bounds, never by
the data; thousands of them). The database returns the exact count of each non-empty
bucket; bucket j holds the values at sorted positions L_j … A_j − 1 and scores minus the
distance from the target position t = p·(n − 1) to its positions [L_j, A_j − 1], or,
when it is empty, to the middle L_j − ½ of the gap it lies in
(``mechanisms.quantile_utilities``, ``mechanisms.scored_positions``: 0 for the bucket
holding the target, and for an empty one in the gap whose middle is the target). Empty
buckets between two non-empty ones share one score, so the N candidates fall into at
most 2m + 1 *classes* (m non-empty buckets) of equal score, which is what makes
thousands of candidates cheap.

Each candidate's score becomes an integer *level* ℓ_j = min(⌈−u_j/Δ⌉, M) (Δ the
utilities' sensitivity, M a public cap), and bucket j is chosen with probability
∝ b^(−ℓ_j), for a rational b ≤ exp(ε/2). This is the exponential mechanism (McSherry &
Talwar 2007) with base b on the integer utility −ℓ: its output is distributed like
Tumult's interval mechanism (weight ∝ width × exp(−ε·gap/(2Δ))) on the grid's resolution.

Everything is exact: b is a rational lower bound of exp(ε/2) (a partial Taylor sum), so
every weight b^(M−ℓ) times a power of b's denominator is an integer, and the level is
drawn by ``secrets.randbelow`` over the integer total, the bucket within its level by a
second ``randbelow``. No floating point is involved, and the work is O(m + M) big-integer
operations whatever the draw.

Only the buckets near the target rank matter one by one: every bucket scored more than
(M − 1)·Δ ranks from the target is at the cap M, and every non-empty bucket that is, or
is next to an empty bucket that is, below the cap has [L, A] within W = (M − 1)·Δ + ½ of
it (``window_ranks``). So the database may return just the non-empty buckets whose
[L, A] meets [t − W, t + W] (a ``RankWindow``: at most 2·W + 2 of them, whatever the grid
and the rows), and ``choose_bucket_in_window`` gives every bucket the level
``choose_bucket`` gives it — the same mechanism, the same distribution — which is what
lets the grid be fine (one bucket per integer value) without bringing back one row per
non-empty bucket.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

from mechanisms.selection import scored_positions

#: b is a multiple of 2^-BASE_BITS: fine enough that 2·ln b is within 2^-30 of ε.
BASE_BITS = 32
#: The largest level cap M: the work is O(M) multiplications of O(M)-bit integers, and
#: M grows as 1/ε; past it (ε under about 0.01 for a median) the farthest candidates share
#: the last level, which only makes them likelier, never a privacy loss.
MAX_LEVELS = 8192
#: The levels cover ranks far enough that the mass past M is below 2^-TAIL_BITS of the
#: best candidate's (when M is not capped).
TAIL_BITS = 64


@dataclass(frozen=True)
class LevelRun:
    """A run of ``size`` consecutive buckets from ``start`` at the same ``level``."""

    start: int
    size: int
    level: int


@lru_cache(maxsize=256)
def exp_half_lower(epsilon: Fraction) -> Fraction:
    """A rational b with 1 ≤ b ≤ exp(ε/2), within 2^-BASE_BITS of it: a partial Taylor sum
    of exp (every term is positive, so each partial sum is below it), rounded down."""
    x = epsilon / 2
    total, term, k = Fraction(1), Fraction(1), 0
    while True:
        k += 1
        term = term * x / k
        total += term
        if term < Fraction(1, 1 << (BASE_BITS + 8)) and k > 2 * x:
            break
    return Fraction(math.floor(total * (1 << BASE_BITS)), 1 << BASE_BITS)


@lru_cache(maxsize=256)
def level_cap(epsilon: Fraction, buckets: int) -> int:
    """M, from public values only: enough levels that the candidates past the cap weigh
    at most 2^-TAIL_BITS of the best one together, at most ``MAX_LEVELS``."""
    b = exp_half_lower(epsilon)
    if b <= 1:
        return 1
    need = (math.log(buckets) + TAIL_BITS * math.log(2)) / math.log(float(b))
    return max(1, min(MAX_LEVELS, math.ceil(need)))


def level_runs(
    counts: Mapping[int, int], buckets: int, p: Fraction, sensitivity: Fraction, cap: int
) -> Iterator[LevelRun]:
    """The buckets 0 … buckets − 1 as runs of one level, in order: each non-empty bucket
    alone, each run of empty ones between them together (they share their score).
    ``counts`` maps a bucket to its exact number of values (absent: none).

    The level of a bucket holding positions L … A − 1 is min(⌈g/Δ⌉, cap) with
    g = max(lo − t, t − hi, 0) = −u the distance from t to its scored interval [lo, hi]
    (``mechanisms.scored_positions``, which gives it doubled: [L, A − 1], or the gap's
    middle L − ½ for an empty bucket; ``mechanisms.quantile_utilities``), computed in
    integers: with p = a/q and Δ = s/d, ⌈g/Δ⌉ = ⌈G·d/(2·q·s)⌉ for G = 2·q·g."""
    n = sum(c for c in counts.values() if c > 0)
    return _runs_from(counts, 0, n, 0, buckets, p, sensitivity, cap)


def _runs_from(
    counts: Mapping[int, int],
    below: int,
    n: int,
    start: int,
    end: int,
    p: Fraction,
    sensitivity: Fraction,
    cap: int,
) -> Iterator[LevelRun]:
    """The runs of buckets ``start`` … ``end`` − 1, of which ``counts`` are the non-empty
    ones, ``below`` values lying in the buckets before ``start``, n in all."""
    a, q = p.numerator, p.denominator
    qt2 = 2 * a * (n - 1)  # 2·q·t
    unit = 2 * q * sensitivity.numerator
    per = sensitivity.denominator

    def level(first: int, after: int) -> int:
        lo2, hi2 = scored_positions(first, after)  # 2·lo, 2·hi
        g = max(q * lo2 - qt2, qt2 - q * hi2, 0)  # 2·q·g
        return min(-(-g * per // unit), cap)

    position = start
    for j in sorted(counts):
        c = counts[j]
        if c <= 0:
            continue
        if j > position:
            yield LevelRun(position, j - position, level(below, below))
        yield LevelRun(j, 1, level(below, below + c))
        below += c
        position = j + 1
    if position < end:
        yield LevelRun(position, end - position, level(below, below))


def choose_bucket(
    counts: Mapping[int, int],
    buckets: int,
    p: Fraction,
    sensitivity: Fraction,
    epsilon: Fraction,
) -> int:
    """The index of one of ``buckets`` buckets for the p-quantile, by the exponential
    mechanism over integer levels (see the module doc).

    Guarantee: if one privacy unit can move every utility u_j by at most ``sensitivity``
    = Δ (add/remove one unit, the neighbouring relation of docs/design.md; for quantile
    utilities Δ = rows per unit × max(p, 1 − p), ``mechanisms.quantile_sensitivity``), the
    chosen index is ε-DP. Proof: ⌈−u/Δ⌉ moves by at most 1 when −u moves by at most Δ, and
    min(·, M) keeps that, so the levels have sensitivity 1; the exponential mechanism with
    weights b^(−ℓ) is then (2·ln b)-DP (McSherry & Talwar 2007, Thm. 6: each weight and the
    normaliser move by a factor at most b), and 2·ln b ≤ ε because b ≤ exp(ε/2)
    (``exp_half_lower``). The candidate set (the grid) is public. Being pure ε-DP it is
    also ε²/2-zCDP (Bun & Steinke 2016, Prop. 1.4).

    Exact: both draws are ``secrets.randbelow`` over exact integers.
    """
    _check(buckets, sensitivity, epsilon)
    cap = level_cap(epsilon, buckets)
    runs = list(level_runs(counts, buckets, p, sensitivity, cap))
    return _choose_from_runs(runs, epsilon, cap)


@dataclass(frozen=True)
class RankWindow:
    """What the database returns of one cell's fine histogram when it keeps only the
    buckets near the target rank (``gateway/sql/compile.py``): the number of values ``n``
    and, for each kept non-empty bucket, (bucket, count, values in the buckets before it).

    It must hold every non-empty bucket whose positions [below, below + count] meet
    [t − W, t + W] (t = p·(n − 1), W = ``window_ranks``); it may hold more."""

    n: int
    kept: tuple[tuple[int, int, int], ...]


def window_ranks(epsilon: Fraction, buckets: int, sensitivity: Fraction) -> Fraction:
    """W, public: every non-empty bucket whose [L, A] (its positions L … A − 1 and the
    position after them) lies more than W ranks from the target is at the level cap M,
    and so is every empty bucket next to one (``window_ranks_at_cap``)."""
    return window_ranks_at_cap(level_cap(epsilon, buckets), sensitivity)


def window_ranks_at_cap(cap: int, sensitivity: Fraction) -> Fraction:
    """W = (M − 1)·Δ + ½ for the level cap M = ``cap``.

    A level min(⌈g/Δ⌉, M) is below M iff g ≤ (M − 1)·Δ =: V. A non-empty bucket holding
    positions L … A − 1 is then within V of t: L ≤ t + V and A − 1 ≥ t − V, so [L, A]
    meets [t − V, t + V]. An empty bucket, scored at its gap's middle L − ½, is then
    there iff t − V + ½ ≤ L ≤ t + V + ½, and the non-empty buckets on either side of it
    (the one ending at position L − 1, whose A is L; the one starting at position L)
    have L in their [L', A'], so they meet [t − V, t + V + ½]. The extra half rank, on
    the upper side, is what scoring an empty bucket at its gap's middle adds (it lies
    half a rank nearer than the next value's position); W widens both sides by it,
    which keeps the window symmetric at the price of a bucket more at most below."""
    return (cap - 1) * sensitivity + Fraction(1, 2)


def window_level_runs(
    window: RankWindow, buckets: int, p: Fraction, sensitivity: Fraction, cap: int
) -> list[LevelRun]:
    """The level runs of ``level_runs`` over the full histogram, from a ``RankWindow``: the
    same level for every bucket (runs of the cap may be cut differently).

    The kept buckets are consecutive among the non-empty ones (the intervals [L, A] of
    the non-empty buckets, in bucket order, are consecutive and overlap at their ends,
    and one meets [t − W, t + W] iff it is between the first and the last that do). So
    the runs from the first kept bucket to the last are known exactly (each bucket, and
    the empty runs between two kept ones with the values below them); so is the empty
    run before the first kept bucket when nothing is below it, and after the last when
    nothing is above it. Every other bucket is at the cap (``window_ranks_at_cap``): a
    non-empty bucket not kept has [L, A] outside [t − W, t + W]; an empty run next to
    the known block lies next to a non-empty bucket that was not kept, and were it below
    the cap that bucket's [L, A] would meet the window."""
    n = window.n
    kept = sorted((j, c, below) for j, c, below in window.kept if c > 0)
    if not kept:
        if n > 0:  # some bucket holds the target's position: it meets the window
            raise ValueError("a rank window of a non-empty cell must hold a bucket")
        return list(level_runs({}, buckets, p, sensitivity, cap))
    counts = {j: c for j, c, _ in kept}
    first, last = kept[0], kept[-1]
    below = first[2]
    for _, c, at in kept:  # consecutive: each starts where the one before ends
        if at != below:
            raise ValueError("a rank window's buckets must be consecutive non-empty ones")
        below += c
    start = 0 if first[2] == 0 else first[0]
    end = buckets if last[2] + last[1] == n else last[0] + 1
    runs: list[LevelRun] = [LevelRun(0, start, cap)] if start > 0 else []
    for r in _runs_from(counts, first[2], n, start, end, p, sensitivity, cap):
        runs.append(r)
    if end < buckets:
        runs.append(LevelRun(end, buckets - end, cap))
    return runs


def choose_bucket_in_window(
    window: RankWindow,
    buckets: int,
    p: Fraction,
    sensitivity: Fraction,
    epsilon: Fraction,
) -> int:
    """``choose_bucket`` from the buckets near the target only: the same mechanism, with
    the same output distribution, for any ``RankWindow`` that holds what its doc says.

    Guarantee: ε-DP under add/remove one unit with utilities of sensitivity Δ, exactly as
    ``choose_bucket`` (its proof applies unchanged): every bucket gets the level it gets
    there (``window_level_runs``), and the draws are the same. What the window changes is
    the work: the database returns at most 2·W + 2 buckets per cell (each kept bucket but
    the first starts at a distinct position in [t − W, t + W]) instead of one per
    non-empty bucket, and the draw is O(kept + M) big-integer operations. (W is half a
    rank wider than (M − 1)·Δ: ``window_ranks_at_cap`` says why.)
    """
    _check(buckets, sensitivity, epsilon)
    cap = level_cap(epsilon, buckets)
    runs = window_level_runs(window, buckets, p, sensitivity, cap)
    return _choose_from_runs(runs, epsilon, cap)


def _check(buckets: int, sensitivity: Fraction, epsilon: Fraction) -> None:
    if buckets < 1:
        raise ValueError("choose_bucket needs at least one bucket")
    if epsilon <= 0 or sensitivity <= 0:
        raise ValueError("choose_bucket needs epsilon > 0 and sensitivity > 0")


def _choose_from_runs(runs: list[LevelRun], epsilon: Fraction, cap: int) -> int:
    """One bucket, with probability ∝ b^(−level): the level first (weights S_ℓ·b^(−ℓ)),
    then the bucket uniformly among that level's."""
    b = exp_half_lower(epsilon)
    sizes: dict[int, int] = {}
    for r in runs:
        sizes[r.level] = sizes.get(r.level, 0) + r.size
    # weight of level ℓ ∝ S_ℓ · b^(cap − ℓ) = S_ℓ · B^(cap − ℓ) · D^ℓ / D^cap, b = B/D
    levels = sorted(sizes)
    weights = _level_weights(levels, sizes, b.numerator, b.denominator, cap)
    pick = secrets.randbelow(sum(weights))
    chosen = levels[-1]
    for level, w in zip(levels, weights, strict=True):
        if pick < w:
            chosen = level
            break
        pick -= w
    offset = secrets.randbelow(sizes[chosen])
    for r in runs:
        if r.level != chosen:
            continue
        if offset < r.size:
            return r.start + offset
        offset -= r.size
    raise AssertionError("unreachable: the offset lies in one of the level's runs")


def _level_weights(
    levels: list[int], sizes: Mapping[int, int], big: int, den: int, cap: int
) -> list[int]:
    """S_ℓ · B^(cap − ℓ) · D^ℓ for each level ℓ in ``levels`` (ascending), as integers:
    the powers are carried from one level to the next by small divisions and
    multiplications (D is a power of two: a shift)."""
    out: list[int] = []
    power_b = _power(big, cap)  # B^(cap − ℓ) at ℓ = 0
    level = 0
    shift = den.bit_length() - 1
    for target in levels:
        if target > level:
            power_b //= _power(big, target - level)  # exact: B^(cap − level) ÷ B^(step)
            level = target
        out.append((sizes[target] * power_b) << (shift * level))
    return out


@lru_cache(maxsize=64)
def _power(base: int, exponent: int) -> int:
    return base**exponent


def fine_rank_halfwidth(epsilon: Fraction, sensitivity: Fraction, buckets: int) -> int | None:
    """r such that, with probability ≥ 95%, the chosen bucket holds a value whose rank is
    within r of the target rank, or is empty and lies between two values whose ranks are
    within r of it — whatever the data (public values only); ``None`` when the level cap
    leaves no such guarantee (tiny ε).

    Relative to the best candidate, all candidates at least L levels above it weigh at
    most buckets·b^(−L) together, so that happens with probability ≤ 5% for
    L = ⌈ln(20·buckets)/ln b⌉. The best bucket is at most at level ℓ₀ = ⌈½/Δ⌉: t lies
    within ½ of some position (n ≥ 1), and the bucket holding it scores g ≤ ½. A bucket
    at level ℓ scores g ≤ ℓ·Δ: a non-empty one holds a value within ℓ·Δ ranks of the
    target; an empty one lies between positions L − 1 and L whose middle is within ℓ·Δ,
    so both are within ℓ·Δ + ½ (``mechanisms.scored_positions``). Hence
    r = ⌈(ℓ₀ + L)·Δ + ½⌉ (for a median with one row per unit, Δ = ½, the same as the
    ⌈(⌈1/Δ⌉ + L)·Δ⌉ of the score before issue 34's third pass)."""
    b = float(exp_half_lower(epsilon))
    if b <= 1:
        return None
    level = math.ceil(math.log(20 * buckets) / math.log(b)) + math.ceil(
        Fraction(1, 2) / sensitivity
    )
    if level > level_cap(epsilon, buckets):
        return None
    return math.ceil(level * sensitivity + Fraction(1, 2))
