"""Exact integer noise, calibration and accuracy for dpgate (see docs/mechanisms.md).

Neighbouring relation throughout: databases differing by all rows of one privacy unit
(add/remove one unit, docs/design.md). The package knows nothing of SQL or HTTP.
"""

from __future__ import annotations

from mechanisms.accuracy import accuracy, halfwidth, ratio_interval
from mechanisms.calibration import (
    analytic_gaussian_delta,
    analytic_gaussian_mu,
    calibrate_query,
    calibrate_query_rho,
    grid_center,
    grid_resolution,
    grid_sensitivity,
    release_probability,
    selection_delta,
    selection_threshold,
    tail_probability,
    zcdp_epsilon,
)
from mechanisms.histogram_quantile import (
    RankWindow,
    choose_bucket,
    choose_bucket_in_window,
    fine_rank_halfwidth,
    window_ranks,
)
from mechanisms.pool import POOLS
from mechanisms.selection import (
    calibrate_with_choices,
    permute_and_flip,
    quantile_sensitivity,
    quantile_utilities,
    rank_halfwidth,
    scored_positions,
)
from mechanisms.types import (
    Accuracy,
    MechanismName,
    Noise,
    PartitionSelection,
    PrivacyCost,
    QueryCalibration,
    Sensitivity,
)

__all__ = [
    "Accuracy",
    "MechanismName",
    "Noise",
    "PartitionSelection",
    "PrivacyCost",
    "QueryCalibration",
    "RankWindow",
    "Sensitivity",
    "accuracy",
    "analytic_gaussian_delta",
    "analytic_gaussian_mu",
    "calibrate_query",
    "calibrate_query_rho",
    "calibrate_with_choices",
    "choose_bucket",
    "choose_bucket_in_window",
    "fine_rank_halfwidth",
    "grid_center",
    "grid_resolution",
    "grid_sensitivity",
    "halfwidth",
    "permute_and_flip",
    "prefill",
    "quantile_sensitivity",
    "quantile_utilities",
    "rank_halfwidth",
    "ratio_interval",
    "release_probability",
    "sample",
    "scored_positions",
    "selection_delta",
    "selection_threshold",
    "tail_probability",
    "window_ranks",
    "zcdp_epsilon",
]


def sample(noise: Noise, size: int) -> list[int]:
    """``size`` independent exact draws of ``noise``, from pre-drawn pools.

    Guarantee: each value is distributed exactly as the discrete Laplace
    (P(x) ∝ exp(−|x|/scale)) or discrete Gaussian (P(x) ∝ exp(−x²/(2σ²))) named by
    ``noise``, drawn from ``os.urandom`` with integer arithmetic only (CKS 2020; the exact
    comparisons are argued in ``mechanisms.exact`` and ``mechanisms.samplers``), independent
    of every value returned before, and never returned twice (also across forked workers).
    Added to an integer statistic this is the mechanism ``calibrate_query`` calibrated, DP
    under add/remove one privacy unit. The call copies values out of a pool filled ahead of
    time, so its duration depends on ``size`` and not on the values (docs/design.md,
    invariant 4: noise is exact, secret and timing-blind).
    """
    return POOLS.take(noise, size)


def prefill(noise: Noise, size: int) -> None:
    """Make ``size`` values of ``noise`` ready before a release (call after calibration).

    Optional: ``sample`` refills an empty pool itself; calling ``prefill`` early keeps even
    the first release with a new noise spec free of sampling work. Draws noise only (no
    data), so it has no privacy effect; the values drawn are those ``sample`` returns next.
    """
    POOLS.prefill(noise, size)
