"""Exact, vectorised samplers for the discrete Laplace and discrete Gaussian distributions.

Randomness comes only from ``os.urandom`` (the CSPRNG ``secrets`` uses); every decision is
an exact comparison of a uniform with an irrational constant known through rigorous integer
bounds (``mechanisms.exact``). numpy is used as a fast integer array library: table
look-ups and comparisons of 64-bit uniform prefixes with 64-bit bounds. A prefix that falls
between the bounds of a constant (probability ≈ 2^−62 per comparison) is resolved exactly
by drawing more bits (``LazyUniform``). No random decision is made in floating point, with
one documented exception of the *fast path* of the discrete Gaussian's rejection step,
which is only taken when a rigorous error bound proves the float decision equals the exact
one (see ``DiscreteGaussian``).

Geometric sampling. G ≥ 0 with P(G ≥ k) = q^k, q = exp(−γ), γ rational.

- Inverse CDF: for U uniform, G = #{k ≥ 1 : U < q^k}. A table of 64-bit bounds on
  2^64·q^k, k = 1..K, decides G from a 64-bit prefix of U with one ``searchsorted``. If
  U < q^K then, by memorylessness, G = K + G' with G' a fresh geometric.
- Binary decomposition (large scales): the binary digits of G below 2^m are independent
  Bernoulli(q^(2^j) / (1 + q^(2^j))) and G >> m is geometric with ratio q^(2^m). So a
  geometric of any scale costs m = O(log scale) vectorised comparisons plus one table
  look-up.

Discrete Laplace (scale t): |X| = G with γ = 1/t, a uniform sign, and (−, 0) rejected, so
P(X = x) ∝ exp(−|x|/t) (Canonne, Kamath & Steinke 2020, Algorithm 2 uses the same
sign/magnitude construction).

Discrete Gaussian (σ²): CKS 2020, Algorithm 3: propose Y ~ DLap(t = ⌊σ⌋ + 1), accept with
probability exp(−(|Y| − σ²/t)² / (2σ²)).
"""

from __future__ import annotations

import math
import os
from fractions import Fraction

import numpy as np
import numpy.typing as npt

from mechanisms.exact import (
    Bounds,
    LazyUniform,
    exp_neg_bounds,
    exp_neg_bounds_cached,
    ratio_bounds,
)

IntArray = npt.NDArray[np.int64]
U64Array = npt.NDArray[np.uint64]

# Table mode is used when the ratio's exponent γ is at least this (scale ≤ 16).
_TABLE_MIN_GAMMA = Fraction(1, 16)
# The table stops at K with q^K ≤ 2^−_TABLE_TAIL_BITS; rarer draws recurse (memorylessness).
_TABLE_TAIL_BITS = 24
# Largest supported scale; keeps every sample far inside int64.
MAX_SCALE = Fraction(2**40)


def uniform_u64(n: int) -> U64Array:
    """n independent uniform 64-bit integers from the operating system's CSPRNG."""
    return np.frombuffer(os.urandom(8 * n), dtype=np.uint64)


def _u64_bounds(bounds: Bounds) -> tuple[int, int]:
    """64-bit bounds, clipped to what a uint64 can hold."""
    lo, hi = bounds(64)
    top = (1 << 64) - 1
    return min(lo, top), min(hi, top)


#: Guard bits of ``power_table_u64``'s products: each of K ≤ 2^9 multiplications widens
#: the bounds by at most one unit of 2^−(64 + guard), so the table is as tight as bounding
#: every power on its own (within a unit at 64 bits).
_POWER_GUARD_BITS = 64


def power_table_u64(
    gamma: Fraction, k_max: int, guard: int = _POWER_GUARD_BITS
) -> tuple[list[int], list[int]]:
    """Integer bounds lo_k ≤ 2^64·exp(−γk) ≤ hi_k for k = 1 … ``k_max`` (clipped to a
    uint64), from one rigorous bound of exp(−γ) raised by repeated multiplication.

    Rigour: with w = 64 + ``guard`` bits, L_1 ≤ 2^w·q ≤ H_1 (``exp_neg_bounds``), and
    L_k = ⌊L_{k−1}·L_1 / 2^w⌋, H_k = ⌈H_{k−1}·H_1 / 2^w⌉; all terms are positive, so by
    induction L_k ≤ 2^w·q^k ≤ H_k; the shift to 64 bits floors the lower bound and ceils
    the upper one. Bounding every power separately (an alternating series each) cost
    ~35 µs a power, 5–8 ms for a scale's table; this is one series and K products."""
    w = 64 + guard
    shift = guard
    q_lo, q_hi = exp_neg_bounds(gamma, w)
    top = (1 << 64) - 1
    lo_list: list[int] = []
    hi_list: list[int] = []
    p_lo, p_hi = 1 << w, 1 << w
    for _ in range(k_max):
        p_lo = (p_lo * q_lo) >> w
        p_hi = -((-(p_hi * q_hi)) >> w)
        lo_list.append(min(p_lo >> shift, top))
        hi_list.append(min(-((-p_hi) >> shift), top))
    return lo_list, hi_list


