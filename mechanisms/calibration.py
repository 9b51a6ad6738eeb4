"""Calibration: from a query's privacy parameters and sensitivities to noise and cost.

Neighbouring relation everywhere in this module (docs/design.md): two databases are neighbours
when one is the other plus all rows of one privacy unit (add/remove one unit). A
``Sensitivity`` is the most one unit can move one measure, summed over all the groups the
unit may touch (the gateway already multiplied by ``max_groups_per_unit``), in integer units.

How a query's budget is split. A query has m measures (AVG = one SUM and one COUNT) and,
when its group keys are not public, one partition-selection step. Each of these *parts*
gets an equal share of ε (Laplace) or of ρ (Gaussian from ρ); for Gaussian from (ε, δ) the
measures are calibrated *jointly* (one analytic-Gaussian calibration for the whole vector
of measures). δ goes to the parts that need it: with Laplace all of δ goes to selection;
with Gaussian and selection, selection gets the same 1/(m+1) share of (ε, δ) as one measure.

Partition selection always uses discrete Laplace noise on per-group unit counts (even for a
Gaussian query), so that its privacy loss is pure ε_s except on the event "a group that
exists only because of the added unit is released", whose probability is the charged δ.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction
from functools import lru_cache

import numpy as np
import numpy.typing as npt

from mechanisms.samplers import MAX_SCALE
from mechanisms.types import (
    MechanismName,
    Noise,
    PartitionSelection,
    PrivacyCost,
    QueryCalibration,
    Sensitivity,
)

# σ is rounded *up* to a multiple of 2^−20, so the recorded scale is exact and no smaller
# than the calibrated one.
_SIGMA_GRID = 1 << 20
# Relative slack added to σ to absorb floating-point error in the analytic-Gaussian search
# and in the δ evaluations (measured discrepancies are ~3e-8 relative in δ).
_SIGMA_SLACK = 1e-6
# Smallest non-zero δ accepted.
_MIN_DELTA = 1e-30
# Grid values of a real column stay below 2^21 in magnitude (see grid_resolution).
_GRID_BITS = 20


def _check_epsilon(epsilon: float) -> Fraction:
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)):
        raise ValueError(f"epsilon must be a number, got {epsilon!r}")
    if not math.isfinite(epsilon) or epsilon <= 0:
        raise ValueError(f"epsilon must be finite and > 0, got {epsilon!r}")
    if epsilon > 100:
        raise ValueError(f"epsilon must be <= 100, got {epsilon!r}")
    return Fraction(epsilon)


def _check_delta(delta: float, *, positive: bool, what: str) -> float:
    if isinstance(delta, bool) or not isinstance(delta, (int, float)):
        raise ValueError(f"delta must be a number, got {delta!r}")
    if not math.isfinite(delta) or delta < 0 or delta >= 1:
        raise ValueError(f"delta must be finite and in [0, 1), got {delta!r}")
    if positive and delta <= 0:
        raise ValueError(f"delta must be > 0 {what}, got {delta!r}")
    if 0 < delta < _MIN_DELTA:
        # Below this the float evaluations of Gaussian tails and of δ lose their precision.
        raise ValueError(f"delta must be 0 or >= {_MIN_DELTA:g}, got {delta!r}")
    return float(delta)


def _check_sensitivities(sensitivities: Sequence[Sensitivity]) -> None:
    if len(sensitivities) == 0:
        raise ValueError("a query needs at least one measure (sensitivities is empty)")
    for i, s in enumerate(sensitivities):
        if not isinstance(s, Sensitivity):
            raise ValueError(f"sensitivities[{i}] is not a Sensitivity: {s!r}")
        for name in ("l1", "l2", "linf"):
            v = getattr(s, name)
            if not isinstance(v, (Fraction, int)) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"sensitivities[{i}].{name} must be a Fraction > 0, got {v!r}")
        if not s.linf <= s.l2 <= s.l1:
            raise ValueError(
                f"sensitivities[{i}] is inconsistent: need linf <= l2 <= l1, got "
                f"l1={s.l1}, l2={s.l2}, linf={s.linf}"
            )


def _check_groups(max_groups_per_unit: int | None) -> None:
    if max_groups_per_unit is None:
        return
    if (
        isinstance(max_groups_per_unit, bool)
        or not isinstance(max_groups_per_unit, int)
        or max_groups_per_unit < 1
    ):
        raise ValueError(
            f"max_groups_per_unit must be an integer >= 1, got {max_groups_per_unit!r}"
        )


def _check_scale(scale: Fraction) -> None:
    if scale > MAX_SCALE:
        # log10 of the Fraction's parts: float(scale) itself overflows for ε near 5e-324
        magnitude = len(str(scale.numerator // scale.denominator)) - 1
        raise ValueError(
            f"the noise scale (about 1e{magnitude}) is too large (> 2^40): raise epsilon or "
            "tighten the bounds"
        )


# --- Gaussian tails in log space -------------------------------------------------------


def _log_phi_neg(a: float) -> float:
    """log Φ(−a) for any real a, accurate in the far tail (Φ = standard normal CDF)."""
    if a < 30:
        return math.log(0.5 * math.erfc(a / math.sqrt(2)))
    # Asymptotic expansion of the Mills ratio; relative error < 1e-8 for a ≥ 30.
    return -a * a / 2 - math.log(a) - 0.5 * math.log(2 * math.pi) + math.log1p(-1 / a**2 + 3 / a**4)


def analytic_gaussian_delta(mu: float, epsilon: float) -> float:
    """δ(ε) of the Gaussian mechanism with sensitivity/σ ratio ``mu`` (Balle & Wang 2018, Thm 8).

    δ = Φ(μ/2 − ε/μ) − e^ε Φ(−μ/2 − ε/μ), the exact privacy profile of adding N(0, σ²) to a
    statistic of L2 sensitivity Δ = μσ, i.e. whose value moves by at most Δ in L2 norm when
    one privacy unit is added or removed. Continuous Gaussian; see ``calibrate_query`` for
    the discrete one.
    """
    a = math.exp(_log_phi_neg(epsilon / mu - mu / 2))
    b = math.exp(min(epsilon + _log_phi_neg(mu / 2 + epsilon / mu), 700.0))
    return max(a - b, 0.0)


def analytic_gaussian_mu(epsilon: float, delta: float) -> float:
    """The largest Δ/σ for which the Gaussian mechanism is (ε, δ)-DP (analytic calibration).

    δ(μ) is increasing in μ, so a bisection on log μ finds it; the returned μ is on the
    safe side (δ(μ) ≤ δ) of the bisection bracket. Guarantee (Balle & Wang 2018, Thm 8):
    N(0, (Δ/μ)²) noise on a statistic of L2 sensitivity Δ under add/remove one privacy unit
    is (ε, δ)-DP.
    """
    lo, hi = 1e-6, 1.0
    while analytic_gaussian_delta(hi, epsilon) <= delta:
        lo, hi = hi, hi * 2
        if hi > 1e6:
            raise ValueError("(epsilon, delta) too weak to calibrate a Gaussian mechanism")
    if analytic_gaussian_delta(lo, epsilon) > delta:
        raise ValueError(f"delta={delta!r} is too small to calibrate a Gaussian mechanism")
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        if analytic_gaussian_delta(mid, epsilon) <= delta:
            lo = mid
        else:
            hi = mid
        if hi / lo < 1 + 1e-12:
            break
    return lo


def zcdp_epsilon(rho: float, delta: float) -> float:
    """ε such that ρ-zCDP implies (ε, δ)-DP (Canonne, Kamath & Steinke 2020, Cor. 13).

    ε = min over α > 1 of ρα + (log(1/δ) + (α−1) log(1 − 1/α) − log α) / (α − 1).
    The objective is convex in α on the range that matters; a golden-section search on
    log α gives the minimum to well below display precision. Holds for whatever
    neighbouring relation the ρ was computed under (here add/remove one privacy unit).
    """
    if rho <= 0:
        return 0.0

    def f(alpha: float) -> float:
        return rho * alpha + (
            math.log(1 / delta) + (alpha - 1) * math.log1p(-1 / alpha) - math.log(alpha)
        ) / (alpha - 1)

    lo, hi = math.log(1.0 + 1e-9), math.log(1e7)
    g = (math.sqrt(5) - 1) / 2
    for _ in range(200):
        a = hi - g * (hi - lo)
        b = lo + g * (hi - lo)
        if f(math.exp(a)) < f(math.exp(b)):
            hi = b
        else:
            lo = a
    return f(math.exp((lo + hi) / 2))


# Below this σ the lattice of the discrete Gaussian measurably changes its (ε, δ) profile
# (e.g. ε = 5, Δ = 1, δ = 1e-9: the continuous calibration gives a discrete δ 1.97× too
# large); above it the measured difference is < 1e-6 relative, i.e. below float noise.
_DISCRETE_CHECK_MAX_SIGMA = 2000.0


def discrete_gaussian_delta(sigma2: float, shift: int, epsilon: float) -> float:
    """Exact δ(ε) between N_Z(0, σ²) and N_Z(shift, σ²): Σ_x max(0, p(x) − e^ε p(x − shift)).

    The hockey-stick divergence of the two discrete Gaussians, which is the tight δ of the
    discrete Gaussian mechanism for an integer statistic moved by ``shift`` (the same in
    both directions by symmetry; CKS 2020, Thm 7). Summed over ±(20σ + shift), float64.
    """
    sigma = math.sqrt(sigma2)
    top = math.ceil(20 * sigma) + shift + 2
    x = np.arange(-top, top + 1, dtype=np.float64)
    log_p = -(x * x) / (2 * sigma2)
    log_q = -((x - shift) ** 2) / (2 * sigma2)
    z = float(np.exp(log_p).sum())
    diff = np.exp(log_p) - np.exp(np.minimum(epsilon + log_q, 700.0))
    return float(diff[diff > 0].sum()) / z


@lru_cache(maxsize=512)
def _discrete_inflation(sigma: float, shift: int, epsilon: float, delta: float) -> float:
    """Smallest σ' ≥ σ (to 1e-6 relative) whose exact discrete δ(ε) at ``shift`` is ≤ δ."""
    target = delta * (1 - 1e-9)
    if (
        sigma >= _DISCRETE_CHECK_MAX_SIGMA
        or discrete_gaussian_delta(sigma * sigma, shift, epsilon) <= target
    ):
        return sigma
    lo, hi = sigma, sigma * 1.05
    while discrete_gaussian_delta(hi * hi, shift, epsilon) > target:
        lo, hi = hi, hi * 1.5
    while hi / lo > 1 + 1e-6:
        mid = (lo + hi) / 2
        if discrete_gaussian_delta(mid * mid, shift, epsilon) <= target:
            hi = mid
        else:
            lo = mid
    return hi


