"""The accountants against independently computed values.

The CKS conversion is recomputed here from its δ form (the paper's statement) with scipy's
bounded scalar minimiser and Brent's root finder — a different formula, parametrisation
and optimiser from budget.accountants, which minimises the ε form over ln(α − 1).
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import optimize

from budget import PureFilter, ZcdpFilter, cks_epsilon, zcdp_rho_budget
from mechanisms.types import PrivacyCost


def scipy_cks_log_delta(rho: float, epsilon: float) -> float:
    """ln δ, δ = inf_{α>1} exp((α−1)(αρ−ε)) / (α−1) · (1 − 1/α)^α  (CKS 2020, §2.3)."""

    def log_delta(alpha: float) -> float:
        return (
            (alpha - 1) * (alpha * rho - epsilon)
            - math.log(alpha - 1)
            + alpha * math.log1p(-1 / alpha)
        )

    # A coarse scan over α = 1 + 10^u, then scipy's bounded Brent search around the best.
    grid = [1.0 + 10.0 ** (u / 20.0) for u in range(-300, 301)]
    values = [log_delta(a) for a in grid]
    i = min(range(len(grid)), key=values.__getitem__)
    lo, hi = grid[max(0, i - 1)], grid[min(len(grid) - 1, i + 1)]
    res = optimize.minimize_scalar(
        log_delta, bounds=(lo, hi), method="bounded", options={"xatol": 1e-12 * hi}
    )
    best = min(values[i], float(res.fun))
    return min(0.0, best)


def scipy_cks_epsilon(rho: float, delta: float) -> float:
    return float(
        optimize.brentq(
            lambda e: scipy_cks_log_delta(rho, e) - math.log(delta),
            1e-12,
            rho + 2 * math.sqrt(rho * math.log(1 / delta)) + 1,
            xtol=1e-13,
        )
    )


def test_acceptance_value_100_laplace_queries() -> None:
    # 100 Laplace(ε = 0.1) queries: ρ = 100 · 0.1²/2 = 0.5, at δ = 1e-6.
    eps = cks_epsilon(100 * 0.1**2 / 2, 1e-6)
    assert eps == pytest.approx(scipy_cks_epsilon(0.5, 1e-6), rel=1e-7)
    assert 5.2 < eps < 5.25
    assert eps < 0.5 + 2 * math.sqrt(0.5 * math.log(1e6))  # 5.7565, Bun–Steinke bound
    assert eps < 10.0  # basic composition


@pytest.mark.parametrize(
    ("rho", "delta"),
    [
        (1e-6, 1e-9),
        (0.005, 1e-6),
        (0.05, 1e-5),
        (0.5, 1e-6),
        (1.0, 1e-10),
        (4.0, 1e-3),
        (50.0, 1e-6),
    ],
)
def test_cks_epsilon_matches_scipy(rho: float, delta: float) -> None:
    assert cks_epsilon(rho, delta) == pytest.approx(scipy_cks_epsilon(rho, delta), rel=1e-7)


@settings(max_examples=60, deadline=None)
@given(
    rho=st.floats(min_value=1e-8, max_value=100.0),
    log10_delta=st.floats(min_value=-15.0, max_value=-1.0),
)
def test_cks_is_a_valid_conversion_and_tighter_than_the_classic_bound(
    rho: float, log10_delta: float
) -> None:
    delta = 10.0**log10_delta
    eps = cks_epsilon(rho, delta)
    # The δ the paper's formula gives at our ε is within the target (up to the search).
    assert scipy_cks_log_delta(rho, eps * (1 + 1e-9) + 1e-12) <= math.log(delta) + 1e-6
    assert eps <= rho + 2 * math.sqrt(rho * math.log(1 / delta)) + 1e-12


def test_cks_edge_cases() -> None:
    assert cks_epsilon(0.0, 1e-6) == 0.0
    assert cks_epsilon(0.1, 0.0) == math.inf
    with pytest.raises(ValueError):
        cks_epsilon(-1.0, 1e-6)


@pytest.mark.parametrize(
    ("epsilon", "delta"), [(0.1, 1e-9), (1.0, 1e-6), (5.22, 1e-6), (10.0, 1e-5)]
)
def test_rho_budget_is_the_largest_rho_that_fits(epsilon: float, delta: float) -> None:
    rho_b = zcdp_rho_budget(epsilon, delta)
    assert scipy_cks_epsilon(rho_b, delta) <= epsilon * (1 + 1e-7)
    assert scipy_cks_epsilon(rho_b * (1 + 1e-5), delta) > epsilon


def test_rho_budget_matches_the_acceptance_value() -> None:
    # ε_B = CKS(0.5, 1e-6) must buy exactly ρ = 0.5, i.e. 100 queries of ε = 0.1.
    assert zcdp_rho_budget(cks_epsilon(0.5, 1e-6), 1e-6) == pytest.approx(0.5, rel=1e-9)


def laplace(eps: float) -> PrivacyCost:
    return PrivacyCost(eps, 0.0, eps * eps / 2)


def count_admitted(
    acc: ZcdpFilter | PureFilter, epsilon: float, delta: float, cost: PrivacyCost
) -> int:
    spent, n = PrivacyCost.zero(), 0
    while acc.refusal(epsilon, delta, spent, cost, "laplace") is None:
        spent, n = spent + cost, n + 1
        assert n < 100_000
    return n


def test_zcdp_filter_admits_exactly_the_queries_that_fit() -> None:
    # With no δ set aside for partition selection, the conversion uses all of δ_B ...
    eps_b = cks_epsilon(100 * 0.005, 1e-6) * (1 + 1e-12)
    assert count_admitted(ZcdpFilter(selection_share=0.0), eps_b, 1e-6, laplace(0.1)) == 100
    report = ZcdpFilter(selection_share=0.0).report(eps_b, 1e-6, PrivacyCost(10.0, 0.0, 0.5))
    assert report.epsilon_spent == pytest.approx(5.2215, abs=1e-3)
    assert report.max_next_laplace_epsilon == pytest.approx(0.0, abs=1e-5)
    # ... by default half of δ_B is partition selection's, and Σρ is converted at the rest.
    eps_b = cks_epsilon(100 * 0.005, 5e-7) * (1 + 1e-12)
    assert count_admitted(ZcdpFilter(), eps_b, 1e-6, laplace(0.1)) == 100
    assert ZcdpFilter().report(eps_b, 1e-6, PrivacyCost(10.0, 0.0, 0.5)).epsilon_spent == (
        pytest.approx(cks_epsilon(0.5, 5e-7))
    )


def test_zcdp_reports_the_largest_next_laplace_query() -> None:
    acc = ZcdpFilter()
    spent = PrivacyCost(0.3, 0.0, 0.03)
    report = acc.report(2.0, 1e-6, spent)
    nxt = report.max_next_laplace_epsilon
    assert acc.refusal(2.0, 1e-6, spent, laplace(nxt * (1 - 1e-9)), "laplace") is None
    assert acc.refusal(2.0, 1e-6, spent, laplace(nxt * (1 + 1e-6)), "laplace") is not None
    assert report.rho_budget == pytest.approx(zcdp_rho_budget(2.0, 5e-7))


def test_zcdp_selection_delta_has_a_fixed_share_of_the_delta_budget() -> None:
    acc = ZcdpFilter(selection_share=0.4)
    # Σρ is converted at δ_B − 0.4 δ_B, whatever partition selection spent so far ...
    for sel in (0.0, 2e-7, 4e-7):
        report = acc.report(1.0, 1e-6, PrivacyCost(0.0, 0.0, 0.01, sel))
        assert report.epsilon_spent == pytest.approx(cks_epsilon(0.01, 6e-7))
        assert report.rho_budget == pytest.approx(zcdp_rho_budget(1.0, 6e-7))
        assert report.delta_spent == sel
        assert report.delta_remaining == pytest.approx(4e-7 - sel)
    # ... and a query whose selection δ does not fit in 0.4 δ_B is refused whatever its ρ.
    cost = PrivacyCost(0.01, 0.0, 0.00005, 2e-7)
    assert acc.refusal(1.0, 1e-6, PrivacyCost(0.0, 0.0, 0.0, 2e-7), cost, "laplace") is None
    assert acc.refusal(1.0, 1e-6, PrivacyCost(0.0, 0.0, 0.0, 3e-7), cost, "laplace") is not None


def test_gaussian_cost_is_accounted_by_rho_under_zcdp() -> None:
    gaussian = PrivacyCost(epsilon=1.0, delta=1e-7, rho=0.02)
    spent = PrivacyCost.zero()
    assert ZcdpFilter().refusal(1.0, 1e-6, spent, gaussian, "gaussian") is None
    assert ZcdpFilter().report(1.0, 1e-6, gaussian).epsilon_spent == pytest.approx(
        cks_epsilon(0.02, 5e-7)
    )


def test_pure_filter_is_basic_composition() -> None:
    assert count_admitted(PureFilter(), 1.0, 0.0, laplace(0.1)) == 10
    assert count_admitted(PureFilter(), 0.3, 0.0, laplace(0.1)) == 3  # float slack
    report = PureFilter().report(1.0, 0.0, PrivacyCost(0.25, 0.0, 0.25**2 / 2))
    assert report.epsilon_spent == 0.25
    assert report.max_next_laplace_epsilon == 0.75


def test_pure_filter_refuses_selection_delta_beyond_budget() -> None:
    cost = PrivacyCost(0.1, 0.0, 0.005, 1e-7)
    assert PureFilter().refusal(1.0, 0.0, PrivacyCost.zero(), cost, "laplace") is not None
    assert PureFilter().refusal(1.0, 1e-7, PrivacyCost.zero(), cost, "laplace") is None