class Geometric:
    """Exact sampler of G ∈ {0, 1, …} with P(G ≥ k) = exp(−γk), γ > 0 rational."""

    def __init__(self, gamma: Fraction) -> None:
        if gamma <= 0:
            raise ValueError("geometric ratio exponent must be > 0")
        self.gamma = gamma
        m = 0
        while gamma * (1 << m) < _TABLE_MIN_GAMMA:
            m += 1
        self.low_bits = m
        self.top_gamma = gamma * (1 << m)
        # Low bits: Bernoulli(r/(1+r)), r = exp(−γ 2^j).
        self._bit_bounds: list[Bounds] = [
            ratio_bounds(self._power_bounds(gamma * (1 << j))) for j in range(m)
        ]
        self._bit_lo: list[int] = []
        self._bit_hi: list[int] = []
        for b in self._bit_bounds:
            lo, hi = _u64_bounds(b)
            self._bit_lo.append(lo)
            self._bit_hi.append(hi)
        # Top part: a table of bounds on 2^64 · exp(−γ' k), k = 1..K.
        k_max = math.ceil(_TABLE_TAIL_BITS * 0.6932 / float(self.top_gamma)) + 1
        self.table_size = k_max
        lo_list, hi_list = power_table_u64(self.top_gamma, k_max)
        # searchsorted needs ascending arrays: store k = K..1.
        self._lo_rev = np.array(lo_list[::-1], dtype=np.uint64)
        self._hi_rev = np.array(hi_list[::-1], dtype=np.uint64)

    @staticmethod
    def _power_bounds(x: Fraction) -> Bounds:
        return lambda p: exp_neg_bounds_cached(x, p)

    def _top(self, n: int) -> IntArray:
        """n draws of the geometric with exponent γ' = γ·2^m, by table inverse CDF."""
        k_max = self.table_size
        out = np.zeros(n, dtype=np.int64)
        pending = np.arange(n)
        while pending.size:
            u = uniform_u64(pending.size)
            g_lo = k_max - np.searchsorted(self._lo_rev, u, side="right")
            g_hi = k_max - np.searchsorted(self._hi_rev, u, side="right")
            g = g_lo.astype(np.int64)
            for i in np.nonzero(g_lo != g_hi)[0]:
                g[i] = self._top_exact(int(u[i]), int(g_lo[i]), int(g_hi[i]))
            out[pending] += g
            # U < q^K: G = K + a fresh geometric (memorylessness).
            pending = pending[g >= k_max]
        return out

    def _top_exact(self, prefix: int, g_lo: int, g_hi: int) -> int:
        """Resolve a prefix that lies between the table's bounds, drawing more bits."""
        u = LazyUniform(prefix, 64)
        g = g_lo
        for k in range(g_lo + 1, g_hi + 1):
            if not u.less_than(self._power_bounds(self.top_gamma * k)):
                break
            g = k
        return g

    def sample(self, n: int) -> IntArray:
        """n independent exact draws."""
        g = self._top(n) << self.low_bits
        for j in range(self.low_bits):
            u = uniform_u64(n)
            lo, hi = self._bit_lo[j], self._bit_hi[j]
            bit = (u < np.uint64(lo)).astype(np.int64)
            for i in np.nonzero((u >= np.uint64(lo)) & (u < np.uint64(hi)))[0]:
                bit[i] = int(LazyUniform(int(u[i]), 64).less_than(self._bit_bounds[j]))
            g += bit << j
        return g


class DiscreteLaplace:
    """Exact sampler of P(X = x) ∝ exp(−|x| / scale) on the integers, rational scale > 0."""

    def __init__(self, scale: Fraction) -> None:
        if not 0 < scale <= MAX_SCALE:
            raise ValueError(f"discrete Laplace scale must be in (0, 2^40], got {scale}")
        self.scale = scale
        self._magnitude = Geometric(1 / scale)
        # P(reject) = P(sign −, G = 0) = (1 − q)/2 ≤ 1/2, q = exp(−1/scale).
        q = math.exp(-1 / float(scale))
        self._accept_rate = 1 - (1 - q) / 2

    def sample(self, n: int) -> IntArray:
        """n independent exact draws."""
        parts: list[IntArray] = []
        need = n
        while need > 0:
            batch = int(need / self._accept_rate * 1.05) + 16
            g = self._magnitude.sample(batch)
            negative = (np.frombuffer(os.urandom(batch), dtype=np.uint8) & 1).astype(bool)
            keep = ~(negative & (g == 0))
            x = np.where(negative, -g, g)[keep]
            parts.append(x[:need])
            need -= min(need, x.size)
        return np.concatenate(parts) if len(parts) > 1 else parts[0]


