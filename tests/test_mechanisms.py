"""Unit tests of the mechanisms package: public API, calibration, accuracy, grid, pools."""

from __future__ import annotations

import itertools
import math
import os
import time
from decimal import Decimal, getcontext
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mechanisms
from mechanisms import (
    Noise,
    PrivacyCost,
    Sensitivity,
    accuracy,
    analytic_gaussian_delta,
    analytic_gaussian_mu,
    calibrate_query,
    calibrate_query_rho,
    grid_center,
    grid_resolution,
    grid_sensitivity,
    halfwidth,
    prefill,
    ratio_interval,
    release_probability,
    sample,
    selection_delta,
    tail_probability,
    zcdp_epsilon,
)
from mechanisms.exact import exp_neg_bounds
from mechanisms.pool import FIRST_BATCH, POOL_TARGET, POOLS, NoisePools
from mechanisms.samplers import power_table_u64


def sens(v: int | Fraction) -> Sensitivity:
    f = Fraction(v)
    return Sensitivity(f, f, f)


def test_public_api_is_pinned() -> None:
    assert sorted(mechanisms.__all__) == sorted(
        [
            "Accuracy",
            "MechanismName",
            "Noise",
            "PartitionSelection",
            "PrivacyCost",
            "QueryCalibration",
            "Sensitivity",
            "accuracy",
            "analytic_gaussian_delta",
            "analytic_gaussian_mu",
            "calibrate_query",
            "calibrate_query_rho",
            "grid_center",
            "grid_resolution",
            "grid_sensitivity",
            "halfwidth",
            "prefill",
            "ratio_interval",
            "sample",
            "selection_delta",
            "zcdp_epsilon",
            # partition selection by a count's own noise
            "release_probability",
            "selection_threshold",
            "tail_probability",
            # private selection (quantiles)
            "calibrate_with_choices",
            "RankWindow",
            "choose_bucket",
            "choose_bucket_in_window",
            "fine_rank_halfwidth",
            "window_ranks",
            "permute_and_flip",
            "quantile_sensitivity",
            "quantile_utilities",
            "rank_halfwidth",
            "scored_positions",
        ]
    )
    for name in mechanisms.__all__:
        assert hasattr(mechanisms, name)


# --- Laplace calibration ----------------------------------------------------------------


def test_laplace_count_gets_scale_sensitivity_over_epsilon() -> None:
    cal = calibrate_query("laplace", 0.5, 0.0, [sens(1)])
    assert cal.noises == (Noise("laplace", Fraction(2)),)
    assert cal.selection is None
    assert cal.cost.epsilon == 0.5 and cal.cost.delta == 0.0
    assert cal.cost.rho == pytest.approx(0.125)
    assert cal.cost.selection_delta == 0.0


def test_laplace_avg_splits_epsilon_over_sum_and_count() -> None:
    cal = calibrate_query("laplace", 1.0, 0.0, [sens(120), sens(1)])
    assert [n.scale for n in cal.noises] == [Fraction(240), Fraction(2)]
    # The parts' ε add up to exactly the query's ε.
    assert sum(Fraction(1) / n.scale * s for n, s in zip(cal.noises, (120, 1), strict=True)) == 1


def test_laplace_with_partition_selection() -> None:
    cal = calibrate_query("laplace", 1.0, 1e-6, [sens(3)], max_groups_per_unit=3)
    sel = cal.selection
    assert sel is not None
    assert sel.max_groups_per_unit == 3
    assert sel.noise == Noise("laplace", Fraction(3) / Fraction(1, 2))
    assert cal.noises == (Noise("laplace", Fraction(6)),)
    eps_s = Fraction(1, 2)
    assert selection_delta(eps_s, sel.threshold, 3) <= 1e-6
    assert selection_delta(eps_s, sel.threshold - 1, 3) > 1e-6 * (1 - 1e-9)
    assert 0 < cal.cost.selection_delta <= 1e-6
    assert cal.cost.delta == 0.0


def test_selection_delta_matches_a_single_unit_release_probability() -> None:
    # g = 1: a group with one unit is released with P(1 + Z ≥ τ) = q^(τ−1)/(1+q).
    eps = Fraction(1)
    q = math.exp(-1)
    p = q**4 / (1 + q)
    # δ is that probability itself, in both directions (docs/accounting.md)
    assert selection_delta(eps, 5, 1) == pytest.approx(p, rel=1e-12)


