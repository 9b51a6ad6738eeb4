"""The samplers' empirical distributions match the exact PMFs (chi-square, false alarm ≤ 1e-6).

Every spec is tested on its own with a fixed rejection rule p < 1e-6 (the chi-square
statistic's asymptotic null distribution; all bins have expected counts ≥ 20). The rare
exact-resolution paths (prefix between bounds, float margin of the Gaussian rejection step)
are forced on a whole run so that they are tested as thoroughly as the fast paths.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from mechanisms import Noise, sample
from mechanisms import samplers as samplers_module
from mechanisms.exact import LazyUniform, bernoulli_exp_neg
from mechanisms.samplers import DiscreteGaussian, DiscreteLaplace

from .dp_harness import cp_lower, cp_upper

pytestmark = pytest.mark.slow

ALPHA = 1e-6
N = 200_000
MIN_EXPECTED = 20


def _laplace_cdf(scale: Fraction) -> Callable[[np.ndarray], np.ndarray]:
    # P(X ≤ x) = q^(−x)/(1+q) for x < 0 and 1 − q^(x+1)/(1+q) for x ≥ 0.
    t = float(scale)
    q = math.exp(-1 / t)

    def cdf(x: np.ndarray) -> np.ndarray:
        x = x.astype(np.float64)
        neg = np.exp(np.minimum(x, 0) / t) / (1 + q)
        pos = 1 - np.exp(-(np.maximum(x, 0) + 1) / t) / (1 + q)
        return np.where(x < 0, neg, pos)

    return cdf


def _gaussian_cdf(sigma2: Fraction) -> Callable[[np.ndarray], np.ndarray]:
    s2 = float(sigma2)
    sigma = math.sqrt(s2)
    if sigma > 1e4:
        # Midpoint rule; relative error O(1/σ²) ≪ the test's resolution.
        return lambda x: stats.norm.cdf((x.astype(np.float64) + 0.5) / sigma)
    top = math.ceil(14 * sigma) + 2
    xs = np.arange(-top, top + 1)
    w = np.exp(-(xs.astype(np.float64) ** 2) / (2 * s2))
    c = np.cumsum(w) / w.sum()

    def cdf(x: np.ndarray) -> np.ndarray:
        idx = np.clip(x + top, -1, 2 * top)
        return np.where(idx < 0, 0.0, c[np.maximum(idx, 0)])

    return cdf


def _chi_square_pvalue(
    draws: np.ndarray, cdf: Callable[[np.ndarray], np.ndarray], spread: float
) -> float:
    """Bin edges at ~200 quantiles of a continuous stand-in, bin masses from the exact CDF."""
    guess = stats.laplace.ppf(np.linspace(0.002, 0.998, 200), scale=max(spread, 0.3))
    edges = np.unique(np.round(guess).astype(np.int64))  # bins (…, e0], (e0, e1], …, (e_last, …)
    cum = cdf(edges)
    probs = np.diff(np.concatenate(([0.0], cum, [1.0])))
    counts = np.bincount(np.searchsorted(edges, draws, side="left"), minlength=edges.size + 1)
    # Merge neighbouring bins until each expects ≥ MIN_EXPECTED draws.
    merged_p: list[float] = []
    merged_c: list[int] = []
    acc_p, acc_c = 0.0, 0
    for p, c in zip(probs, counts, strict=True):
        acc_p += p
        acc_c += int(c)
        if acc_p * draws.size >= MIN_EXPECTED:
            merged_p.append(acc_p)
            merged_c.append(acc_c)
            acc_p, acc_c = 0.0, 0
    merged_p[-1] += acc_p
    merged_c[-1] += acc_c
    expected = np.array(merged_p) * draws.size
    observed = np.array(merged_c)
    chi2 = float(((observed - expected) ** 2 / expected).sum())
    return float(stats.chi2.sf(chi2, df=len(merged_p) - 1))


LAPLACE_SCALES = [
    Fraction(1, 3),
    Fraction(1),
    Fraction(7, 2),
    Fraction(100),
    Fraction(10**6),
    Fraction(2**20) + Fraction(1, 3),
]
GAUSSIAN_SIGMA2 = [Fraction(1, 4), Fraction(1), Fraction(10), Fraction(10**4), Fraction(10**12)]


@pytest.mark.parametrize("scale", LAPLACE_SCALES, ids=str)
def test_discrete_laplace_matches_its_pmf(scale: Fraction) -> None:
    draws = DiscreteLaplace(scale).sample(N)
    assert draws.size == N
    p = _chi_square_pvalue(draws, _laplace_cdf(scale), float(scale))
    assert p >= ALPHA, f"chi-square p = {p:.3g}"


@pytest.mark.parametrize("sigma2", GAUSSIAN_SIGMA2, ids=str)
def test_discrete_gaussian_matches_its_pmf(sigma2: Fraction) -> None:
    draws = DiscreteGaussian(sigma2).sample(N)
    assert draws.size == N
    p = _chi_square_pvalue(draws, _gaussian_cdf(sigma2), math.sqrt(float(sigma2)) * 0.75)
    assert p >= ALPHA, f"chi-square p = {p:.3g}"


def test_public_sample_matches_its_pmf() -> None:
    noise = Noise("laplace", Fraction(5, 2))
    draws = np.array(sample(noise, 50_000) + [x for _ in range(2_000) for x in sample(noise, 5)])
    p = _chi_square_pvalue(draws, _laplace_cdf(noise.scale), 2.5)
    assert p >= ALPHA, f"chi-square p = {p:.3g}"


def test_forced_exact_path_of_the_geometric_table() -> None:
    sampler = DiscreteLaplace(Fraction(3))
    geo = sampler._magnitude
    # Every prefix lies between the bounds: every draw goes through LazyUniform.
    geo._lo_rev = np.zeros_like(geo._lo_rev)
    geo._hi_rev = np.full_like(geo._hi_rev, np.iinfo(np.uint64).max)
    draws = sampler.sample(20_000)
    p = _chi_square_pvalue(draws, _laplace_cdf(Fraction(3)), 3.0)
    assert p >= ALPHA, f"chi-square p = {p:.3g}"


def test_forced_exact_path_of_the_geometric_bits() -> None:
    scale = Fraction(1000)
    sampler = DiscreteLaplace(scale)
    geo = sampler._magnitude
    assert geo.low_bits > 0
    geo._bit_lo = [0] * geo.low_bits
    geo._bit_hi = [2**64 - 1] * geo.low_bits
    draws = sampler.sample(10_000)
    p = _chi_square_pvalue(draws, _laplace_cdf(scale), 1000.0)
    assert p >= ALPHA, f"chi-square p = {p:.3g}"


def test_forced_exact_path_of_the_gaussian_rejection(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(samplers_module, "_FLOAT_MARGIN", 2.0)  # nothing decided in floats
    sigma2 = Fraction(10)
    draws = DiscreteGaussian(sigma2).sample(20_000)
    p = _chi_square_pvalue(draws, _gaussian_cdf(sigma2), math.sqrt(10) * 0.75)
    assert p >= ALPHA, f"chi-square p = {p:.3g}"


@pytest.mark.parametrize(
    "gamma", [Fraction(0), Fraction(1, 7), Fraction(1), Fraction(13, 4)], ids=str
)
def test_bernoulli_exp_neg_frequency(gamma: Fraction) -> None:
    n = 20_000
    hits = sum(bernoulli_exp_neg(gamma) for _ in range(n))
    p = math.exp(-float(gamma))
    level = ALPHA / 2
    assert cp_lower(hits, n, level) <= p <= cp_upper(hits, n, level), (hits, n, p)


def test_lazy_uniform_draws_more_bits_only_when_undecided() -> None:
    u = LazyUniform(5, 64)
    # c·2^p is pinned to [5.5·2^(p−64)] — undecidable from 64 bits, decidable after more.
    target = Fraction(11, 2)

    def bounds(p: int) -> tuple[int, int]:
        exact = target * 2 ** (p - 64)
        return math.floor(exact), math.ceil(exact)

    result = u.less_than(bounds)
    assert u.bits >= 128
    assert result == (Fraction(u.value, 2 ** (u.bits - 64)) < target)
    decided = LazyUniform(1, 64)
    assert decided.less_than(lambda p: (2 ** (p - 60), 2 ** (p - 60)))
    assert decided.bits == 64


@pytest.mark.parametrize("scale", [Fraction(1), Fraction(10**6)], ids=str)
def test_chi_square_rejects_a_sampler_five_percent_off(scale: Fraction) -> None:
    # The same test, same rule, on a sampler whose scale is 5% too large: it must reject.
    draws = DiscreteLaplace(scale * Fraction(105, 100)).sample(N)
    assert _chi_square_pvalue(draws, _laplace_cdf(scale), float(scale)) < ALPHA
