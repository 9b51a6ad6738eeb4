"""A quantile chosen among the buckets of a fine histogram by the exponential mechanism,
sampled exactly.

The candidates are the N buckets of a public grid (fixed by the declared bounds, never by
the data; thousands of them). The database returns the exact count of each non-empty
bucket; bucket j holds the values at sorted positions L_j … A_j − 1 and scores
u_j = −max(L_j − t, t − (A_j − 1), 0) for the target position t = p·(n − 1)
(``mechanisms.quantile_utilities``: 0 for the bucket holding the target, minus its
distance in ranks otherwise). Empty buckets between two non-empty ones share one score,
so the N candidates fall into at most 2m + 1 *classes* (m non-empty buckets) of equal
score, which is what makes thousands of candidates cheap.

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
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

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
    g = max(L − t, t − (A − 1), 0) = −u (``mechanisms.quantile_utilities``), computed in
    integers: with p = a/q and Δ = s/d, ⌈g/Δ⌉ = ⌈G·d/(q·s)⌉ for G = q·g."""
    n = sum(c for c in counts.values() if c > 0)
    a, q = p.numerator, p.denominator
    qt = a * (n - 1)  # q·t
    unit = q * sensitivity.numerator
    per = sensitivity.denominator

    def level(first: int, after: int) -> int:
        g = max(q * first - qt, qt - q * (after - 1), 0)
        return min(-(-g * per // unit), cap)

    below = 0  # values in the buckets before the current one
    position = 0
    for j in sorted(counts):
        c = counts[j]
        if c <= 0:
            continue
        if j > position:
            yield LevelRun(position, j - position, level(below, below))
        yield LevelRun(j, 1, level(below, below + c))
        below += c
        position = j + 1
    if position < buckets:
        yield LevelRun(position, buckets - position, level(below, below))


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
    if buckets < 1:
        raise ValueError("choose_bucket needs at least one bucket")
    if epsilon <= 0 or sensitivity <= 0:
        raise ValueError("choose_bucket needs epsilon > 0 and sensitivity > 0")
    cap = level_cap(epsilon, buckets)
    b = exp_half_lower(epsilon)
    runs = list(level_runs(counts, buckets, p, sensitivity, cap))
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
    within r of the target rank — whatever the data (public values only); ``None`` when
    the level cap leaves no such guarantee (tiny ε).

    Relative to a level-0 candidate, all candidates at level ≥ L weigh at most
    buckets·b^(−L) together, so P(level ≥ L) ≤ 5% for L = ⌈ln(20·buckets)/ln b⌉, and a
    level-ℓ bucket holds a value within ℓ·Δ ranks of the target. The
    best bucket (some bucket holds a position within 1 of the target) is at most at level
    ℓ₀ = ⌈1/Δ⌉, so P(level ≥ ℓ₀ + L) ≤ 5% too."""
    b = float(exp_half_lower(epsilon))
    if b <= 1:
        return None
    level = math.ceil(math.log(20 * buckets) / math.log(b)) + math.ceil(1 / float(sensitivity))
    if level > level_cap(epsilon, buckets):
        return None
    return math.ceil(level * float(sensitivity))
