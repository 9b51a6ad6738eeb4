"""Statistical DP tests of the quantile mechanism (the exponential mechanism over a fine
histogram, ``mechanisms.histogram_quantile``), false-alarm rate ≤ 1e-6 each: on the whole
histogram (``choose_bucket``) and, at the end of this file, on the buckets near the
target rank that the compiled statement returns (``choose_bucket_in_window``).

The neighbours are the values 0, 62, 63 and the same plus a second 63, on a grid of 64
buckets (one row per unit, the median). They are close to the worst case (the largest
loss over every database of at most 3 values in buckets 0-3, 31-33 and 60-63 and every
added value): on the first the target position 1 is the value 62, the 61 empty buckets
1 … 61 in the gap before it are scored at its middle ½ (level 1) and bucket 63 is at
level 2; on the second the target 1.5 is half a rank from buckets 62 and 63 (level 1)
and the gap's middle 1 rank from it (level 2). So bucket 63 moves down a level while 61
buckets move up one, and its probability (≈ 0.0095 and ≈ 0.0254 at ε = 1) changes by a
factor e^(0.984·ε) — the loss of this exponential mechanism approaches ε only as the far
buckets outnumber the near ones, which is why the grid has 64. The harness does not
refute the mechanism at its claimed ε and refutes it when its noise is 0.5× (2ε) of what
is claimed (≈ 0.0057 against ≈ 0.041, at 60,000 releases a side: ``HALF_N``). At 0.9×
(ε/0.9, a loss of 1.09 against 1 on these neighbours, an event of probability ≈ 0.027)
the event is too rare to refute at 1e-6, so the profile test does not carry the 0.9×
refutation.

The concentration test does (``dp_harness.concentration_test``, false alarm ≤ 1e-6): on
201 values one per bucket in the middle of a 256-bucket grid, the chosen bucket's distance
d from the median's bucket is claimed to have P(d) ∝ (number of buckets at d)·exp(−ε·ℓ/2),
ℓ = ⌈g/Δ⌉ the level of a bucket g ranks from the target — from its values, or from the
middle of the gap it lies in when empty (computed here from the definition, not by the
code under test). The real mechanism's base b ≤ exp(ε/2) and its
level cap only spread the choice further, so it is not refuted; with 0.9× the noise
(ε/0.9) the choice is more concentrated — P(d = 0) 0.505 against the claimed 0.462 — and
the test refutes it at 20,000 releases with probability ≥ 1 − 1e-9 (the exact binomial
power of its best threshold, ``test_the_power_at_0_9x_noise``).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from gateway.pipeline.quantiles import choose_quantile
from gateway.sql.analyze.quantiles import quantile_grid
from mechanisms import choose_bucket, choose_bucket_in_window, quantile_sensitivity, window_ranks
from tests.test_quantile_window import window_like_the_statement

from .dp_harness import check_release, concentration_power, concentration_test

pytestmark = pytest.mark.slow

EPSILON = Fraction(1)
GRID = quantile_grid("integer", 0, 63, Fraction(1, 2), 1)
DB0 = {0: 1, 62: 1, 63: 1}
DB1 = {0: 1, 62: 1, 63: 2}
#: Releases per side for the half-noise refutations: the refuting events are rare (about
#: 0.6% against 4.1%, 0.7% against 4.9%), and at 60,000 the harness's margin stays above
#: 0.006 even when both counts fall 1e-7 into their tails (at 20,000 it is negative
#: 1e-4 into them).
HALF_N = 60_000


def _release(epsilon: Fraction) -> object:
    """``choose_quantile`` as the pipeline calls it: on what the statement returns."""
    sensitivity = quantile_sensitivity(GRID.p, GRID.rows_per_unit)

    def release(histogram: dict[int, int]) -> int:
        ranks = window_ranks(epsilon, GRID.buckets, sensitivity)
        window = window_like_the_statement(histogram, GRID.p, ranks)
        return int(choose_quantile(GRID, window, epsilon))

    return release


def test_the_grid_is_the_one_the_test_reasons_about() -> None:
    assert GRID.integral and GRID.buckets == 64


def test_the_quantile_mechanism_is_not_refuted_at_its_epsilon() -> None:
    result = check_release(_release(EPSILON), DB0, DB1, epsilon=float(EPSILON), n=200_000)
    assert not result.rejected, result.summary()


def test_half_the_noise_is_refuted() -> None:
    result = check_release(_release(2 * EPSILON), DB0, DB1, epsilon=float(EPSILON), n=HALF_N)
    assert result.rejected, result.summary()


# The concentration test's setting: values 28 … 228, one per bucket, of a 256-bucket grid.
SPREAD_BUCKETS = 256
SPREAD = dict.fromkeys(range(28, 229), 1)
MEDIAN_BUCKET = 128
HALF = Fraction(1, 2)
DELTA_U = quantile_sensitivity(HALF, 1)


def _claimed_distance_pmf(epsilon: float) -> np.ndarray:
    """P(|chosen − median bucket| = d) of the ideal exponential mechanism at ε over the
    levels ⌈g/Δ⌉ (g: the bucket's rank distance from the target), from the definition."""
    values = sorted(SPREAD)
    t = (len(values) - 1) / 2
    weights = np.zeros(SPREAD_BUCKETS)
    for j in range(SPREAD_BUCKETS):
        below = sum(1 for v in values if v < j)
        here = 1 if j in SPREAD else 0
        # an empty bucket is scored at the middle of the gap between positions
        # below − 1 and below
        lo, hi = (below, below + here - 1) if here else (below - 0.5, below - 0.5)
        g = max(lo - t, t - hi, 0)
        level = math.ceil(g / float(DELTA_U))
        weights[MEDIAN_BUCKET - j if j <= MEDIAN_BUCKET else j - MEDIAN_BUCKET] += math.exp(
            -epsilon * level / 2
        )
    return weights / weights.sum()


def _distances(epsilon: Fraction, n: int) -> np.ndarray:
    return np.fromiter(
        (
            abs(choose_bucket(SPREAD, SPREAD_BUCKETS, HALF, DELTA_U, epsilon) - MEDIAN_BUCKET)
            for _ in range(n)
        ),
        dtype=np.int64,
        count=n,
    )


def test_the_quantile_choice_is_not_more_concentrated_than_claimed() -> None:
    claimed = _claimed_distance_pmf(float(EPSILON))
    result = concentration_test(_distances(EPSILON, 20_000), claimed)
    assert not result.rejected, result


def test_the_quantile_choice_at_0_9x_noise_is_refuted() -> None:
    claimed = _claimed_distance_pmf(float(EPSILON))
    result = concentration_test(_distances(EPSILON / Fraction(9, 10), 20_000), claimed)
    assert result.rejected, result


def test_the_power_at_0_9x_noise() -> None:
    claimed = _claimed_distance_pmf(float(EPSILON))
    sharper = _claimed_distance_pmf(float(EPSILON) / 0.9)
    assert claimed[0] == pytest.approx(0.462, abs=1e-3)
    assert sharper[0] == pytest.approx(0.505, abs=1e-3)
    assert concentration_power(claimed, sharper, 20_000) >= 1 - 1e-9


# --- the rank window: the database returns only the buckets near the target ----------
#
# The same tests, through ``choose_bucket_in_window`` fed what the compiled statement
# returns (``window_like_the_statement``, tests/test_quantile_window.py, which checks it
# against the statement on real engines), on data where the window leaves buckets out.
#
# Profile test: 100 values one per bucket in 0 … 99, one in each of 150 … 250, a
# 300-bucket grid (the median is 150, after the 50 empty buckets 100 … 149); the
# neighbour adds a second value in bucket 151 — the profile test above, with long runs of
# values either side. At ε = 1 the level cap is 101 and the window 51 ranks, so the
# buckets of ranks below ≈ 47 and above ≈ 153 are cut (at the cap). The release is
# whether bucket 151 was chosen (post-processing: a fixed event), whose probability moves
# by e^(0.981·ε) between the neighbours — close to the worst case, as the empty buckets
# of the profile test above: 0.0113 against 0.0302 at ε = 1, 0.0069 against 0.0486 when
# the noise is halved, so 60,000 releases refute that (``HALF_N``). At 0.9× (e^1.09)
# the event is too rare to refute at 1e-6; the concentration test below carries the
# 0.9× refutation, as above.
WINDOW_BUCKETS = 300
WINDOW_DB0 = {**dict.fromkeys(range(100), 1), **dict.fromkeys(range(150, 251), 1)}
WINDOW_DB1 = {**WINDOW_DB0, 151: 2}


def _windowed(counts: dict[int, int], buckets: int, epsilon: Fraction) -> int:
    window = window_like_the_statement(counts, HALF, window_ranks(epsilon, buckets, DELTA_U))
    return choose_bucket_in_window(window, buckets, HALF, DELTA_U, epsilon)


def _windowed_event(epsilon: Fraction) -> object:
    def release(histogram: dict[int, int]) -> int:
        return int(_windowed(histogram, WINDOW_BUCKETS, epsilon) == 151)

    return release


def test_the_window_leaves_buckets_out_in_these_tests() -> None:
    """Else the tests below would not test the window."""
    for counts in (WINDOW_DB0, WINDOW_DB1):
        w = window_ranks(EPSILON, WINDOW_BUCKETS, DELTA_U)
        kept = window_like_the_statement(counts, HALF, w).kept
        assert 0 < len(kept) < len(counts) - 80
    w = window_ranks(EPSILON, SPREAD_BUCKETS, DELTA_U)
    assert len(window_like_the_statement(SPREAD, HALF, w).kept) < len(SPREAD) - 50


def test_the_windowed_quantile_is_not_refuted_at_its_epsilon() -> None:
    result = check_release(
        _windowed_event(EPSILON), WINDOW_DB0, WINDOW_DB1, epsilon=float(EPSILON), n=200_000
    )
    assert not result.rejected, result.summary()


def test_the_windowed_quantile_with_half_the_noise_is_refuted() -> None:
    result = check_release(
        _windowed_event(2 * EPSILON),
        WINDOW_DB0,
        WINDOW_DB1,
        epsilon=float(EPSILON),
        n=HALF_N,
    )
    assert result.rejected, result.summary()


def _windowed_distances(epsilon: Fraction, n: int) -> np.ndarray:
    return np.fromiter(
        (abs(_windowed(SPREAD, SPREAD_BUCKETS, epsilon) - MEDIAN_BUCKET) for _ in range(n)),
        dtype=np.int64,
        count=n,
    )


def test_the_windowed_choice_is_not_more_concentrated_than_claimed() -> None:
    claimed = _claimed_distance_pmf(float(EPSILON))
    result = concentration_test(_windowed_distances(EPSILON, 20_000), claimed)
    assert not result.rejected, result


def test_the_windowed_choice_at_0_9x_noise_is_refuted() -> None:
    claimed = _claimed_distance_pmf(float(EPSILON))
    result = concentration_test(_windowed_distances(EPSILON / Fraction(9, 10), 20_000), claimed)
    assert result.rejected, result
