"""Accountants: when may one more query be charged, and how much has been spent.

An accountant is a *privacy filter* (Rogers, Roth, Ullman, Vadhan 2016): given the
budget and the costs already charged, it admits a new cost only if the whole interaction,
with every query chosen adaptively from earlier answers and every cost itself chosen
adaptively, stays within the budget. Every accountant here is a pure function of
(budget, Σ charged costs, next cost); the ledger sums the costs from its append-only
entries and asks.

A budget (ε_B, δ_B) keeps two totals of what was charged:

- the **basic-composition total** (Σε, Σ selection δ). It applies while every query
  charged was ε-DP, or (ε, δ)-DP through partition selection (discrete Laplace, with or
  without partition selection); one Gaussian query ends it (``Spent.non_pure``).
- the **zCDP total** Σρ, converted to ε by Canonne–Kamath–Steinke at the conversion δ
  δ_conv = δ_B − δ_sel (Bun & Steinke 2016 for zCDP; Whitehouse, Ramdas, Rogers, Wu 2023
  and Feldman & Zrnic 2021 for its fully adaptive filter). It applies always.

The δ budget is split once, ahead of any query: partition selection may spend at most
δ_sel = ``selection_share``·δ_B in total, and the zCDP conversion gets the rest. The
split is fixed (not taken from the selection δ spent so far) because the guarantee must
hold under full adaptivity: see docs/accounting.md, "Why the guarantees hold".

Compositions:

- ``combined`` (default): admit iff Σ selection δ ≤ δ_sel and (the basic total fits,
  Σε ≤ ε_B with no Gaussian charged, **or** the zCDP total fits, Σρ ≤ ρ_B). Report the
  smaller ε. Valid, with the budget's full (ε_B, δ_B), under full adaptivity
  (docs/accounting.md gives the proof).
- ``zcdp``: the zCDP total alone: admit iff Σ selection δ ≤ δ_sel and Σρ ≤ ρ_B.
- ``pure``: the basic total alone, Laplace only: admit iff Σε ≤ ε_B and Σ selection
  δ ≤ δ_B (no conversion: selection may use all of δ_B).

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

CompositionName = Literal["combined", "zcdp", "pure"]
COMPOSITIONS: tuple[CompositionName, ...] = ("combined", "zcdp", "pure")
Basis = Literal["basic", "zcdp"]

SLACK = 1e-10
# The share of δ_B that partition selection may spend (the zCDP conversion gets the rest).
DEFAULT_SELECTION_SHARE = 0.5
# What ``queries_remaining`` reports as "no limit from this budget".
_MANY = 10**12
CONVERSION_CACHE = 1024
"""ρ ↔ ε conversions remembered (``cks_epsilon``, ``zcdp_rho_budget``). Each charge asks
``cks_epsilon`` for its analyst's total before and after it, and the total before is the
one the analyst's previous charge computed after; totals are new with every charge, so a
larger cache only grows (one entry per charge) without serving more hits (issue 36)."""

_GRID_LO = -25.0
_GRID_HI = 45.0
# A coarse grid finds the basin, golden-section search its bottom: the bound is unimodal
# in ln(α − 1) (checked on 20,000 random (ρ, δ), ρ ∈ [1e-10, 1e5], δ ∈ [1e-20, 0.5], at a
# step of 0.05), and 47 golden steps shrink the bracket of 2 × 2.5 below 1e-9: 78
# evaluations instead of the 203 of a 0.5-step grid and 60 steps (each charge converts
# twice; 46 → 17 µs a conversion).
_GRID_STEP = 2.5
_GOLDEN_STEPS = 47
_GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0


def _cks_epsilon_at(t: float, rho: float, log_inv_delta: float) -> float:
    """The CKS ε bound at order α = 1 + eᵗ (parametrised so that α − 1 is never rounded)."""
    alpha_minus_1 = math.exp(t)
    log_alpha = math.log1p(alpha_minus_1)
    alpha = 1.0 + alpha_minus_1
    # αρ + (ln(1/δ) − ln α)/(α − 1) + ln(1 − 1/α),   ln(1 − 1/α) = ln(α−1) − ln α = t − ln α
    return alpha * rho + (log_inv_delta - log_alpha) / alpha_minus_1 + t - log_alpha


@lru_cache(maxsize=CONVERSION_CACHE)  # each charge reports the budget before and after it
def cks_epsilon(rho: float, delta: float) -> float:
    """The smallest ε such that ρ-zCDP implies (ε, δ)-DP, by the CKS conversion.

    Canonne, Kamath, Steinke, "The Discrete Gaussian for Differential Privacy", NeurIPS
    2020, §2.3 (after Asoodeh et al. 2020): ρ-zCDP implies (ε, δ)-DP with

        δ = inf_{α>1} exp((α−1)(αρ−ε)) / (α−1) · (1 − 1/α)^α,

    equivalently ε = inf_{α>1} αρ + (ln(1/δ) − ln α)/(α − 1) + ln(1 − 1/α). This is never
    larger than the classic ρ + 2√(ρ ln(1/δ)) (Bun & Steinke 2016, Prop. 1.3).

    Returns 0 for ρ = 0 and ``math.inf`` for ρ > 0 when δ ≤ 0. The infimum over α is
    found by a coarse grid over ln(α − 1) refined by golden-section search. Whatever the
    search finds, the value returned is the bound at an order it evaluated, so it is
    sound (never below the true infimum); the search makes it tight.
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
    for _ in range(_GOLDEN_STEPS):
        if f1 < f2:
            hi, x2, f2 = x2, x1, f1
            x1 = hi - _GOLDEN * (hi - lo)
            f1 = _cks_epsilon_at(x1, rho, log_inv_delta)
        else:
            lo, x1, f1 = x1, x2, f2
            x2 = lo + _GOLDEN * (hi - lo)
            f2 = _cks_epsilon_at(x2, rho, log_inv_delta)
    return max(0.0, min(best, f1, f2))


