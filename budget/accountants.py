"""Accountants: when may one more query be charged, and how much has been spent.

An accountant is a *privacy filter* (Rogers, Roth, Ullman, Vadhan 2016): given the
budget and the costs already charged, it admits a new cost only if the whole interaction,
with every query chosen adaptively from earlier answers and every cost itself chosen
adaptively, stays within the budget. Both accountants here are pure functions of
(budget, Σ charged costs, next cost); the ledger sums the costs from its append-only
entries and asks.

- ``zcdp``: admit iff Σρ ≤ ρ_B, where ρ_B is the largest ρ whose Canonne–Kamath–Steinke
  conversion fits (ε_B, δ_B − Σ selection δ). Valid under fully adaptive composition
  (Whitehouse, Ramdas, Rogers, Wu 2023, zCDP filter; Bun & Steinke 2016 for zCDP and
  its composition).
- ``pure``: admit iff Σε ≤ ε_B, Laplace (pure ε-DP) costs only (Rogers et al. 2016,
  basic-composition filter).

In both, the δ of DP partition selection (``PrivacyCost.selection_delta``) is added on
top: admitted iff Σ selection δ ≤ δ_B, and the zCDP conversion only gets what is left.

Floating point: costs are summed in the database, so comparisons allow a relative slack
of ``SLACK`` (1e-10) — far below the precision of any budget an admin types, and the
reason a budget of 0.3 admits three queries of ε = 0.1. The guarantee is therefore the
budget times (1 + 1e-10).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal, Protocol

from mechanisms.types import MechanismName, PrivacyCost

CompositionName = Literal["zcdp", "pure"]

SLACK = 1e-10

_GRID_LO = -25.0
_GRID_HI = 45.0
_GRID_STEP = 0.5
_GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0


def _cks_epsilon_at(t: float, rho: float, log_inv_delta: float) -> float:
    """The CKS ε bound at order α = 1 + eᵗ (parametrised so that α − 1 is never rounded)."""
    alpha_minus_1 = math.exp(t)
    log_alpha = math.log1p(alpha_minus_1)
    alpha = 1.0 + alpha_minus_1
    # αρ + (ln(1/δ) − ln α)/(α − 1) + ln(1 − 1/α),   ln(1 − 1/α) = ln(α−1) − ln α = t − ln α
    return alpha * rho + (log_inv_delta - log_alpha) / alpha_minus_1 + t - log_alpha


def cks_epsilon(rho: float, delta: float) -> float:
    """The smallest ε such that ρ-zCDP implies (ε, δ)-DP, by the CKS conversion.

    Canonne, Kamath, Steinke, "The Discrete Gaussian for Differential Privacy", NeurIPS
    2020, §2.3 (after Asoodeh et al. 2020): ρ-zCDP implies (ε, δ)-DP with

        δ = inf_{α>1} exp((α−1)(αρ−ε)) / (α−1) · (1 − 1/α)^α,

    equivalently ε = inf_{α>1} αρ + (ln(1/δ) − ln α)/(α − 1) + ln(1 − 1/α). This is never
    larger than the classic ρ + 2√(ρ ln(1/δ)) (Bun & Steinke 2016, Prop. 1.3).

    Returns 0 for ρ = 0 and ``math.inf`` for ρ > 0 when δ ≤ 0. The infimum over α is
    found by a grid over ln(α − 1) refined by golden-section search.
    """
    if rho < 0 or math.isnan(rho) or math.isnan(delta):
        raise ValueError("rho must be >= 0 and delta a number")
    if rho == 0:
        return 0.0
    if delta <= 0:
        return math.inf
    if delta >= 1:
        return 0.0
    log_inv_delta = -math.log(delta)
    best_t = _GRID_LO
    best = _cks_epsilon_at(best_t, rho, log_inv_delta)
    steps = round((_GRID_HI - _GRID_LO) / _GRID_STEP)
    for i in range(1, steps + 1):
        t = _GRID_LO + i * _GRID_STEP
        value = _cks_epsilon_at(t, rho, log_inv_delta)
        if value < best:
            best, best_t = value, t
    lo, hi = best_t - _GRID_STEP, best_t + _GRID_STEP
    x1 = hi - _GOLDEN * (hi - lo)
    x2 = lo + _GOLDEN * (hi - lo)
    f1 = _cks_epsilon_at(x1, rho, log_inv_delta)
    f2 = _cks_epsilon_at(x2, rho, log_inv_delta)
    for _ in range(60):
        if f1 < f2:
            hi, x2, f2 = x2, x1, f1
            x1 = hi - _GOLDEN * (hi - lo)
            f1 = _cks_epsilon_at(x1, rho, log_inv_delta)
        else:
            lo, x1, f1 = x1, x2, f2
            x2 = lo + _GOLDEN * (hi - lo)
            f2 = _cks_epsilon_at(x2, rho, log_inv_delta)
    return max(0.0, min(best, f1, f2))


@lru_cache(maxsize=4096)
def zcdp_rho_budget(epsilon: float, delta: float) -> float:
    """The largest ρ such that ρ-zCDP implies (ε, δ)-DP by the CKS conversion.

    ``cks_epsilon`` is increasing in ρ, so this is found by bisection; the lower end of
    the final bracket is returned, so ``cks_epsilon(result, delta) <= epsilon`` (never an
    over-estimate of the budget beyond the search's float precision).
    """
    if epsilon <= 0 or delta <= 0:
        return 0.0
    if delta >= 1:
        return math.inf
    lo, hi = 0.0, max(epsilon, 1e-12)
    while cks_epsilon(hi, delta) <= epsilon:
        lo, hi = hi, hi * 2.0
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if mid <= lo or mid >= hi:
            break
        if cks_epsilon(mid, delta) <= epsilon:
            lo = mid
        else:
            hi = mid
    return lo


@dataclass(frozen=True)
class Accounting:
    """What an accountant reports for one budget and the costs charged against it.

    Under ``zcdp`` ``epsilon_spent`` is the CKS ε of Σρ at the δ left after partition
    selection, and ``delta_spent`` is the partition-selection δ; under ``pure`` they are
    Σε and the partition-selection δ. ``max_next_laplace_epsilon`` is the largest ε one
    more Laplace query (without partition selection) could still be charged.
    ``epsilon_spent`` is ``math.inf`` only if an admin lowered δ_B below the δ already
    spent on partition selection.
    """

    composition: CompositionName
    epsilon: float
    delta: float
    epsilon_spent: float
    delta_spent: float
    epsilon_remaining: float
    delta_remaining: float
    rho_budget: float
    rho_spent: float
    rho_remaining: float
    max_next_laplace_epsilon: float


class Accountant(Protocol):
    """A privacy filter over (budget, Σ charged costs)."""

    name: CompositionName

    def refusal(
        self,
        epsilon: float,
        delta: float,
        spent: PrivacyCost,
        cost: PrivacyCost,
        mechanism: MechanismName | str,
    ) -> str | None:
        """None if ``cost`` may be charged on top of ``spent``, else why not."""
        ...

    def report(self, epsilon: float, delta: float, spent: PrivacyCost) -> Accounting:
        """The spent / remaining figures for ``spent`` against the budget (ε, δ)."""
        ...


def _fits(total: float, budget: float) -> bool:
    return total <= budget * (1.0 + SLACK)


class ZcdpFilter:
    """The zCDP privacy filter, reported and budgeted in (ε, δ) through the CKS conversion.

    Guarantee: if every charged release i is ρᵢ-zCDP conditionally on the earlier
    answers (ρᵢ itself chosen adaptively) and charges stop once Σρᵢ would exceed ρ_B,
    the whole interaction is ρ_B-zCDP (Whitehouse, Ramdas, Rogers, Wu, "Fully adaptive
    composition in differential privacy", ICML 2023; equivalently, at every Rényi order
    α this is the Rényi filter of Feldman & Zrnic, NeurIPS 2021; zCDP and its
    composition: Bun & Steinke, TCC 2016). ρ_B-zCDP implies (ε_B, δ_B − Σδ_sel)-DP by the
    CKS conversion, and the partition-selection δ's add (basic composition of the δ
    part). Laplace(ε) is ε²/2-zCDP (Bun & Steinke 2016, Prop. 1.4); the Gaussian cost
    is Δ₂²/(2σ²). The Gaussian's nominal (ε, δ) is not used.
    """

    name: CompositionName = "zcdp"

    def refusal(
        self,
        epsilon: float,
        delta: float,
        spent: PrivacyCost,
        cost: PrivacyCost,
        mechanism: MechanismName | str,
    ) -> str | None:
        selection = spent.selection_delta + cost.selection_delta
        if not _fits(selection, delta):
            return "its partition-selection δ exceeds the δ remaining"
        rho = spent.rho + cost.rho
        if rho > 0 and not _fits(rho, zcdp_rho_budget(epsilon, delta - selection)):
            return "its ρ exceeds the ρ remaining"
        return None

    def report(self, epsilon: float, delta: float, spent: PrivacyCost) -> Accounting:
        delta_available = delta - spent.selection_delta
        rho_budget = zcdp_rho_budget(epsilon, delta_available)
        epsilon_spent = cks_epsilon(spent.rho, delta_available)
        rho_remaining = max(0.0, rho_budget - spent.rho)
        return Accounting(
            composition=self.name,
            epsilon=epsilon,
            delta=delta,
            epsilon_spent=epsilon_spent,
            delta_spent=spent.selection_delta,
            epsilon_remaining=max(0.0, epsilon - epsilon_spent),
            delta_remaining=max(0.0, delta_available),
            rho_budget=rho_budget,
            rho_spent=spent.rho,
            rho_remaining=rho_remaining,
            max_next_laplace_epsilon=math.sqrt(2.0 * rho_remaining),
        )


class PureFilter:
    """The pure-DP (basic composition) privacy filter; Laplace costs only.

    Guarantee: if every charged release i is εᵢ-DP conditionally on the earlier answers
    (εᵢ chosen adaptively) and charges stop once Σεᵢ would exceed ε_B, the interaction is
    ε_B-DP (Rogers, Roth, Ullman, Vadhan, "Privacy odometers and filters", NeurIPS 2016,
    basic-composition filter). Partition selection adds its δ's: (ε_B, Σδ_sel)-DP.
    Gaussian releases are not ε-DP for any finite ε, so they are refused.
    """

    name: CompositionName = "pure"

    def refusal(
        self,
        epsilon: float,
        delta: float,
        spent: PrivacyCost,
        cost: PrivacyCost,
        mechanism: MechanismName | str,
    ) -> str | None:
        if not _fits(spent.selection_delta + cost.selection_delta, delta):
            return "its partition-selection δ exceeds the δ remaining"
        if not _fits(spent.epsilon + cost.epsilon, epsilon):
            return "its ε exceeds the ε remaining"
        return None

    def report(self, epsilon: float, delta: float, spent: PrivacyCost) -> Accounting:
        epsilon_remaining = max(0.0, epsilon - spent.epsilon)
        rho_budget = epsilon * epsilon / 2.0
        return Accounting(
            composition=self.name,
            epsilon=epsilon,
            delta=delta,
            epsilon_spent=spent.epsilon,
            delta_spent=spent.selection_delta,
            epsilon_remaining=epsilon_remaining,
            delta_remaining=max(0.0, delta - spent.selection_delta),
            rho_budget=rho_budget,
            rho_spent=spent.rho,
            rho_remaining=max(0.0, rho_budget - spent.rho),
            max_next_laplace_epsilon=epsilon_remaining,
        )


def is_pure(cost: PrivacyCost, mechanism: MechanismName | str) -> bool:
    """Whether a cost is pure ε-DP (a Laplace release; no nominal δ)."""
    return mechanism != "gaussian" and cost.delta == 0


def accountant(composition: CompositionName) -> Accountant:
    """The accountant for a composition name."""
    if composition == "zcdp":
        return ZcdpFilter()
    if composition == "pure":
        return PureFilter()
    raise ValueError(f"unknown composition {composition!r} (expected 'zcdp' or 'pure')")