def _dg_support(sigma2: float, shift: int) -> npt.NDArray[np.float64]:
    top = math.ceil(20 * math.sqrt(sigma2)) + shift + 2
    return np.arange(-top, top + 1, dtype=np.float64)


def discrete_gaussian_delta_pair(
    sigma2_a: float, shift_a: int, sigma2_b: float, shift_b: int, epsilon: float
) -> float:
    """Exact δ(ε) of two independent discrete Gaussians moved by integer shifts (a, b) > 0.

    δ = E_P[(1 − e^(ε − L_a − L_b))₊] with L = (d² − 2dZ)/(2σ²) the privacy loss of each
    coordinate (P centred at 0, Q at the shift). L_b is decreasing in Z_b, so for each
    value of Z_a the inner expectation is F_P(z*) − e^(ε − L_a)·F_Q(z*) with F the CDFs of
    Z_b under P and Q: an O(n) exact sum (float64), no discretisation of the loss. Both
    directions are equal by the symmetry z → d − z.
    """
    za = _dg_support(sigma2_a, shift_a)
    pa = np.exp(-(za * za) / (2 * sigma2_a))
    pa /= pa.sum()
    la = (shift_a * shift_a - 2 * shift_a * za) / (2 * sigma2_a)
    zb = _dg_support(sigma2_b, shift_b)
    wb = np.exp(-(zb * zb) / (2 * sigma2_b))
    norm = wb.sum()
    cum_p = np.concatenate(([0.0], np.cumsum(wb / norm)))
    cum_q = np.concatenate(
        ([0.0], np.cumsum(np.exp(-((zb - shift_b) ** 2) / (2 * sigma2_b)) / norm))
    )
    c = epsilon - la
    # L_b(z) > c  ⇔  z < (d² − 2σ²c) / (2d)
    z_star = (shift_b * shift_b - 2 * sigma2_b * c) / (2 * shift_b)
    k = np.searchsorted(zb, z_star, side="left")
    inner = cum_p[k] - np.exp(np.minimum(c, 700.0)) * cum_q[k]
    return float((pa * np.maximum(inner, 0.0)).sum())


