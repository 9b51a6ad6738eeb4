"""Private selection: permute-and-flip over a finite candidate set, and DP quantiles.

A quantile is released by *choosing* one bucket of a public grid (fixed by the declared
bounds, never by the data) whose exact cumulative counts the database computed. The
choice is made by the permute-and-flip mechanism (McKenna & Sheldon, "Permute-and-Flip: A
new mechanism for differentially private selection", NeurIPS 2020): visit the candidates
in a uniformly random order and stop at the first one accepted, candidate j being
accepted with probability exp(−ε·(u* − u_j) / (2Δ)), where u* is the best utility.

Every decision is exact: the order is a Fisher–Yates shuffle driven by
``secrets.randbelow`` and each acceptance is one exact Bernoulli(exp(−γ)) draw for the
rational γ = ε·(u* − u_j)/(2Δ) (``mechanisms.exact.bernoulli_exp_neg``, the same lazy
comparison the discrete Laplace and Gaussian samplers use). No floating point is involved.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Sequence
from fractions import Fraction

from mechanisms.calibration import (
    _check_delta,
    _check_epsilon,
    _check_groups,
    _partition_selection,
    calibrate_query,
)
from mechanisms.exact import bernoulli_exp_neg
from mechanisms.types import MechanismName, PrivacyCost, QueryCalibration, Sensitivity

#: One-sided coverage of the rank intervals the gateway reports.
RANK_COVERAGE = Fraction(95, 100)


def permute_and_flip(
    utilities: Sequence[Fraction], epsilon: Fraction, sensitivity: Fraction
) -> int:
    """The index of one candidate, chosen by permute-and-flip.

    Guarantee: if one privacy unit can move every utility by at most ``sensitivity`` = Δ
    (add/remove one unit, the neighbouring relation of docs/design.md), the chosen index
    is ε-DP (McKenna & Sheldon 2020, Thm. 1: permute-and-flip with acceptance probability
    exp(ε(u_j − u*)/(2Δ)) is ε-DP). If the utilities actually move by at most d ≤ Δ, the
    same draw is (ε·d/Δ)-DP (the mechanism only sees ε·u/(2Δ)). As a pure ε-DP mechanism it
    is also ε²/2-zCDP (Bun & Steinke 2016, Prop. 1.4); that is what the ledger charges.

    The candidate with utility u* is accepted with probability 1, so at most
    ``len(utilities)`` Bernoulli draws are made.
    """
    if not utilities:
        raise ValueError("permute_and_flip needs at least one candidate")
    if epsilon <= 0 or sensitivity <= 0:
        raise ValueError("permute_and_flip needs epsilon > 0 and sensitivity > 0")
    best = max(utilities)
    order = list(range(len(utilities)))
    for i in range(len(order) - 1, 0, -1):  # Fisher–Yates, uniform over permutations
        j = secrets.randbelow(i + 1)
        order[i], order[j] = order[j], order[i]
    for j in order:
        gamma = epsilon * (best - utilities[j]) / (2 * sensitivity)
        if bernoulli_exp_neg(gamma):
            return j
    raise AssertionError("unreachable: the best candidate is accepted with probability 1")


def quantile_sensitivity(p: Fraction, rows_per_unit: int) -> Fraction:
    """Δ of ``quantile_utilities`` when one unit adds or removes at most ``rows_per_unit``
    rows: each row moves both terms lo_j − t and t − hi_j of every bucket's score by at
    most max(p, 1 − p) (``quantile_utilities`` has the argument)."""
    return rows_per_unit * max(p, 1 - p)


def scored_positions(first: int, after: int) -> tuple[int, int]:
    """Twice the interval [lo, hi] of sorted positions (in half ranks, so that it is
    whole) whose distance from the target scores a bucket holding positions ``first`` …
    ``after`` − 1: those positions when it holds a value; when it is empty, the middle of
    the gap it lies in, first − ½, between the values at positions first − 1 and first.
    The one definition every quantile path uses (``quantile_utilities``, and the
    integer levels of ``mechanisms.histogram_quantile``).

    The gap's score |first − ½ − t| is, for a median, the one Smith's interval mechanism
    (Smith 2011, Alg. 2; what Tumult Analytics uses) gives the gap with ``first`` values
    below it, |first − n/2|: t = (n − 1)/2. For another p it is |first − p·n − (½ − p)|,
    the same score about PERCENTILE_CONT's target instead of p·n."""
    if after > first:
        return 2 * first, 2 * (after - 1)
    return 2 * first - 1, 2 * first - 1