# The float fast path of the Gaussian rejection step decides only when the float
# acceptance probability is farther than this from the uniform (see DiscreteGaussian).
_FLOAT_MARGIN = 2.0**-30
_FLOAT_SAFE_Y = 2**50


class DiscreteGaussian:
    """Exact sampler of P(X = x) ∝ exp(−x² / (2σ²)) on the integers, rational σ² > 0.

    CKS 2020, Algorithm 3, vectorised. The rejection step accepts Y with probability
    a(Y) = exp(−γ(Y)), γ(Y) = (|Y| − σ²/t)² / (2σ²). Deciding U < a(Y) for all proposals
    with rational arithmetic would be slow in Python, so a float fast path decides when it
    provably agrees with the exact comparison and hands everything else to the exact path:

    - u is the 64-bit prefix of U, so |u·2^−64 − U| < 2^−64, and converting u to float64
      adds ≤ 2^−53. The float γ̂ is computed from |Y| < 2^50 (exact in float64) and
      σ²/t, 2σ² rounded once each, with three further roundings: |γ̂ − γ| ≤ 2^−50·(γ + C)
      with C = (|Y| + σ²/t)²/σ² — and a(Y)·|γ̂ − γ| is tiny because e^−γ·γ ≤ 1 and the
      proposals that matter have C ≪ 2^10 (for |Y| ≫ σ, a(Y) underflows to 0 on both
      sides). numpy's float64 exp is accurate to a few ulps. All together the float error
      |â − a(Y)| is below 2^−40.
    - The fast path decides only when |u·2^−64 − â| > 2^−30 (1,000× the error bound); the
      remaining proposals (probability ≈ 2^−29 each), and any |Y| ≥ 2^50, are decided
      exactly by ``accept_exact`` (LazyUniform against rigorous bounds of exp(−γ), γ
      rational). The forced-exact test in tests/statistical runs a whole sample this way.
    """

    def __init__(self, sigma2: Fraction) -> None:
        if not 0 < sigma2 <= MAX_SCALE**2:
            raise ValueError(f"discrete Gaussian sigma² must be in (0, 2^80], got {sigma2}")
        self.sigma2 = sigma2
        sigma_floor = math.isqrt(sigma2.numerator // sigma2.denominator)
        self.t = sigma_floor + 1
        self._proposal = DiscreteLaplace(Fraction(self.t))
        self._shift = sigma2 / self.t  # σ²/t, exact
        self._shift_f = float(self._shift)
        self._two_sigma2_f = float(2 * sigma2)
        self._accept_rate = 0.5  # conservative starting guess, refined from draws

    def accept_exact(self, y: int, u: LazyUniform) -> bool:
        """The rejection step decided exactly: U < exp(−(|y| − σ²/t)²/(2σ²))."""
        d = abs(y) - self._shift
        gamma = d * d / (2 * self.sigma2)
        return u.less_than(lambda p: exp_neg_bounds_cached(gamma, p))

    def sample(self, n: int) -> IntArray:
        """n independent exact draws."""
        parts: list[IntArray] = []
        need = n
        while need > 0:
            batch = int(need / self._accept_rate * 1.1) + 16
            y = self._proposal.sample(batch)
            u = uniform_u64(batch)
            d = np.abs(y).astype(np.float64) - self._shift_f
            a_hat = np.exp(-(d * d) / self._two_sigma2_f)
            u_f = u.astype(np.float64) * 2.0**-64
            accept = u_f < a_hat
            unsure = (np.abs(u_f - a_hat) <= _FLOAT_MARGIN) | (np.abs(y) >= _FLOAT_SAFE_Y)
            for i in np.nonzero(unsure)[0]:
                accept[i] = self.accept_exact(int(y[i]), LazyUniform(int(u[i]), 64))
            x = y[accept]
            if x.size:
                self._accept_rate = max(
                    0.05, min(1.0, 0.5 * self._accept_rate + 0.5 * x.size / batch)
                )
            parts.append(x[:need])
            need -= min(need, x.size)
        return np.concatenate(parts) if len(parts) > 1 else parts[0]
