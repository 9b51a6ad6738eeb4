"""Accuracy of released values, computed from the exact noise distributions.

Accuracy is a function of the noise spec only (never of the data), so publishing it costs
no privacy: it is post-processing of public parameters.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from mechanisms.types import Accuracy, Noise

# Above this σ, discrete-Gaussian sums are replaced by closed forms (see _gaussian_*).
_GAUSSIAN_DIRECT_MAX_SIGMA = 2e5
# The PMF beyond 14σ weighs less than exp(−98) and is left out of the direct sums.
_GAUSSIAN_TAIL_SIGMAS = 14


def _normal_quantile_two_sided(coverage: float) -> float:
    """z with P(|N(0,1)| ≤ z) = coverage, by bisection on erfc (no scipy at run time)."""
    lo, hi = 0.0, 40.0
    tail = 1 - coverage
    for _ in range(200):
        mid = (lo + hi) / 2
        if math.erfc(mid / math.sqrt(2)) > tail:
            lo = mid
        else:
            hi = mid
    return hi


def _laplace_stddev(scale: float) -> float:
    # Var = 2q/(1−q)², q = exp(−1/t); expm1 keeps 1 − q accurate for large t.
    one_minus_q = -math.expm1(-1 / scale)
    q = 1 - one_minus_q
    return math.sqrt(2 * q) / one_minus_q


def _laplace_halfwidth(scale: float, coverage: float) -> int:
    """Smallest integer h with P(|X| ≤ h) ≥ coverage; P(|X| > h) = 2q^(h+1)/(1+q)."""
    log_q = -1 / scale
    q = math.exp(log_q)
    tail = 1 - coverage

    def outside(h: int) -> float:
        return 2 * math.exp((h + 1) * log_q) / (1 + q)

    h = max(0, math.ceil(math.log(tail * (1 + q) / 2) / log_q) - 1)
    while h > 0 and outside(h - 1) <= tail:
        h -= 1
    while outside(h) > tail:
        h += 1
    return h


def _gaussian_table(sigma2: float) -> tuple[np.ndarray, float]:
    """P(|X| ≤ h) for h = 0..H and the variance, by direct summation of the PMF."""
    sigma = math.sqrt(sigma2)
    top = math.ceil(_GAUSSIAN_TAIL_SIGMAS * sigma) + 2
    x = np.arange(0, top + 1, dtype=np.float64)
    w = np.exp(-(x * x) / (2 * sigma2))
    z = w[0] + 2 * math.fsum(w[1:])
    variance = 2 * math.fsum(x[1:] * x[1:] * w[1:]) / z
    inside = (w[0] + 2 * np.concatenate(([0.0], np.cumsum(w[1:])))) / z
    return inside, variance


def _gaussian_stddev_halfwidth(sigma2: float, coverage: float) -> tuple[float, int]:
    sigma = math.sqrt(sigma2)
    if sigma <= _GAUSSIAN_DIRECT_MAX_SIGMA:
        inside, variance = _gaussian_table(sigma2)
        h = int(np.searchsorted(inside, coverage, side="left"))
        return math.sqrt(variance), h
    # Poisson summation: the normaliser and second moment of the discrete Gaussian equal the
    # continuous ones up to a relative exp(−2π²σ²) (CKS 2020, Fact 18), i.e. exactly in
    # double precision here; the tail P(X ≥ k) is the midpoint-rule value Φ̄((k − ½)/σ) up to
    # a relative O(1/σ²) < 1e-10, far below the step of P(|X| ≤ h) in h.
    z = _normal_quantile_two_sided(coverage)
    return sigma, max(0, math.ceil(z * sigma - 0.5))


@lru_cache(maxsize=1024)
def halfwidth(noise: Noise, coverage: float) -> int:
    """Smallest integer h with P(|noise| ≤ h) ≥ coverage, from the exact PMF.

    Guarantee: a released v + X lies within h of v with probability ≥ ``coverage`` (closed
    form for the discrete Laplace, PMF summation for the discrete Gaussian; CKS 2020,
    Sec. 2). A function of public noise parameters only, so free under add/remove-one-unit
    DP.
    """
    if not 0 < coverage < 1:
        raise ValueError("coverage must be in (0, 1)")
    if noise.mechanism == "laplace":
        return _laplace_halfwidth(float(noise.scale), coverage)
    if noise.mechanism == "gaussian":
        return _gaussian_stddev_halfwidth(_sigma2(noise), coverage)[1]
    raise ValueError(f"unknown mechanism {noise.mechanism!r}")


def _sigma2(noise: Noise) -> float:
    return float(noise.sigma2 if noise.sigma2 is not None else noise.scale * noise.scale)


@lru_cache(maxsize=1024)
def accuracy(noise: Noise) -> Accuracy:
    """Exact standard deviation and 95% half-width of one noise distribution.

    Guarantee: for any true value v, the released v + X satisfies P(|X| ≤ ci95_halfwidth)
    ≥ 0.95, and ci95_halfwidth is the smallest integer with that property; stddev is
    √E[X²]. Both are computed from the discrete PMF (closed forms for the discrete Laplace,
    q = exp(−1/t): Var = 2q/(1−q)², P(|X| > h) = 2q^(h+1)/(1+q); summation of the PMF, or
    Poisson summation for σ > 2·10⁵, for the discrete Gaussian — CKS 2020, Sec. 2). The
    data is not involved, so this is free post-processing under add/remove-one-unit DP.
    """
    if noise.mechanism == "laplace":
        t = float(noise.scale)
        return Accuracy(_laplace_stddev(t), float(_laplace_halfwidth(t, 0.95)))
    if noise.mechanism == "gaussian":
        sd, h = _gaussian_stddev_halfwidth(_sigma2(noise), 0.95)
        return Accuracy(sd, float(h))
    raise ValueError(f"unknown mechanism {noise.mechanism!r}")


def ratio_interval(num: int, num_noise: Noise, den: int, den_noise: Noise) -> tuple[float, float]:
    """A ≥95% confidence interval for true_sum/true_count given noisy ``num`` and ``den``.

    Method: the true sum is in [num − h₁, num + h₁] and the true count in
    [den − h₂, den + h₂] with h₁, h₂ the exact 97.5% half-widths of the two noises; by the
    union bound both hold with probability ≥ 95%, and then the ratio lies between the
    extreme ratios over that box, where the count is also at least 1 (an average of no rows
    is not released). If the count box has no value ≥ 1 the interval is (−inf, inf).
    Units are those of ``num``/``den`` (multiply by the grid resolution for real columns).
    Post-processing of released values: no privacy cost under add/remove-one-unit DP
    (post-processing theorem, Dwork & Roth 2014, Prop. 2.1).
    """
    h1 = halfwidth(num_noise, 0.975)
    h2 = halfwidth(den_noise, 0.975)
    c_lo, c_hi = max(den - h2, 1), den + h2
    if c_hi < 1:
        return (-math.inf, math.inf)
    s_lo, s_hi = num - h1, num + h1
    lo = min(s_lo / c_lo, s_lo / c_hi)
    hi = max(s_hi / c_lo, s_hi / c_hi)
    return (lo, hi)


# -- sums of independent noises (nested aggregation) ---------------------------------------

# The Chernoff bound's λ is searched on this many points of a golden-section search.
_CHERNOFF_STEPS = 200
# The exact distribution of a sum is computed (by FFT) when its support, truncated as
# below, has at most this many points (about 0.1 s); wider sums use the bounds only.
_SUM_EXACT_MAX_POINTS = 1 << 20
# One discrete Laplace draw is truncated to |x| ≤ 40·t: the mass left out,
# 2q^(T+1)/(1+q) < 2e^-40 < 1e-17, is counted against the coverage.
_LAPLACE_TAIL_SCALES = 40
# Allowance for floating-point error in the FFT (its absolute error is ~1e-15 here).
_FFT_SLACK = 1e-9


@lru_cache(maxsize=4096)
def sum_accuracy(noise: Noise, k: int) -> Accuracy:
    """Standard deviation and a 95% half-width for the sum of ``k`` independent draws of
    ``noise`` (a SUM, over released rows, of k values each noised once).

    Guarantee: stddev is exact (variances of independent noises add: √k·σ₁). The half-width
    h satisfies P(|X₁+…+X_k| ≤ h) ≥ 0.95. For k = 1 it is the exact one of ``accuracy``;
    for k > 1 it is the smallest of the valid bounds available:
    - the exact distribution of the sum, from the PMF truncated where the mass left out
      is below 1e-17 per draw, convolved k times by FFT; the mass left out and a margin
      for floating-point error are charged against the 95% (when the support is small
      enough to compute);
    - the union bound: each |Xᵢ| within its 1 − 0.05/k half-width, so the sum within k
      times that;
    - a Chernoff bound: the discrete Gaussian is σ-subgaussian, E[e^{λX}] ≤ e^{λ²σ²/2}
      (Canonne, Kamath, Steinke 2020, Cor. 9), so h = σ·√(2k·ln 40); the discrete Laplace
      with q = e^{−1/t} has E[e^{λX}] = (1−q)²/((1−qe^λ)(1−qe^{−λ})) for |λ| < 1/t, and
      P(|S| ≥ h) ≤ 2·min_λ e^{−λh}·E[e^{λX}]^k.
    Never narrower than the exact 95% half-width. A function of public noise parameters
    and of k (a count of released rows), so free post-processing under add/remove-one-unit
    DP.
    """
    if k < 1:
        raise ValueError("a sum of noises needs k ≥ 1")
    one = accuracy(noise)
    if k == 1:
        return one
    stddev = math.sqrt(k) * one.stddev
    bounds = [k * halfwidth(noise, 1 - 0.05 / k)]
    if noise.mechanism == "gaussian":
        bounds.append(math.ceil(math.sqrt(_sigma2(noise)) * math.sqrt(2 * k * math.log(40))))
    else:
        bounds.append(math.ceil(_laplace_sum_chernoff(float(noise.scale), k, 0.05)))
    exact = _sum_halfwidth_exact(noise, k, 0.95)
    if exact is not None:
        bounds.append(exact)
    return Accuracy(stddev, float(min(bounds)))


def _sum_halfwidth_exact(noise: Noise, k: int, coverage: float) -> int | None:
    """Smallest h with P(|X₁+…+X_k| ≤ h) ≥ coverage from the convolved PMF, counting the
    truncated mass and the FFT's error as outside; None when the support is too wide."""
    if noise.mechanism == "laplace":
        t = float(noise.scale)
        top = math.ceil(_LAPLACE_TAIL_SCALES * t) + 1
        q = math.exp(-1 / t)
        left_out = 2 * math.exp((top + 1) * (-1 / t)) / (1 + q)
    else:
        sigma2 = _sigma2(noise)
        top = math.ceil(_GAUSSIAN_TAIL_SIGMAS * math.sqrt(sigma2)) + 2
        left_out = 1e-40  # exp(−98)-small: the discrete Gaussian's mass beyond 14σ
    points = k * 2 * top + 1
    if points > _SUM_EXACT_MAX_POINTS:
        return None
    x = np.arange(-top, top + 1, dtype=np.float64)
    log_w = -np.abs(x) / t if noise.mechanism == "laplace" else -(x * x) / (2 * sigma2)
    pmf = np.exp(log_w) / np.exp(log_w).sum()
    size = 1 << (points - 1).bit_length()
    summed = np.fft.irfft(np.fft.rfft(pmf, size) ** k, size)[:points]
    cumulative = np.cumsum(np.clip(summed, 0.0, None))
    center = k * top  # index of a sum of 0
    h = np.arange(0, center + 1)
    below = np.where(center - h - 1 >= 0, cumulative[np.maximum(center - h - 1, 0)], 0.0)
    inside = cumulative[center + h] - below - k * left_out - _FFT_SLACK
    meets = np.nonzero(inside >= coverage)[0]
    return int(meets[0]) if meets.size else None


def _laplace_sum_chernoff(scale: float, k: int, tail: float) -> float:
    """Smallest h (to within 1e-9 relative) with 2·min_λ e^{−λh}·M(λ)^k ≤ tail, M the
    discrete Laplace moment generating function."""
    log_q = -1 / scale
    one_minus_q = -math.expm1(log_q)

    def log_bound(h: float) -> float:
        def g(lam: float) -> float:  # convex in λ on (0, 1/t)
            m = 2 * math.log(one_minus_q) - math.log1p(-math.exp(log_q + lam))
            m -= math.log1p(-math.exp(log_q - lam))
            return -lam * h + k * m

        lo, hi = 0.0, (1 / scale) * (1 - 1e-12)
        ratio = (math.sqrt(5) - 1) / 2
        for _ in range(_CHERNOFF_STEPS):
            a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
            if g(a) < g(b):
                hi = b
            else:
                lo = a
        return math.log(2) + g((lo + hi) / 2)

    target = math.log(tail)
    lo, hi = 0.0, 1.0
    while log_bound(hi) > target:
        hi *= 2
    while hi - lo > 1e-9 * hi:
        mid = (lo + hi) / 2
        if log_bound(mid) > target:
            lo = mid
        else:
            hi = mid
    return hi