def quantile_utilities(below: Sequence[int], n: int, p: Fraction) -> list[Fraction]:
    """Utilities of the buckets of a grid for the p-quantile of ``n`` values.

    ``below[i]`` is the exact number of values below the grid's (i+1)-th inner edge, so
    bucket j holds the values at sorted positions L_j … A_j − 1 with L_j = below[j − 1]
    (0 for the first) and A_j = below[j] (n for the last). The target position is
    t = p·(n − 1) (0-based, as PERCENTILE_CONT places it), and bucket j scores minus the
    distance from t to its interval [lo_j, hi_j] (``scored_positions``, which gives it
    doubled):
    u_j = −max(lo_j − t, t − hi_j, 0), with [lo_j, hi_j] = [L_j, A_j − 1] when it holds a
    value and lo_j = hi_j = L_j − ½, the middle of the gap it lies in, when it is empty.
    So 0 for the bucket holding the target, and for an empty bucket in the gap whose
    middle is the target (the two middle values of an even count, apart); minus the
    distance in ranks otherwise.

    Sensitivity: a unit adds (or, read backwards, removes) r ≤ m rows, k_b of them in
    the buckets before j and k in j; n and t move by r and p·r. If j stays non-empty, or
    stays empty (k = 0), lo_j moves by k_b and hi_j by k_b + k, so lo_j − t moves by
    k_b − p·r ∈ [−p·r, (1 − p)·r] and t − hi_j by p·r − k_b − k ∈ [−(1 − p)·r, p·r]. If
    j goes from empty to holding k ≥ 1 of them, [L − ½, L − ½] becomes
    [L + k_b, L + k_b + k − 1] with 1 ≤ k_b + k ≤ r, so lo_j − t moves by
    k_b + ½ − p·r ∈ [½ − p·r, (1 − p)·r − ½] and t − hi_j by p·r − k_b − k + ½ ∈
    [½ − (1 − p)·r, p·r − ½]. Every move is within r·max(p, 1 − p), and max(·, ·, 0)
    moves by at most the larger of its arguments' moves, so Δ = m·max(p, 1 − p)
    (``quantile_sensitivity``).
    """
    t = p * (n - 1)
    edges = [0, *below, n]
    out: list[Fraction] = []
    for j in range(len(edges) - 1):
        lo2, hi2 = scored_positions(edges[j], edges[j + 1])
        out.append(-max(Fraction(lo2, 2) - t, t - Fraction(hi2, 2), Fraction(0)))
    return out


def rank_halfwidth(epsilon: Fraction, sensitivity: Fraction, candidates: int) -> int:
    """r such that, with probability ≥ 95%, the chosen bucket holds a value whose rank is
    within r of the target rank — whatever the data (it is computed from public values).

    For permute-and-flip, a candidate with utility gap g is output only if it is accepted
    when visited, which happens with probability at most exp(−ε·g/(2Δ)); a union bound
    over at most ``candidates`` of them gives P(gap ≥ G) ≤ candidates·exp(−ε·G/(2Δ)) ≤
    5% for G = (2Δ/ε)·(ln candidates + ln 20). Whenever there is at least one value the
    best bucket is within ½ of the target (which may fall between two positions in
    different buckets), so r = ⌈G + ½⌉.
    """
    g = 2 * float(sensitivity) / float(epsilon)
    g *= math.log(candidates) + math.log(1 / (1 - float(RANK_COVERAGE)))
    return math.ceil(g + 0.5)


def calibrate_with_choices(
    mechanism: MechanismName,
    epsilon: float,
    delta: float,
    sensitivities: Sequence[Sensitivity],
    choices: int,
    *,
    max_groups_per_unit: int | None = None,
    selector: int | None = None,
) -> QueryCalibration:
    """``calibrate_query`` for a query that also makes ``choices`` private choices
    (quantiles released by ``permute_and_flip``).

    Guarantee (add/remove one privacy unit): the P = m + c (+1 with partition selection
    by a separate unit count, none when a count ``selector`` selects by its own noise)
    parts each get ε/P. The c choices get their shares exactly (ε minus what the other
    parts got, rounded down, so the shares never sum above ε); the measures and the
    selection are calibrated by ``calibrate_query`` at the rest. By basic composition the
    whole release is (ε, δ)-DP. Each choice is pure ε_c-DP and so ε_c²/2-zCDP (Bun &
    Steinke 2016, Prop. 1.4); a Laplace query stays pure ε-DP and is charged ρ = ε²/2 as
    before, a Gaussian one is charged its measures' ρ plus Σ ε_c²/2.
    """
    if choices == 0:
        return calibrate_query(
            mechanism,
            epsilon,
            delta,
            sensitivities,
            max_groups_per_unit=max_groups_per_unit,
            selector=selector,
        )
    if mechanism not in ("laplace", "gaussian"):
        raise ValueError(f"mechanism must be 'laplace' or 'gaussian', got {mechanism!r}")
    eps = _check_epsilon(epsilon)
    _check_groups(max_groups_per_unit)
    m = len(sensitivities)
    own = max_groups_per_unit is not None and selector is not None
    others = m + (1 if max_groups_per_unit is not None and not own else 0)
    rest = _float_down(eps * others / (others + choices))
    if others == 0:
        base = QueryCalibration((), None, PrivacyCost.zero())
    elif m == 0:
        assert max_groups_per_unit is not None
        d = _check_delta(delta, positive=True, what="for partition selection")
        selection, sel_delta = _partition_selection(Fraction(rest), d, max_groups_per_unit)
        base = QueryCalibration((), selection, PrivacyCost(rest, 0.0, rest * rest / 2, sel_delta))
    else:
        base = calibrate_query(
            mechanism,
            rest,
            delta,
            sensitivities,
            max_groups_per_unit=max_groups_per_unit,
            selector=selector,
        )
    each = (eps - Fraction(rest)) / choices
    e = float(eps)
    cost = base.cost
    if mechanism == "laplace" or (m == 0 and cost.delta == 0):
        cost = PrivacyCost(e, 0.0, e * e / 2, cost.selection_delta)
    else:
        rho = cost.rho + choices * float(each * each) / 2
        cost = PrivacyCost(e, cost.delta, rho, cost.selection_delta)
    return QueryCalibration(base.noises, base.selection, cost, choices=(each,) * choices)


def _float_down(x: Fraction) -> float:
    """The largest float ≤ x (so shares computed in floats never exceed their exact sum)."""
    f = float(x)
    return f if Fraction(f) <= x else math.nextafter(f, -math.inf)