def test_own_count_selection_spends_all_epsilon_on_the_count() -> None:
    # COUNT(*) GROUP BY a private key, one row per person: the count at full ε selects
    cal = calibrate_query("laplace", 1.0, 1e-6, [sens(1)], max_groups_per_unit=1, selector=0)
    sel = cal.selection
    assert sel is not None and sel.measure == 0
    assert cal.noises == (Noise("laplace", Fraction(1)),) and sel.noise == cal.noises[0]
    # a one-row group is released iff 1 + Z ≥ τ: P(Z ≥ τ − 1) = e^−(τ−1)/(1 + e^−1)
    q = math.exp(-1)
    assert q ** (sel.threshold - 1) / (1 + q) <= 1e-6 < q ** (sel.threshold - 2) / (1 + q)
    assert sel.threshold == 15  # the separate unit count at ε/2 needed 28
    assert cal.cost == PrivacyCost(1.0, 0.0, 0.5, cal.cost.selection_delta)
    assert 0 < cal.cost.selection_delta <= 1e-6


def _opendp_delta(scale: float, tau_prime: int, groups: int) -> float:
    """OpenDP's laplace threshold map, δ = 1 − (1 − P(Z > τ′ − L∞))^l0 with L∞ = 1, for a
    release iff the noisy value > τ′ (here: ≥ τ = τ′ + 1), with the same discrete Laplace."""
    tail = math.exp(-(tau_prime - 1) / scale) / (math.exp(1 / scale) + 1)
    return 1 - (1 - tail) ** groups


@pytest.mark.parametrize(
    ("eps", "delta", "groups"), [(1.0, 1e-6, 1), (0.5, 1e-8, 3), (2.0, 1e-5, 10)]
)
def test_own_count_selection_is_at_least_as_tight_as_opendp(
    eps: float, delta: float, groups: int
) -> None:
    s = Sensitivity(Fraction(groups), Fraction(groups), Fraction(1))
    cal = calibrate_query("laplace", eps, delta, [s], max_groups_per_unit=groups, selector=0)
    sel = cal.selection
    assert sel is not None
    tau_prime = 1
    while _opendp_delta(groups / eps, tau_prime, groups) > delta:
        tau_prime += 1
    assert sel.threshold <= tau_prime + 1


def _worst_spread(noise: Noise, linf: int, l1: int, groups: int, tau: int) -> float:
    """Brute force: the largest release probability over every way to spread ≤ l1 rows,
    ≤ linf per group, over ≤ groups new groups."""

    def walk(left: int, k: int, keep: float) -> float:
        best = 1 - keep
        if k < groups:
            for c in range(1, min(linf, left) + 1):
                t = tail_probability(noise, tau - c)
                best = max(best, walk(left - c, k + 1, keep * (1 - t)))
        return best

    return walk(l1, 0, 1.0)


@pytest.mark.parametrize(
    ("linf", "l1", "groups", "tau"), [(3, 5, 3, 12), (2, 6, 4, 9), (4, 4, 2, 10), (1, 3, 3, 6)]
)
def test_release_probability_is_the_worst_spread_of_a_units_rows(
    linf: int, l1: int, groups: int, tau: int
) -> None:
    noise = Noise("laplace", Fraction(3))
    worst = _worst_spread(noise, linf, l1, groups, tau)
    assert release_probability(noise, tau, linf, l1, groups) == pytest.approx(worst)


def test_gaussian_own_count_selection_uses_the_count_noise_and_a_share_of_delta() -> None:
    cal = calibrate_query("gaussian", 1.0, 1e-6, [sens(1)], max_groups_per_unit=1, selector=0)
    sel = cal.selection
    assert sel is not None and sel.noise == cal.noises[0] and sel.noise.mechanism == "gaussian"
    assert cal.cost.delta == pytest.approx(0.5e-6)
    assert 0 < cal.cost.selection_delta <= 0.5e-6
    assert tail_probability(sel.noise, sel.threshold - 1) <= 0.5e-6
    assert tail_probability(sel.noise, sel.threshold - 2) > 0.5e-6 * (1 - 1e-9)
    # the discrete Gaussian tail against a direct sum
    sigma2 = float(sel.noise.scale) ** 2
    z = [math.exp(-(x * x) / (2 * sigma2)) for x in range(-400, 401)]
    direct = sum(z[400 + sel.threshold - 1 :]) / sum(z)
    assert tail_probability(sel.noise, sel.threshold - 1) == pytest.approx(direct, rel=1e-9)