@lru_cache(maxsize=CONVERSION_CACHE)
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
class Spent:
    """Σ over the live (charged, not refunded) costs of one budget in its current period.

    ``non_pure`` counts live charges that are neither ε-DP nor (ε, δ)-DP through
    partition selection — Gaussian queries: while it is 0 the basic-composition total
    (Σε, Σ selection δ) applies. ``delta`` is Σ of the Gaussians' nominal δ (not used by
    any accountant).
    """

    epsilon: float = 0.0
    delta: float = 0.0
    rho: float = 0.0
    selection_delta: float = 0.0
    non_pure: int = 0

    @staticmethod
    def of(cost: PrivacyCost | Spent, mechanism: MechanismName | str | None = None) -> Spent:
        """A ``Spent`` from one cost (or a Σ of costs given as a ``PrivacyCost``).

        A ``PrivacyCost`` counts as non-pure if ``mechanism`` is ``gaussian`` or, when no
        mechanism is given, if it carries a nominal δ (only Gaussian costs do).
        """
        if isinstance(cost, Spent):
            return cost
        gaussian = mechanism == "gaussian" or (mechanism is None and cost.delta > 0)
        return Spent(cost.epsilon, cost.delta, cost.rho, cost.selection_delta, int(gaussian))

    def plus(self, cost: PrivacyCost, mechanism: MechanismName | str, times: int = 1) -> Spent:
        """This total with ``times`` more charges of ``cost``."""
        extra = Spent.of(cost, mechanism)
        return Spent(
            self.epsilon + times * extra.epsilon,
            self.delta + times * extra.delta,
            self.rho + times * extra.rho,
            self.selection_delta + times * extra.selection_delta,
            self.non_pure + times * extra.non_pure,
        )

    @property
    def cost(self) -> PrivacyCost:
        return PrivacyCost(self.epsilon, self.delta, self.rho, self.selection_delta)