@lru_cache(maxsize=512)
def _discrete_inflation_pair(
    sigmas: tuple[float, float], shifts: tuple[int, int], epsilon: float, delta: float
) -> float:
    """Smallest factor κ ≥ 1 (to 1e-6) with the pair's exact discrete δ(ε) ≤ δ at κσ."""
    target = delta * (1 - 1e-9)

    def ok(kappa: float) -> bool:
        a, b = (kappa * sigmas[0]) ** 2, (kappa * sigmas[1]) ** 2
        return discrete_gaussian_delta_pair(a, shifts[0], b, shifts[1], epsilon) <= target

    if ok(1.0):
        return 1.0
    lo, hi = 1.0, 1.05
    while not ok(hi):
        lo, hi = hi, hi * 1.5
    while hi / lo > 1 + 1e-6:
        mid = (lo + hi) / 2
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return hi


def _gaussian_noise(l2: Fraction, sigma: float) -> Noise:
    scale = Fraction(math.ceil(sigma * (1 + _SIGMA_SLACK) * _SIGMA_GRID), _SIGMA_GRID)
    _check_scale(scale)
    return Noise("gaussian", scale, scale * scale)


def _rho_of(noises: Sequence[Noise], sensitivities: Sequence[Sensitivity]) -> Fraction:
    total = Fraction(0)
    for noise, s in zip(noises, sensitivities, strict=True):
        assert noise.sigma2 is not None
        total += s.l2 * s.l2 / (2 * noise.sigma2)
    return total