def test_a_large_sigma_tail_is_bounded_by_the_continuous_one() -> None:
    noise = Noise("gaussian", Fraction(5000), Fraction(5000) ** 2)
    bound = tail_probability(noise, 30_001)
    # P(N(0, σ²) ≥ 30000) = Φ(−6) ≈ 9.87e-10
    assert bound == pytest.approx(0.5 * math.erfc(6 / math.sqrt(2)), rel=1e-6)


def test_selection_needs_delta_with_laplace() -> None:
    with pytest.raises(ValueError, match="delta"):
        calibrate_query("laplace", 1.0, 0.0, [sens(1)], max_groups_per_unit=1)


# --- Gaussian calibration ---------------------------------------------------------------


def test_analytic_gaussian_matches_balle_wang() -> None:
    # ε = 1, δ = 1e-5, Δ = 1: the analytic σ ≈ 3.73 (the classical bound gives 4.84).
    mu = analytic_gaussian_mu(1.0, 1e-5)
    assert 1 / mu == pytest.approx(3.7306, abs=1e-3)
    assert analytic_gaussian_delta(mu, 1.0) <= 1e-5
    assert analytic_gaussian_delta(mu * (1 + 1e-6), 1.0) > 1e-5


def test_gaussian_calibration_is_joint_and_rounds_sigma_up() -> None:
    eps, delta = 0.7, 1e-7
    s = [sens(1), sens(100)]
    cal = calibrate_query("gaussian", eps, delta, s)
    mu = analytic_gaussian_mu(eps, delta)
    ratio2 = Fraction(0)
    for noise, si in zip(cal.noises, s, strict=True):
        assert noise.mechanism == "gaussian"
        assert noise.sigma2 == noise.scale * noise.scale
        exact = float(si.l2) * math.sqrt(2) / mu
        # The discrete check may widen σ a little (≤ 1%) beyond the continuous calibration.
        assert exact <= float(noise.scale) <= exact * 1.01 + 2**-19
        ratio2 += si.l2 * si.l2 / noise.sigma2
    assert float(ratio2) <= mu * mu
    assert cal.cost.rho == pytest.approx(float(ratio2) / 2)
    assert (cal.cost.epsilon, cal.cost.delta) == (eps, delta)


def test_gaussian_with_selection_splits_epsilon_and_delta() -> None:
    cal = calibrate_query("gaussian", 1.0, 1e-6, [sens(1)], max_groups_per_unit=2)
    assert cal.selection is not None
    assert cal.selection.noise.mechanism == "laplace"
    assert cal.selection.noise.scale == Fraction(2) / Fraction(1, 2)
    assert cal.cost.selection_delta <= 0.5e-6
    assert cal.cost.delta == pytest.approx(0.5e-6)
    mu = analytic_gaussian_mu(0.5, 0.5e-6)
    assert float(cal.noises[0].scale) >= 1 / mu
    assert cal.cost.rho == pytest.approx(1 / (2 * float(cal.noises[0].sigma2)) + 0.125)


def test_calibrate_from_rho() -> None:
    cal = calibrate_query_rho(0.5, [sens(1), sens(10)], delta=1e-6)
    for noise, d in zip(cal.noises, (1, 10), strict=True):
        assert float(noise.scale) == pytest.approx(d / math.sqrt(0.5), rel=1e-5)
    assert cal.cost.rho <= 0.5
    assert cal.cost.rho == pytest.approx(0.5, rel=1e-5)
    assert cal.cost.epsilon == pytest.approx(zcdp_epsilon(cal.cost.rho, 1e-6))


def test_zcdp_conversion_beats_the_simple_bound() -> None:
    rho, delta = 0.1, 1e-6
    eps = zcdp_epsilon(rho, delta)
    assert eps < rho + 2 * math.sqrt(rho * math.log(1 / delta))
    assert eps > rho


