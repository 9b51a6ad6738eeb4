"""Accuracy-targeted queries: the smallest ε whose 95% interval meets the analyst's target.

``POST /v1/query`` may carry ``"accuracy": {"ci95_halfwidth": X}`` instead of ``epsilon``:
every COUNT and SUM the query releases must then be within ±X of its exact value with
probability ≥ 95%. The half-width of a released value is a function of its noise
distribution only (``mechanisms.accuracy``: the smallest h with P(|noise| ≤ h) ≥ 0.95,
from the exact PMF), and the noise is a function of the plan, the mechanism and ε — all
public. So the ε chosen here is a function of public information, and choosing it costs
no privacy.

The half-width shrinks as ε grows (the noise scale is proportional to 1/ε for the
Laplace mechanism, and σ shrinks with ε for the Gaussian), so the smallest ε that meets
the target is found by bisection on ε (in log scale) between the gateway's minimum and
maximum ε per query. The ε returned is rounded *up* to 6 significant digits and checked
again: whatever the bisection did, the released intervals are at most the target.

AVG outputs are refused: their interval depends on the noisy count (a ratio), so no ε
fixed before execution can promise it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from gateway.core.config import PrivacyConfig
from gateway.core.errors import InvalidPrivacyParameters
from gateway.core.plan import QueryPlan, QueryRequest
from gateway.pipeline.noising import expected_accuracy
from mechanisms import QueryCalibration

# The search stops when the bracket is this narrow (relative): ε to ~5 digits.
REL_TOLERANCE = 1e-5
# How far past the per-query maximum the search goes to say what the target would cost:
# the largest ε the mechanisms calibrate for.
REPORT_LIMIT = 100.0


@dataclass(frozen=True)
class AccuracyChoice:
    """The ε chosen for a target and the expected 95% half-width of each output at it."""

    epsilon: float
    halfwidths: dict[str, float]


class AccuracyUnreachable(ValueError):
    """No ε allowed per query meets the target. ``epsilon_needed`` is the ε that would
    (``None``: not even ε = ``REPORT_LIMIT``); ``best_halfwidth`` is the largest
    half-width at the maximum ε."""

    def __init__(self, message: str, *, epsilon_needed: float | None, best_halfwidth: float):
        super().__init__(message)
        self.epsilon_needed = epsilon_needed
        self.best_halfwidth = best_halfwidth


def targetable_outputs(plan: QueryPlan) -> list[str]:
    """The outputs an accuracy target applies to; ``ValueError`` if it cannot apply."""
    visible = plan.visible_outputs
    averages = [o.name for o in visible if o.kind == "avg"]
    if averages:
        raise ValueError(
            f"an accuracy target cannot apply to AVG ({', '.join(averages)}): its interval "
            "depends on the noisy count; ask with epsilon, or for SUM and COUNT"
        )
    names = [o.name for o in visible if o.kind in ("count", "sum")]
    if not names:
        raise ValueError("this query releases no COUNT or SUM for an accuracy target to apply to")
    return names


def output_halfwidths(plan: QueryPlan, calibration: QueryCalibration) -> dict[str, float]:
    """The expected 95% half-width of every released COUNT and SUM (released units)."""
    accuracy = expected_accuracy(plan, calibration)
    return {
        o.name: float(accuracy[o.name]["ci95_halfwidth"])
        for o in plan.visible_outputs
        if o.kind in ("count", "sum")
    }


def smallest_epsilon(
    halfwidths_at: Callable[[float], Mapping[str, float] | None],
    target: float,
    lo: float,
    hi: float,
) -> float | None:
    """The smallest ε in [lo, hi] (to ``REL_TOLERANCE``) whose half-widths are all at most
    ``target``, or ``None`` if ``hi`` does not meet it. ``halfwidths_at(ε)`` returns
    ``None`` for an ε that cannot be calibrated (it then does not meet the target).

    The ε returned always meets the target (it is checked, not inferred).
    """

    def meets(epsilon: float) -> bool:
        widths = halfwidths_at(epsilon)
        return widths is not None and all(w <= target for w in widths.values())

    if not meets(hi):
        return None
    if meets(lo):
        return lo
    low, high = math.log(lo), math.log(hi)  # meets(e^high), not meets(e^low)
    while high - low > REL_TOLERANCE:
        mid = (low + high) / 2
        if meets(math.exp(mid)):
            high = mid
        else:
            low = mid
    best = math.exp(high)
    rounded = _round_up(best)
    if rounded <= hi and meets(rounded):
        return rounded
    return best if meets(best) else hi


def choose_epsilon(
    plan: QueryPlan,
    target: float,
    calibrate: Callable[[float], QueryCalibration | None],
    *,
    min_epsilon: float,
    max_epsilon: float,
) -> AccuracyChoice:
    """The smallest ε in [min_epsilon, max_epsilon] whose expected 95% half-width of every
    COUNT and SUM output is at most ``target``.

    ``calibrate(ε)`` is the gateway's calibration of this plan at ε (``None`` if that ε
    cannot be calibrated). Raises ``ValueError`` for a target that cannot apply (AVG, no
    COUNT/SUM, a target ≤ 0) and ``AccuracyUnreachable`` when even ``max_epsilon`` is not
    enough (saying what ε would be).
    """
    if not (math.isfinite(target) and target > 0):
        raise ValueError("accuracy.ci95_halfwidth must be a finite number > 0")
    targetable_outputs(plan)

    def halfwidths_at(epsilon: float) -> dict[str, float] | None:
        calibration = calibrate(epsilon)
        return None if calibration is None else output_halfwidths(plan, calibration)

    epsilon = smallest_epsilon(halfwidths_at, target, min_epsilon, max_epsilon)
    if epsilon is None:
        at_max = halfwidths_at(max_epsilon) or {}
        best = max(at_max.values(), default=math.inf)
        limit = max(max_epsilon, REPORT_LIMIT)
        needed = smallest_epsilon(halfwidths_at, target, max_epsilon, limit)
        cost = (
            f"it would need ε = {needed:.4g}"
            if needed is not None
            else f"not even ε = {limit:.4g} would meet it"
        )
        raise AccuracyUnreachable(
            f"no ε up to this gateway's limit per query ({max_epsilon:.4g}) gives a 95% "
            f"interval of ±{target:.4g}: at ε = {max_epsilon:.4g} it is ±{best:.4g}; {cost}",
            epsilon_needed=needed,
            best_halfwidth=best,
        )
    widths = halfwidths_at(epsilon)
    assert widths is not None and all(w <= target for w in widths.values())
    return AccuracyChoice(epsilon=epsilon, halfwidths=widths)


def request_for_target(
    plan: QueryPlan,
    request: QueryRequest,
    privacy: PrivacyConfig,
    calibrate: Callable[[QueryRequest], QueryCalibration],
) -> QueryRequest:
    """``request`` with ``epsilon`` set to the smallest ε (within the gateway's limits per
    query) meeting its accuracy target; ``InvalidPrivacyParameters`` saying what it
    would cost when no such ε is allowed.

    ``calibrate`` is the pipeline's own calibration of ``plan`` for a request (raising
    ``InvalidPrivacyParameters`` for parameters it refuses).
    """
    assert request.accuracy is not None
    calibrate(replace(request, epsilon=privacy.max_epsilon_per_query))  # other refusals

    def at(epsilon: float) -> QueryCalibration | None:
        try:
            return calibrate(replace(request, epsilon=epsilon))
        except InvalidPrivacyParameters:  # too small an ε (or ρ) for this gateway
            return None

    try:
        choice = choose_epsilon(
            plan,
            request.accuracy,
            at,
            min_epsilon=privacy.min_epsilon_per_query,
            max_epsilon=privacy.max_epsilon_per_query,
        )
    except AccuracyUnreachable as e:
        raise InvalidPrivacyParameters(
            str(e),
            epsilon_needed=e.epsilon_needed,
            max_epsilon_per_query=privacy.max_epsilon_per_query,
        ) from None
    except ValueError as e:
        raise InvalidPrivacyParameters(str(e)) from None
    return replace(request, epsilon=choice.epsilon)


def _round_up(value: float, digits: int = 6) -> float:
    """``value`` rounded up to ``digits`` significant digits (never below ``value``)."""
    if value <= 0 or not math.isfinite(value):
        return value
    exponent = math.floor(math.log10(value)) - digits + 1
    rounded = float(f"{math.ceil(value / 10.0**exponent) * 10.0**exponent:.{digits}g}")
    return rounded if rounded >= value else value