# --- Partition selection ----------------------------------------------------------------


def tail_probability(noise: Noise, distance: int) -> float:
    """An upper bound on P(Z ≥ ``distance``) for Z drawn from ``noise`` (distance ≥ 1).

    - Discrete Laplace of scale s: exactly q^d/(1 + q) with q = e^(−1/s), since
      P(Z = z) = (1 − q)/(1 + q)·q^|z|.
    - Discrete Gaussian N_Z(0, σ²): for σ < 2000 the sum Σ_{z ≥ d} e^(−z²/2σ²) over the
      normaliser Σ_z e^(−z²/2σ²), both to 40σ past their start (the rest is below 1e-300
      of the sum). Above, the bound P(Z ≥ d) ≤ P(N(0, σ²) ≥ d − 1): for d ≥ 1 each term
      e^(−z²/2σ²), z ≥ d, is at most the integral of e^(−y²/2σ²) over [z − 1, z], and the
      normaliser is ≥ √(2π)σ (Poisson summation: it is √(2π)σ·(1 + 2Σ_k e^(−2π²σ²k²))).
    """
    if distance < 1:
        return 1.0
    if noise.mechanism == "laplace":
        s = float(noise.scale)
        return math.exp(-distance / s) / (1 + math.exp(-1 / s))
    assert noise.sigma2 is not None
    sigma2 = float(noise.sigma2)
    sigma = math.sqrt(sigma2)
    if sigma >= _DISCRETE_CHECK_MAX_SIGMA:
        return math.exp(_log_phi_neg((distance - 1) / sigma))
    return _discrete_gaussian_tail(sigma2, distance)


@lru_cache(maxsize=512)
def _discrete_gaussian_tail(sigma2: float, distance: int) -> float:
    width = math.ceil(40 * math.sqrt(sigma2)) + 2
    z = np.arange(distance, distance + width, dtype=np.float64)
    # factor out the first term so that tiny tails keep their relative precision
    head = -(distance * distance) / (2 * sigma2)
    tail = float(np.exp(-(z * z - distance * distance) / (2 * sigma2)).sum())
    x = np.arange(-width, width + 1, dtype=np.float64)
    norm = float(np.exp(-(x * x) / (2 * sigma2)).sum())
    return math.exp(head + math.log(tail) - math.log(norm))