@pytest.mark.parametrize(
    ("mechanism", "epsilon", "delta", "sensitivities", "groups"),
    [
        ("laplace", 0.0, 0.0, [sens(1)], None),
        ("laplace", -1.0, 0.0, [sens(1)], None),
        ("laplace", math.nan, 0.0, [sens(1)], None),
        ("laplace", math.inf, 0.0, [sens(1)], None),
        ("laplace", 1e3, 0.0, [sens(1)], None),
        ("laplace", True, 0.0, [sens(1)], None),
        ("laplace", 1.0, -0.1, [sens(1)], None),
        ("laplace", 1.0, 1.0, [sens(1)], None),
        ("laplace", 1.0, 0.0, [], None),
        ("laplace", 1.0, 0.0, [Sensitivity(Fraction(0), Fraction(0), Fraction(0))], None),
        ("laplace", 1.0, 1e-6, [sens(1)], 0),
        ("gaussian", 1.0, 0.0, [sens(1)], None),
        ("gaussian", 1.0, 1.0, [sens(1)], None),
        ("gaussian", 1.0, math.nan, [sens(1)], None),
        ("exponential", 1.0, 0.0, [sens(1)], None),
        ("laplace", 1e-15, 0.0, [sens(1)], None),  # scale beyond 2^40
        ("laplace", 1.0, 0.0, [Sensitivity(Fraction(1), Fraction(2), Fraction(1))], None),
    ],
)
def test_invalid_parameters_raise_value_error(
    mechanism, epsilon, delta, sensitivities, groups
) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError):
        calibrate_query(mechanism, epsilon, delta, sensitivities, max_groups_per_unit=groups)


@pytest.mark.parametrize("rho", [0.0, -1.0, math.nan, math.inf])
def test_invalid_rho_raises(rho: float) -> None:
    with pytest.raises(ValueError):
        calibrate_query_rho(rho, [sens(1)], delta=1e-6)


# --- Accuracy ---------------------------------------------------------------------------


def _pmf(noise: Noise, top: int) -> dict[int, float]:
    if noise.mechanism == "laplace":
        w = {x: math.exp(-abs(x) / float(noise.scale)) for x in range(-top, top + 1)}
    else:
        s2 = float(noise.sigma2 or noise.scale**2)
        w = {x: math.exp(-x * x / (2 * s2)) for x in range(-top, top + 1)}
    z = math.fsum(w.values())
    return {x: v / z for x, v in w.items()}


@pytest.mark.parametrize(
    "noise",
    [
        Noise("laplace", Fraction(1)),
        Noise("laplace", Fraction(1, 3)),
        Noise("laplace", Fraction(250, 7)),
        Noise("gaussian", Fraction(1, 2), Fraction(1, 4)),
        Noise("gaussian", Fraction(3), Fraction(9)),
        Noise("gaussian", Fraction(40), Fraction(1600)),
    ],
    ids=str,
)
def test_accuracy_matches_brute_force_pmf(noise: Noise) -> None:
    pmf = _pmf(noise, int(60 * float(noise.scale)) + 40)
    sd = math.sqrt(math.fsum(x * x * p for x, p in pmf.items()))
    acc = accuracy(noise)
    assert acc.stddev == pytest.approx(sd, rel=1e-9)
    h = int(acc.ci95_halfwidth)
    inside = math.fsum(p for x, p in pmf.items() if abs(x) <= h)
    assert inside >= 0.95
    if h > 0:
        assert math.fsum(p for x, p in pmf.items() if abs(x) <= h - 1) < 0.95


def test_laplace_mae_closed_form() -> None:
    # The benchmark's reference: E|X| = 2q/(1−q²), q = e^−ε for a COUNT at ε.
    q = math.exp(-1)
    pmf = _pmf(Noise("laplace", Fraction(1)), 80)
    assert math.fsum(abs(x) * p for x, p in pmf.items()) == pytest.approx(2 * q / (1 - q * q))


def test_large_sigma_accuracy_agrees_with_direct_summation() -> None:
    from mechanisms.accuracy import _gaussian_stddev_halfwidth

    sigma = 1.5e5
    noise = Noise("gaussian", Fraction(sigma), Fraction(sigma) ** 2)
    direct = accuracy(noise)
    sd, h = _gaussian_stddev_halfwidth(sigma * sigma * 4, 0.95)  # closed-form path
    assert sd == pytest.approx(2 * direct.stddev, rel=1e-9)
    assert abs(h - 2 * direct.ci95_halfwidth) <= 2