@dataclass(frozen=True)
class Accounting:
    """What an accountant reports for one budget and the costs charged against it.

    ``epsilon_spent`` is the smallest ε of the totals that apply: ``epsilon_spent_basic``
    (Σε; ``math.inf`` once a Gaussian query was charged) and ``epsilon_spent_zcdp`` (the
    CKS ε of Σρ at the conversion δ); ``basis`` says which one it is. Under ``pure`` only
    the basic total is used, under ``zcdp`` only the zCDP one. ``delta_spent`` is Σ
    selection δ, against ``selection_delta_budget`` (δ_sel). ``max_next_laplace_epsilon``
    is the largest ε one more Laplace query (without partition selection) could still be
    charged.
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
    basis: Basis
    epsilon_spent_basic: float
    epsilon_spent_zcdp: float
    selection_delta_budget: float


class Accountant(Protocol):
    """A privacy filter over (budget, Σ charged costs)."""

    name: CompositionName

    def refusal(
        self,
        epsilon: float,
        delta: float,
        spent: PrivacyCost | Spent,
        cost: PrivacyCost,
        mechanism: MechanismName | str,
    ) -> str | None:
        """None if ``cost`` may be charged on top of ``spent``, else why not."""
        ...

    def report(self, epsilon: float, delta: float, spent: PrivacyCost | Spent) -> Accounting:
        """The spent / remaining figures for ``spent`` against the budget (ε, δ)."""
        ...

    def queries_remaining(
        self,
        epsilon: float,
        delta: float,
        spent: PrivacyCost | Spent,
        cost: PrivacyCost,
        mechanism: MechanismName | str,
    ) -> int:
        """How many more charges of ``cost``, one after the other, the filter admits."""
        ...


def _fits(total: float, budget: float) -> bool:
    return total <= budget * (1.0 + SLACK)


def is_pure(cost: PrivacyCost, mechanism: MechanismName | str) -> bool:
    """Whether a cost is ε-DP up to partition selection (a Laplace release; no nominal δ)."""
    return mechanism != "gaussian" and cost.delta == 0


class _Filter:
    """The two totals, their budgets, and the rules of one composition (see the module)."""

    name: CompositionName
    uses_basic: bool
    uses_zcdp: bool

    def __init__(self, selection_share: float = DEFAULT_SELECTION_SHARE) -> None:
        if not (math.isfinite(selection_share) and 0 <= selection_share < 1):
            raise ValueError("the selection share of δ must be in [0, 1)")
        self.selection_share = selection_share

    # -- the budgets ----------------------------------------------------------------------

    def selection_budget(self, delta: float) -> float:
        """δ_sel: the Σ selection δ this budget admits."""
        return delta * self.selection_share if self.uses_zcdp else delta

    def conversion_delta(self, delta: float) -> float:
        """δ_conv = δ_B − δ_sel: the δ at which Σρ is converted to ε."""
        return delta - self.selection_budget(delta)

    def rho_budget(self, epsilon: float, delta: float) -> float:
        """ρ_B: the largest ρ whose CKS conversion at δ_conv is at most ε_B."""
        if not self.uses_zcdp:
            return epsilon * epsilon / 2.0  # what an ε_B-DP interaction implies
        return zcdp_rho_budget(epsilon, self.conversion_delta(delta))

    # -- the rules ------------------------------------------------------------------------

    def _basic_fits(self, epsilon: float, total: Spent) -> bool:
        # Under ``pure`` alone a Gaussian charge (from a ledger once run under zcdp) counts
        # its nominal ε (docs/accounting.md, caveats); with zCDP at hand it ends the total.
        pure_so_far = total.non_pure == 0 or not self.uses_zcdp
        return self.uses_basic and pure_so_far and _fits(total.epsilon, epsilon)

    def _zcdp_fits(self, epsilon: float, delta: float, total: Spent) -> bool:
        if not self.uses_zcdp:
            return False
        return total.rho <= 0 or _fits(total.rho, self.rho_budget(epsilon, delta))

    def _admits(self, epsilon: float, delta: float, total: Spent) -> bool:
        if not _fits(total.selection_delta, self.selection_budget(delta)):
            return False
        return self._basic_fits(epsilon, total) or self._zcdp_fits(epsilon, delta, total)

    def refusal(
        self,
        epsilon: float,
        delta: float,
        spent: PrivacyCost | Spent,
        cost: PrivacyCost,
        mechanism: MechanismName | str,
    ) -> str | None:
        total = Spent.of(spent).plus(cost, mechanism)
        if not _fits(total.selection_delta, self.selection_budget(delta)):
            return "its partition-selection δ exceeds the δ remaining"
        if self._basic_fits(epsilon, total) or self._zcdp_fits(epsilon, delta, total):
            return None
        if not self.uses_zcdp:
            return "its ε exceeds the ε remaining"
        if not self.uses_basic:
            return "its ρ exceeds the ρ remaining"
        if total.non_pure:
            return (
                "its ρ exceeds the ρ remaining, and basic composition no longer applies "
                "(a Gaussian query was charged)"
            )
        return "its ε exceeds the ε remaining under both basic composition and zCDP"

    def report(self, epsilon: float, delta: float, spent: PrivacyCost | Spent) -> Accounting:
        s = Spent.of(spent)
        basic = s.epsilon if s.non_pure == 0 or not self.uses_zcdp else math.inf
        rho_budget = self.rho_budget(epsilon, delta)
        rho_remaining = max(0.0, rho_budget - s.rho)
        zcdp = cks_epsilon(s.rho, self.conversion_delta(delta)) if self.uses_zcdp else math.inf
        if not self.uses_basic:
            basic_shown, spent_eps, basis = math.inf, zcdp, "zcdp"
        elif not self.uses_zcdp:
            basic_shown, spent_eps, basis = basic, basic, "basic"
        else:
            basic_shown = basic
            spent_eps, basis = (basic, "basic") if basic <= zcdp else (zcdp, "zcdp")
        next_laplace = 0.0
        if self.uses_basic and (s.non_pure == 0 or not self.uses_zcdp):
            next_laplace = max(0.0, epsilon - s.epsilon)
        if self.uses_zcdp:
            next_laplace = max(next_laplace, math.sqrt(2.0 * rho_remaining))
        selection_budget = self.selection_budget(delta)
        return Accounting(
            composition=self.name,
            epsilon=epsilon,
            delta=delta,
            epsilon_spent=spent_eps,
            delta_spent=s.selection_delta,
            epsilon_remaining=max(0.0, epsilon - spent_eps),
            delta_remaining=max(0.0, selection_budget - s.selection_delta),
            rho_budget=rho_budget,
            rho_spent=s.rho,
            rho_remaining=rho_remaining,
            max_next_laplace_epsilon=next_laplace,
            basis=basis,  # type: ignore[arg-type]
            epsilon_spent_basic=basic_shown,
            epsilon_spent_zcdp=zcdp,
            selection_delta_budget=selection_budget,
        )

    def queries_remaining(
        self,
        epsilon: float,
        delta: float,
        spent: PrivacyCost | Spent,
        cost: PrivacyCost,
        mechanism: MechanismName | str,
    ) -> int:
        """How many more charges of ``cost``, one after the other, the filter admits.

        Every rule is a bound on a total that grows with each charge, so the charges
        admitted are a prefix: the answer is found by doubling and bisection on the rule
        itself (at most ``10**12``, meaning "no limit from this budget").
        """
        s = Spent.of(spent)

        def admits(n: int) -> bool:
            return self._admits(epsilon, delta, s.plus(cost, mechanism, n))

        if not admits(1):
            return 0
        lo, hi = 1, 2
        while admits(hi):
            lo, hi = hi, hi * 2
            if hi > _MANY:
                return _MANY
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if admits(mid):
                lo = mid
            else:
                hi = mid
        return lo


class CombinedFilter(_Filter):
    """Both totals: admit when the basic-composition total **or** the zCDP total fits.

    Guarantee (docs/accounting.md, proved there under full adaptivity): every charged
    release i is εᵢ-DP, or (εᵢ, δᵢ)-DP through partition selection (Laplace), or
    ρᵢ-zCDP (Gaussian), conditionally on the earlier answers, with its parameters chosen
    adaptively; charges stop once Σ selection δ would exceed δ_sel = share·δ_B, or once
    *neither* Σεᵢ ≤ ε_B (with no Gaussian charged) *nor* Σρᵢ ≤ ρ_B would hold. Then the
    whole interaction is (ε_B, δ_B)-DP: the pure parts' loss is bounded by Σεᵢ on the
    event the basic total fits, the zCDP filter (Whitehouse, Ramdas, Rogers, Wu 2023;
    Feldman & Zrnic 2021) bounds it elsewhere, and partition selection's δ's (at most
    δ_sel) add to the conversion's δ_B − δ_sel.
    """

    name: CompositionName = "combined"
    uses_basic = True
    uses_zcdp = True


class ZcdpFilter(_Filter):
    """The zCDP privacy filter, reported and budgeted in (ε, δ) through the CKS conversion.

    Guarantee: if every charged release i is ρᵢ-zCDP conditionally on the earlier
    answers (ρᵢ itself chosen adaptively) and charges stop once Σρᵢ would exceed ρ_B,
    the whole interaction is ρ_B-zCDP (Whitehouse, Ramdas, Rogers, Wu, "Fully adaptive
    composition in differential privacy", ICML 2023; equivalently, at every Rényi order
    α this is the Rényi filter of Feldman & Zrnic, NeurIPS 2021; zCDP and its
    composition: Bun & Steinke, TCC 2016). ρ_B-zCDP implies (ε_B, δ_B − δ_sel)-DP by the
    CKS conversion, and the partition-selection δ's, capped at δ_sel, add. Laplace(ε) is
    ε²/2-zCDP (Bun & Steinke 2016, Prop. 1.4); the Gaussian cost is Δ₂²/(2σ²). The
    Gaussian's nominal (ε, δ) is not used.
    """

    name: CompositionName = "zcdp"
    uses_basic = False
    uses_zcdp = True


class PureFilter(_Filter):
    """The basic-composition privacy filter; Laplace costs only.

    Guarantee: if every charged release i is εᵢ-DP, or (εᵢ, δᵢ)-DP through partition
    selection, conditionally on the earlier answers (εᵢ, δᵢ chosen adaptively) and
    charges stop once Σεᵢ would exceed ε_B or Σδᵢ would exceed δ_B, the interaction is
    (ε_B, δ_B)-DP (Rogers, Roth, Ullman, Vadhan, "Privacy odometers and filters", NeurIPS
    2016, basic-composition filter). Gaussian releases are not ε-DP for any finite ε, so
    the ledger refuses them.
    """

    name: CompositionName = "pure"
    uses_basic = True
    uses_zcdp = False


def accountant(
    composition: CompositionName, selection_share: float = DEFAULT_SELECTION_SHARE
) -> Accountant:
    """The accountant for a composition name."""
    if composition == "combined":
        return CombinedFilter(selection_share)
    if composition == "zcdp":
        return ZcdpFilter(selection_share)
    if composition == "pure":
        return PureFilter(selection_share)
    raise ValueError(f"unknown composition {composition!r} (expected 'combined', 'zcdp' or 'pure')")
