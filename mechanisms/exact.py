"""Rigorous integer bounds on exp(−x) and exact comparisons of a lazy uniform against them.

Everything the samplers decide is a comparison "U < c" between a uniform U ∈ [0, 1) and an
irrational constant c (a power of exp(−1/scale), or a rejection probability). U is never
materialised as a float: it is an integer prefix of its binary expansion drawn from the
operating system's CSPRNG (``secrets``), and c is known through integer bounds
``lo ≤ c·2^p ≤ hi``. When the prefix is on one side of both bounds the comparison is decided
exactly; otherwise more bits of U are drawn and c is bounded at a higher precision. This is
the standard lazy-comparison argument (Knuth & Yao 1976): the result is exactly
Bernoulli(c), with no floating point anywhere in the decision.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from fractions import Fraction
from functools import lru_cache

# exp(−x) < 2^−(p+2) for x above this multiple of p (ln 2 ≈ 0.6931 < 0.7).
_LN2_UPPER = Fraction(7, 10)

Bounds = Callable[[int], tuple[int, int]]


def _exp_neg_unit_bounds(y: Fraction, w: int) -> tuple[int, int]:
    """Bounds lo ≤ 2^w·exp(−y) ≤ hi for rational 0 ≤ y ≤ 1 (alternating Taylor series).

    For 0 ≤ y ≤ 1 the terms y^k/k! decrease, so partial sums ending on an odd term are
    below exp(−y) and those ending on an even term are above it. Each term is bounded in
    fixed point with floor/ceil, and the signs are chosen so the bounds stay on their side.
    """
    one = 1 << w
    y_lo = (y.numerator << w) // y.denominator
    y_hi = -((-(y.numerator << w)) // y.denominator)
    t_lo, t_hi = one, one  # bounds on 2^w · y^k / k!, k = 0
    s_lo, s_hi = one, one  # running bounds on the partial sum S_k
    k = 0
    lower: int | None = None
    upper: int | None = None
    while True:
        k += 1
        t_lo = (t_lo * y_lo) // (k << w)
        t_hi = -((-(t_hi * y_hi)) // (k << w))
        if k % 2:  # subtracting an odd term
            s_lo -= t_hi
            s_hi -= t_lo
            lower = s_lo  # S_k with k odd is a lower bound
        else:
            s_lo += t_lo
            s_hi += t_hi
            upper = s_hi  # S_k with k even is an upper bound
        if t_hi <= 1 and lower is not None and upper is not None and k >= 2:
            # One more term of each parity would move the sum by at most 1 unit.
            return max(lower, 0), min(upper + 1, one)


def exp_neg_bounds(x: Fraction, p: int) -> tuple[int, int]:
    """Integers lo ≤ 2^p·exp(−x) ≤ hi for rational x ≥ 0, with hi − lo small (a few units).

    exp(−x) = exp(−x/n)^n with n = ⌈x⌉, so the series is only used on [0, 1]; powers are
    taken with floor (lower bound) and ceiling (upper bound) at a working precision with
    enough guard bits that the final bounds are within a few units of each other.
    """
    if x < 0:
        raise ValueError("exp_neg_bounds needs x >= 0")
    one = 1 << p
    if x == 0:
        return one, one
    if x > _LN2_UPPER * (p + 2) + 2:
        return 0, 1
    n = max(1, -((-x.numerator) // x.denominator))
    w = p + 32 + 2 * n.bit_length() + n.bit_length()
    lo, hi = _exp_neg_unit_bounds(x / n, w)
    r_lo, r_hi = 1 << w, 1 << w
    b_lo, b_hi = lo, hi
    e = n
    while e:
        if e & 1:
            r_lo = (r_lo * b_lo) >> w
            r_hi = -((-(r_hi * b_hi)) >> w)
        e >>= 1
        if e:
            b_lo = (b_lo * b_lo) >> w
            b_hi = -((-(b_hi * b_hi)) >> w)
    shift = w - p
    return r_lo >> shift, -((-r_hi) >> shift)


@lru_cache(maxsize=4096)
def exp_neg_bounds_cached(x: Fraction, p: int) -> tuple[int, int]:
    """``exp_neg_bounds`` memoised (table builders ask for the same constants repeatedly)."""
    return exp_neg_bounds(x, p)


class LazyUniform:
    """A uniform U ∈ [0, 1) of which only a binary prefix has been drawn so far.

    ``value / 2^bits ≤ U < (value + 1) / 2^bits``. Further bits come from ``secrets`` only
    when a comparison cannot be decided from the prefix, so several comparisons against the
    same U (an inverse-CDF walk) stay consistent.
    """

    __slots__ = ("bits", "value")

    def __init__(self, value: int | None = None, bits: int = 64) -> None:
        self.value = secrets.randbits(bits) if value is None else value
        self.bits = bits

    def less_than(self, bounds: Bounds) -> bool:
        """Decide U < c exactly, where ``bounds(p)`` returns lo ≤ c·2^p ≤ hi."""
        while True:
            lo, hi = bounds(self.bits)
            if self.value + 1 <= lo:
                return True
            if self.value >= hi:
                return False
            self.value = (self.value << 64) | secrets.randbits(64)
            self.bits += 64


def bernoulli_exp_neg(gamma: Fraction, u: LazyUniform | None = None) -> bool:
    """One exact draw of Bernoulli(exp(−γ)) for rational γ ≥ 0."""
    uniform = LazyUniform() if u is None else u
    return uniform.less_than(lambda p: exp_neg_bounds_cached(gamma, p))


def ratio_bounds(inner: Bounds) -> Bounds:
    """Bounds on r/(1 + r) from bounds on r (the map is increasing, so ends map to ends)."""

    def bounds(p: int) -> tuple[int, int]:
        q = p + 8
        r_lo, r_hi = inner(q)
        one = 1 << q
        lo = (r_lo << p) // (one + r_lo)
        hi = -((-(r_hi << p)) // (one + r_hi))
        return lo, hi

    return bounds