def test_ratio_interval_box() -> None:
    lap = Noise("laplace", Fraction(2))
    h1, h2 = halfwidth(lap, 0.975), halfwidth(lap, 0.975)
    lo, hi = ratio_interval(1000, lap, 100, lap)
    assert lo == pytest.approx((1000 - h1) / (100 + h2))
    assert hi == pytest.approx((1000 + h1) / (100 - h2))
    assert lo < 10 < hi
    assert ratio_interval(10, lap, -50, lap) == (-math.inf, math.inf)
    neg_lo, _ = ratio_interval(-1000, lap, 100, lap)
    assert neg_lo == pytest.approx((-1000 - h1) / (100 - h2))


def test_ratio_interval_covers_at_least_95_percent() -> None:
    num_noise, den_noise = Noise("laplace", Fraction(50)), Noise("laplace", Fraction(2))
    true_sum, true_count = 5000, 60
    trials = 2000
    nums = sample(num_noise, trials)
    dens = sample(den_noise, trials)
    hits = 0
    for a, b in zip(nums, dens, strict=True):
        lo, hi = ratio_interval(true_sum + a, num_noise, true_count + b, den_noise)
        hits += lo <= true_sum / true_count <= hi
    assert hits / trials >= 0.95 - 0.03  # 0.03 ≈ 6 binomial standard errors


# --- Real-valued columns ----------------------------------------------------------------


@pytest.mark.parametrize(("lower", "upper"), [(2.0, 20.0), (-1e6, 3.0), (0.0, 1e-9), (-0.75, 0.5)])
def test_grid_resolution_is_a_power_of_two_with_2_20_steps(lower: float, upper: float) -> None:
    g = grid_resolution(lower, upper)
    k = math.log2(g)
    assert k == int(k)
    bound = Fraction(max(abs(lower), abs(upper)))
    assert 2**20 <= bound / g < 2**21


@pytest.mark.parametrize(
    ("lower", "upper"), [(1.0, 0.0), (0.0, 0.0), (math.nan, 1.0), (0.0, math.inf)]
)
def test_grid_resolution_rejects_bad_bounds(lower: float, upper: float) -> None:
    with pytest.raises(ValueError):
        grid_resolution(lower, upper)


def test_grid_sensitivity_rounds_up() -> None:
    g = Fraction(1, 4)
    assert grid_sensitivity(-2.3, 1.0, g, 3) == Fraction(10 * 3)  # ⌈2.3·4⌉ = 10
    assert grid_sensitivity(0.0, 20.0, grid_resolution(0.0, 20.0), 1) == 20 / grid_resolution(0, 20)


# --- Exact arithmetic -------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(
    st.fractions(min_value=0, max_value=80, max_denominator=10**9),
    st.sampled_from([16, 64, 128, 192]),
)
def test_exp_neg_bounds_bracket_the_true_value(x: Fraction, p: int) -> None:
    getcontext().prec = 150
    lo, hi = exp_neg_bounds(x, p)
    true = (-(Decimal(x.numerator) / Decimal(x.denominator))).exp() * (Decimal(2) ** p)
    assert Decimal(lo) <= true <= Decimal(hi)
    assert hi - lo <= 4


@settings(max_examples=60, deadline=None)
@given(
    st.fractions(min_value=Fraction(1, 16), max_value=4, max_denominator=10**6),
    st.sampled_from([0, 64]),
)
def test_the_geometric_table_brackets_every_power(gamma: Fraction, guard: int) -> None:
    """The sampler's table (one bound of exp(−γ), then products) brackets 2^64·exp(−γk)
    for every k it holds — with no guard bits too, where a rounding on the wrong side
    shows — and, with the sampler's guard bits, within a unit, as bounding each power on
    its own does."""
    getcontext().prec = 150
    k_max = math.ceil(24 * 0.6932 / float(gamma)) + 1
    lows, highs = power_table_u64(gamma, k_max, guard)
    g = Decimal(gamma.numerator) / Decimal(gamma.denominator)
    for k, (lo, hi) in enumerate(zip(lows, highs, strict=True), start=1):
        true = (-(g * k)).exp() * (Decimal(2) ** 64)
        assert Decimal(lo) <= true <= Decimal(hi), k
        assert guard == 0 or hi - lo <= 1


# --- Pools ------------------------------------------------------------------------------