def release_probability(noise: Noise, threshold: int, linf: int, l1: int, groups: int) -> float:
    """The most likely that a group present *only* because of one added unit is released.

    The added unit creates at most ``groups`` new groups, each with a count c_i between 1
    and ``linf`` (the most it adds to one group) and Σ c_i ≤ ``l1``; each is released iff
    c_i + Z_i ≥ τ, independently. The probability that any is, 1 − Π(1 − t(c_i)) with
    t(c) = P(Z ≥ τ − c), is a sum of f(c_i) = −log(1 − t(c_i)) under an increasing convex
    map. For τ ≥ ``linf`` the increments t(c + 1) − t(c) = P(Z = τ − c − 1) grow with c
    (both noises have symmetric PMFs decreasing away from 0), so f is increasing and
    discretely convex: moving one from a smaller interior c_a to a larger c_b never lowers
    the sum. Its maximum thus has every c_i at 1 or ``linf`` except at most one, and uses
    as much of ``l1`` as it can. This returns the maximum over those configurations.
    """
    if linf < 1 or l1 < 1 or groups < 1:
        raise ValueError("release_probability needs linf, l1 and groups >= 1")
    if threshold < linf:
        return 1.0
    linf = min(linf, l1)
    keep_one = 1 - tail_probability(noise, threshold - 1)
    keep_full = 1 - tail_probability(noise, threshold - linf)
    best_keep = 1.0
    for k in range(1, min(groups, l1) + 1):
        # `full` groups at linf, the others at 1 but one that takes what is left of l1
        full = 0 if linf == 1 else min(k, (l1 - k) // (linf - 1))
        rest = l1 - full * linf - (k - full - 1)
        if full == k or rest <= 1:
            keep = keep_full**full * keep_one ** (k - full)
        else:
            keep = keep_full**full * keep_one ** (k - full - 1)
            keep *= 1 - tail_probability(noise, threshold - min(rest, linf))
        best_keep = min(best_keep, keep)
    return 1 - best_keep


def selection_delta(epsilon: Fraction, threshold: int, max_groups_per_unit: int) -> float:
    """The δ of releasing groups whose noisy *unit* count, + DLap(g/ε_s), is ≥ ``threshold``.

    A unit touches at most g groups and adds 1 to each one's unit count, so L1 ≤ g: the
    noisy counts of the groups that exist without the unit are pure ε_s-DP. A group that
    exists only because of the unit is released with probability P(1 + Z ≥ τ); the
    probability p that any of them is, ``release_probability``, is the δ of both
    directions of (ε_s, δ)-DP and of δ-approximate (ε_s²/2)-zCDP (docs/accounting.md,
    "Partition selection"). Neighbours: add/remove one privacy unit, with at most g groups
    per unit enforced in SQL.
    """
    g = max_groups_per_unit
    noise = Noise("laplace", Fraction(g) / Fraction(epsilon))
    return release_probability(noise, threshold, 1, g, g)


def selection_threshold(
    noise: Noise, linf: int, l1: int, groups: int, delta: float
) -> tuple[int, float]:
    """The smallest integer threshold τ whose ``release_probability`` is ≤ δ, and that
    probability (with a relative margin of 1e-9 against float rounding)."""
    target = delta * (1 - 1e-9)

    def ok(tau: int) -> bool:
        return release_probability(noise, tau, linf, l1, groups) <= target

    lo, hi = linf, linf + 1  # ok(linf) is false: a one-row group is released half the time
    while not ok(hi):
        lo, hi = hi, hi + 2 * (hi - lo)
        if hi - linf > 2**62:
            raise ValueError("delta too small for partition selection")
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return hi, release_probability(noise, hi, linf, l1, groups)


def _partition_selection(
    epsilon: Fraction, delta: float, max_groups_per_unit: int
) -> tuple[PartitionSelection, float]:
    """Selection on a separate noisy unit count at ε_s (a query with no count to select by)."""
    g = max_groups_per_unit
    scale = Fraction(g) / epsilon
    _check_scale(scale)
    noise = Noise("laplace", scale)
    tau, achieved = selection_threshold(noise, 1, g, g, delta)
    return PartitionSelection(noise, tau, g), achieved


def _own_count_selection(
    noise: Noise, selector: int, sensitivity: Sensitivity, delta: float, groups: int
) -> tuple[PartitionSelection, float]:
    """Selection by the noisy value of count measure ``selector`` itself (no ε of its own)."""
    linf, l1 = int(sensitivity.linf), int(sensitivity.l1)
    tau, achieved = selection_threshold(noise, linf, l1, groups, delta)
    return PartitionSelection(noise, tau, groups, measure=selector), achieved


def _check_selector(selector: int | None, sensitivities: Sequence[Sensitivity]) -> None:
    if selector is None:
        return
    if isinstance(selector, bool) or not isinstance(selector, int):
        raise ValueError(f"selector must be a measure index, got {selector!r}")
    if not 0 <= selector < len(sensitivities):
        raise ValueError(f"selector {selector} is not a measure index")
    s = sensitivities[selector]
    for name in ("l1", "linf"):
        if Fraction(getattr(s, name)).denominator != 1:
            raise ValueError(f"the selecting count's {name} sensitivity must be an integer")


# --- Public calibration -----------------------------------------------------------------


def calibrate_query(
    mechanism: MechanismName,
    epsilon: float,
    delta: float,
    sensitivities: Sequence[Sensitivity],
    *,
    max_groups_per_unit: int | None = None,
    selector: int | None = None,
) -> QueryCalibration:
    """Noise for every measure of one query (and its partition selection) at cost (ε, δ).

    Guarantee (add/remove one privacy unit): the tuple of all noisy measures, over all
    groups, together with the set of groups released by partition selection, is
    (ε, δ)-DP where (ε, δ) is the *whole query's* request; the returned ``cost`` is what
    the ledger must charge.

    - Laplace: each of the P = m (+1 with selection) parts gets ε/P; measure i gets
      discrete Laplace of scale Δ1_i/(ε/P), which is (ε/P)-DP for an integer statistic of
      L1 sensitivity Δ1_i (CKS 2020, Thm 2 for the discrete Laplace; basic composition).
      cost = (ε, 0, ρ = ε²/2) (Bun & Steinke 2016, Prop. 1.4: ε-DP ⇒ ε²/2-zCDP) plus the
      selection δ. δ > 0 is required only with selection.
    - Gaussian: the measures share (ε_m, δ_m) = (1 − 1/P)(ε, δ) with selection, (ε, δ)
      without. One analytic-Gaussian calibration (Balle & Wang 2018) finds the largest
      μ = ‖Δ/σ‖₂ allowed; measure i gets σ_i = Δ2_i·√m/μ (equal ρ shares), so the whole
      vector of measures is exactly a Gaussian mechanism with ratio μ. The noise is the
      *discrete* Gaussian: its privacy loss is exactly ρ = Σ Δ2_i²/(2σ_i²)-zCDP (CKS 2020,
      Thm 14), which is what ``cost.rho`` records and what the zCDP ledger charges. Its
      (ε, δ) profile is close to, but not always below, the continuous one at small σ
      (measured: ε = 5, Δ = 1, δ = 1e-9 gives a discrete δ 1.97× the target). So for one
      measure moving one coordinate by an integer (l2 == linf, integer) σ is widened until
      the exact discrete δ(ε) (``discrete_gaussian_delta``, CKS 2020 Thm 7) is ≤ δ, and
      likewise for two such measures (an AVG) with the exact joint δ
      (``discrete_gaussian_delta_pair``), both while σ < 2000 (above, the measured lattice
      effect is below float precision). For more measures or coordinates the nominal
      (ε, δ) rests on the continuous bound, while ρ stays exact.
    - Selection (``max_groups_per_unit`` given). With a ``selector`` (the index of a count
      measure) the groups are selected by that count's *own* noisy value: a group is
      released iff it reaches the threshold of ``selection_threshold``, and no part of ε
      goes to selection (P = m). The released measures of the groups that exist without
      the added unit are the ε-DP (or (ε, δ_m)-DP) vector above, thresholded; a group that
      exists only because of it is released with probability p ≤ the charged
      ``cost.selection_delta`` (``release_probability``). The whole release is then
      (ε, δ_m + p)-DP in both directions and p-approximately ρ-zCDP (docs/accounting.md,
      "Partition selection"). Without a selector, a separate noisy unit count at its own
      share ε/P selects (``selection_delta``). Gaussian queries give the selection a
      1/(m+1) share of δ; Laplace ones all of it.

    Raises ValueError on invalid parameters.
    """
    eps = _check_epsilon(epsilon)
    _check_sensitivities(sensitivities)
    _check_groups(max_groups_per_unit)
    _check_selector(selector, sensitivities)
    selecting = max_groups_per_unit is not None
    own = selecting and selector is not None
    m = len(sensitivities)
    parts = m + (1 if selecting and not own else 0)

    if mechanism == "laplace":
        d = _check_delta(delta, positive=selecting, what="for partition selection")
        share = eps / parts
        noises: list[Noise] = []
        for s in sensitivities:
            scale = Fraction(s.l1) / share
            _check_scale(scale)
            noises.append(Noise("laplace", scale))
        selection: PartitionSelection | None = None
        sel_delta = 0.0
        if max_groups_per_unit is not None and selector is not None:
            selection, sel_delta = _own_count_selection(
                noises[selector], selector, sensitivities[selector], d, max_groups_per_unit
            )
        elif max_groups_per_unit is not None:
            selection, sel_delta = _partition_selection(share, d, max_groups_per_unit)
        e = float(eps)
        return QueryCalibration(
            tuple(noises), selection, PrivacyCost(e, 0.0, e * e / 2, selection_delta=sel_delta)
        )

    if mechanism == "gaussian":
        d = _check_delta(delta, positive=True, what="for the Gaussian mechanism")
        eps_m, delta_m = float(eps), d
        selection = None
        sel_delta = 0.0
        rho_sel = Fraction(0)
        if own:
            delta_m = d - d / (m + 1)
        elif max_groups_per_unit is not None:
            sel_eps = eps / parts
            selection, sel_delta = _partition_selection(sel_eps, d / parts, max_groups_per_unit)
            eps_m = float(eps - sel_eps)
            delta_m = d - d / parts
            rho_sel = sel_eps * sel_eps / 2
        mu = analytic_gaussian_mu(eps_m, delta_m)
        only = sensitivities[0]
        if m == 1 and only.l2 == only.linf and Fraction(only.l2).denominator == 1:
            # One measure moved on one coordinate by an integer: check the exact discrete
            # profile and widen σ where the lattice makes it worse than the continuous one.
            shift = int(only.l2)
            sigma = _discrete_inflation(shift / mu, shift, eps_m, delta_m)
            noises = [_gaussian_noise(Fraction(only.l2), sigma)]
        else:
            sigmas = [float(s.l2) * math.sqrt(m) / mu for s in sensitivities]
            if (
                m == 2
                and all(s.l2 == s.linf and Fraction(s.l2).denominator == 1 for s in sensitivities)
                and max(sigmas) < _DISCRETE_CHECK_MAX_SIGMA
            ):
                # Two measures, each moved on one coordinate (an AVG): exact joint check.
                shifts = (int(sensitivities[0].l2), int(sensitivities[1].l2))
                kappa = _discrete_inflation_pair((sigmas[0], sigmas[1]), shifts, eps_m, delta_m)
                sigmas = [kappa * x for x in sigmas]
            noises = [
                _gaussian_noise(Fraction(s.l2), x)
                for s, x in zip(sensitivities, sigmas, strict=True)
            ]
        if own:
            assert max_groups_per_unit is not None and selector is not None
            selection, sel_delta = _own_count_selection(
                noises[selector],
                selector,
                sensitivities[selector],
                d / (m + 1),
                max_groups_per_unit,
            )
        rho = _rho_of(noises, sensitivities) + rho_sel
        return QueryCalibration(
            tuple(noises), selection, PrivacyCost(float(eps), delta_m, float(rho), sel_delta)
        )

    raise ValueError(f"mechanism must be 'laplace' or 'gaussian', got {mechanism!r}")


def calibrate_query_rho(
    rho: float,
    sensitivities: Sequence[Sensitivity],
    *,
    delta: float,
    max_groups_per_unit: int | None = None,
    selector: int | None = None,
) -> QueryCalibration:
    """Discrete Gaussian noise for every measure of one query calibrated to total ρ-zCDP.

    Guarantee (add/remove one privacy unit): the noisy measures are ρ_m-zCDP with each of
    the P = m (+1 with selection) parts getting ρ/P, σ_i = Δ2_i / √(2ρ/P) (CKS 2020,
    Thm 14: the discrete Gaussian is Δ²/(2σ²)-zCDP); selection (if any) uses discrete
    Laplace with ε_s = √(2ρ/P), which is ε_s²/2 = ρ/P-zCDP except on an event of
    probability ``cost.selection_delta`` ≤ ``delta`` (δ-approximate zCDP). ``delta`` is
    also the δ at which ``cost.epsilon`` is shown (CKS 2020, Cor. 13 conversion of ρ).
    With a ``selector`` the count measure of that index selects by its own noisy value
    (P = m, no selection part; ``calibrate_query``), with ``delta`` as the bound on p.
    """
    if isinstance(rho, bool) or not isinstance(rho, (int, float)):
        raise ValueError(f"rho must be a number, got {rho!r}")
    if not math.isfinite(rho) or rho <= 0 or rho > 5000:
        raise ValueError(f"rho must be finite and in (0, 5000], got {rho!r}")
    d = _check_delta(delta, positive=True, what="to state the (epsilon, delta) of a rho")
    _check_sensitivities(sensitivities)
    _check_groups(max_groups_per_unit)
    _check_selector(selector, sensitivities)
    m = len(sensitivities)
    own = max_groups_per_unit is not None and selector is not None
    parts = m + (1 if max_groups_per_unit is not None and not own else 0)
    share = Fraction(rho) / parts
    noises = [
        _gaussian_noise(Fraction(s.l2), float(s.l2) / math.sqrt(2 * float(share)))
        for s in sensitivities
    ]
    rho_total = _rho_of(noises, sensitivities)
    selection = None
    sel_delta = 0.0
    if max_groups_per_unit is not None and selector is not None:
        selection, sel_delta = _own_count_selection(
            noises[selector], selector, sensitivities[selector], d, max_groups_per_unit
        )
    elif max_groups_per_unit is not None:
        sel_eps = Fraction(math.sqrt(2 * float(share)))
        selection, sel_delta = _partition_selection(sel_eps, d, max_groups_per_unit)
        rho_total += sel_eps * sel_eps / 2
    r = float(rho_total)
    return QueryCalibration(
        tuple(noises), selection, PrivacyCost(zcdp_epsilon(r, d), d, r, sel_delta)
    )


# --- Real-valued columns ------------------------------------------------------------------


def grid_resolution(lower: float, upper: float) -> Fraction:
    """The power of two g to which the gateway rounds a clamped real column before summing.

    g = 2^(⌊log2 M⌋ − 20), M = max(|lower|, |upper|), so every rounded value round(v/g) of a
    clamped v has magnitude < 2^21: relative rounding error ≤ 2^−21 per row, and integer
    sums stay exact in 64 bits for up to 2^42 rows. Noise is calibrated in grid units with
    ``grid_sensitivity``; see docs/mechanisms.md for why the rounding is inside the
    sensitivity argument (it is a per-row function applied before aggregation). g depends
    on the public bounds only, so it costs no privacy (add/remove-one-unit DP unaffected).
    """
    for name, v in (("lower", lower), ("upper", upper)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ValueError(f"{name} must be a finite number, got {v!r}")
    if lower > upper:
        raise ValueError(f"lower ({lower!r}) must be <= upper ({upper!r})")
    bound = max(abs(lower), abs(upper))
    if bound == 0:
        raise ValueError("bounds [0, 0] leave nothing to measure")
    _, exponent = math.frexp(bound)  # bound = f·2^exponent, f ∈ [0.5, 1)
    k = exponent - 1 - _GRID_BITS
    return Fraction(2) ** k


def grid_sensitivity(
    lower: float, upper: float, resolution: Fraction, max_rows_per_unit: int, center: int = 0
) -> Fraction:
    """L1 (= L∞) sensitivity, in grid units, of SUM(round(clamp(v, lower, upper) / g) − c).

    One unit adds at most ``max_rows_per_unit`` rows. Each rounded value lies in
    [⌊lower/g⌋, ⌈upper/g⌉] whatever the database's rounding mode (half-even, half-away) —
    rounding is monotone and never crosses the next integer — so each row contributes an
    integer of magnitude at most max(⌈upper/g⌉ − c, c − ⌊lower/g⌋) (for c = 0:
    ⌈max(|lower|, |upper|)/g⌉). Adding or removing one privacy unit thus moves the
    integer sum by at most ``max_rows_per_unit`` times that.
    """
    if max_rows_per_unit < 1:
        raise ValueError("max_rows_per_unit must be >= 1")
    top = -((-Fraction(upper)) // resolution)  # ceiling
    bottom = Fraction(lower) // resolution
    per_row = max(top - center, center - bottom)
    return Fraction(per_row * max_rows_per_unit)


def grid_center(lower: float, upper: float, resolution: Fraction) -> int:
    """The grid point c nearest the middle of [lower, upper], in grid units.

    Summing round(clamp(v)/g) − c instead of round(clamp(v)/g) makes each row move the sum
    by about (upper − lower)/2 instead of max(|lower|, |upper|) (``grid_sensitivity``); an
    AVG adds c back to the noisy ratio (Σ(x − c)/n + c). c comes from the public bounds
    only, so it costs no privacy.
    """
    middle = (Fraction(lower) + Fraction(upper)) / 2 / resolution
    return round(middle)