def test_sample_consumes_pre_drawn_values() -> None:
    noise = Noise("laplace", Fraction(17, 3))
    prefill(noise, 500)
    pool = POOLS._pool(noise)
    with pool.lock:
        upcoming = list(pool.values[pool.start : pool.start + 300])
    assert sample(noise, 300) == upcoming
    assert all(type(x + 0) is int for x in upcoming)
    assert sample(noise, 0) == []
    with pytest.raises(ValueError):
        sample(noise, -1)


def test_a_new_spec_costs_a_first_batch_and_a_used_one_grows_to_the_target() -> None:
    """A one-off ε draws ``FIRST_BATCH`` values, on the request path and nothing after;
    a spec in use is topped up by the refiller, doubling up to the pools' target."""
    pools = NoisePools()
    noise = Noise("laplace", Fraction(23, 7))
    pools.prefill(noise, 1)
    pool = pools._pool(noise)
    assert pool.available() == FIRST_BATCH
    pools.take(noise, 1)
    assert pools._thread is None  # not low: no refill for a spec asked once
    targets = []
    for _ in range(8):
        pools.take(noise, pool.available() - 1)  # drain: the refiller is woken
        deadline = time.monotonic() + 30
        while pool.available() < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.05)
        targets.append(pool.target)
    assert targets[0] == 2 * FIRST_BATCH
    assert targets[-1] == POOL_TARGET
    assert targets == sorted(targets)


def test_sample_rejects_an_invalid_noise_spec() -> None:
    with pytest.raises(ValueError):
        sample(Noise("laplace", Fraction(0)), 1)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_never_reuses_the_parents_pool() -> None:
    noise = Noise("laplace", Fraction(11, 7))
    prefill(noise, 100)
    pool = POOLS._pool(noise)
    with pool.lock:
        parent_next = list(pool.values[pool.start : pool.start + 50])
    pid = os.fork()
    if pid == 0:  # child: must draw fresh noise, never the parent's next values
        try:
            ok = not POOLS._pools and sample(noise, 50) != parent_next
        finally:
            os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


@pytest.mark.parametrize("epsilon", [0.1, 1.0, 2.0, 5.0])
@pytest.mark.parametrize("delta", [1e-5, 1e-9])
@pytest.mark.parametrize("shift", [1, 3, 100])
def test_single_measure_gaussian_meets_delta_for_the_discrete_noise(
    epsilon: float, delta: float, shift: int
) -> None:
    # The continuous analytic calibration alone is not enough for the discrete Gaussian at
    # small σ (ε = 5, Δ = 1, δ = 1e-9 gave a discrete δ 1.97× the target): σ is widened.
    from mechanisms.calibration import discrete_gaussian_delta

    cal = calibrate_query("gaussian", epsilon, delta, [sens(shift)])
    sigma2 = cal.noises[0].sigma2
    assert sigma2 is not None
    assert discrete_gaussian_delta(float(sigma2), shift, epsilon) <= delta
    assert float(cal.noises[0].scale) <= shift / analytic_gaussian_mu(epsilon, delta) * 1.02


def _brute_pair_delta(s2a: float, da: int, s2b: float, db: int, eps: float) -> float:
    import numpy as np

    z = np.arange(-80, 81, dtype=np.float64)
    pa, pb = np.exp(-(z**2) / (2 * s2a)), np.exp(-(z**2) / (2 * s2b))
    qa, qb = (
        np.exp(-((z - da) ** 2) / (2 * s2a)) / pa.sum(),
        np.exp(-((z - db) ** 2) / (2 * s2b)) / pb.sum(),
    )
    pa, pb = pa / pa.sum(), pb / pb.sum()
    return float(np.maximum(np.outer(pa, pb) - math.exp(eps) * np.outer(qa, qb), 0).sum())


@pytest.mark.parametrize(
    "args",
    [(1.3, 1, 2.2, 2, 0.5), (4.0, 1, 9.0, 3, 1.0), (0.8, 1, 0.8, 1, 2.0), (25.0, 2, 3.0, 1, 0.3)],
)
def test_pair_delta_matches_brute_force(args: tuple[float, int, float, int, float]) -> None:
    from mechanisms.calibration import discrete_gaussian_delta_pair

    assert discrete_gaussian_delta_pair(*args) == pytest.approx(_brute_pair_delta(*args), rel=1e-9)


@pytest.mark.parametrize("epsilon", [0.5, 2.0, 5.0])
@pytest.mark.parametrize("delta", [1e-5, 1e-9])
@pytest.mark.parametrize("shifts", [(1, 1), (1, 3), (1, 100)])
def test_avg_gaussian_meets_delta_for_the_discrete_noise(
    epsilon: float, delta: float, shifts: tuple[int, int]
) -> None:
    from mechanisms.calibration import discrete_gaussian_delta_pair

    cal = calibrate_query("gaussian", epsilon, delta, [sens(shifts[0]), sens(shifts[1])])
    s2 = [float(n.sigma2) for n in cal.noises if n.sigma2 is not None]
    assert discrete_gaussian_delta_pair(s2[0], shifts[0], s2[1], shifts[1], epsilon) <= delta


def test_discrete_delta_grows_with_the_shift() -> None:
    # Checking only the largest shift relies on this monotonicity.
    from mechanisms.calibration import discrete_gaussian_delta

    for s2 in (0.3, 1.0, 2.5, 7.0, 20.0):
        for eps in (0.1, 1.0, 3.0, 8.0):
            values = [discrete_gaussian_delta(s2, k, eps) for k in range(12)]
            assert all(b >= a - 1e-15 for a, b in itertools.pairwise(values))


# --- Private selection (permute-and-flip) ------------------------------------------------


def test_permute_and_flip_always_accepts_the_best_candidate_at_huge_epsilon() -> None:
    from mechanisms import permute_and_flip

    utilities = [Fraction(-5), Fraction(0), Fraction(-1)]
    # at ε = 100 a gap of 1 is accepted with probability e^-100: never in 200 draws
    assert {permute_and_flip(utilities, Fraction(100), Fraction(1)) for _ in range(200)} == {1}
    with pytest.raises(ValueError):
        permute_and_flip([], Fraction(1), Fraction(1))
    with pytest.raises(ValueError):
        permute_and_flip(utilities, Fraction(0), Fraction(1))


def test_choices_take_their_share_of_epsilon_and_never_more() -> None:
    from mechanisms import PrivacyCost, calibrate_with_choices

    cal = calibrate_with_choices("laplace", 0.3, 0.0, [sens(1), sens(1)], 1)
    (choice,) = cal.choices
    rest = sum(Fraction(1) / n.scale for n in cal.noises)  # ε of the two counts
    assert choice + rest <= Fraction(0.3) and choice >= Fraction(0.3) / 3
    assert cal.cost == PrivacyCost(0.3, 0.0, 0.3 * 0.3 / 2)
    # only choices: the whole ε goes to them
    only = calibrate_with_choices("laplace", 0.5, 0.0, [], 2)
    assert only.choices == (Fraction(0.5) / 2,) * 2 and only.noises == ()
    # only choices over selected groups: the selection gets its share, with δ
    grouped = calibrate_with_choices("gaussian", 1.0, 1e-6, [], 1, max_groups_per_unit=3)
    assert grouped.selection is not None and grouped.cost.selection_delta <= 1e-6
    with pytest.raises(ValueError):
        calibrate_with_choices("laplace", 1.0, 0.0, [], 1, max_groups_per_unit=3)


def test_a_centred_sum_moves_by_half_the_width_of_the_bounds() -> None:
    # age in [0, 100], whole numbers: c = 50 and each row moves Σ(x − 50) by ≤ 50
    assert grid_center(0, 100, Fraction(1)) == 50
    assert grid_sensitivity(0, 100, Fraction(1), 1, 50) == 50
    assert grid_sensitivity(0, 100, Fraction(1), 3, 50) == 150
    # uncentred it is max(|lower|, |upper|), as before
    assert grid_sensitivity(0, 100, Fraction(1), 1) == 100
    assert grid_sensitivity(-7, 3, Fraction(1), 1) == 7
    # bounds around 0 gain nothing: c = 0 there
    assert grid_center(-5, 5, Fraction(1)) == 0
    # a real column on its grid: every rounded value is within the bound of c
    res = grid_resolution(2.0, 20.0)
    c = grid_center(2.0, 20.0, res)
    bound = grid_sensitivity(2.0, 20.0, res, 1, c)
    for v in (2.0, 2.0 + float(res) / 2, 11.0, 20.0 - float(res) / 2, 20.0):
        for rounded in (math.floor(v / res), math.ceil(v / res)):
            assert abs(rounded - c) <= bound
    assert bound <= (Fraction(18) / 2) / res + 1
