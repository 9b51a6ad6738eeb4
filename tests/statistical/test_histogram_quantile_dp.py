"""Statistical DP tests of the quantile mechanism (the exponential mechanism over a fine
histogram, ``mechanisms.histogram_quantile``), false-alarm rate ≤ 1e-6 each.

The neighbours are one value in bucket 62 and the same plus one in bucket 63, on a grid
of 64 buckets (one row per unit, the median). They are close to the worst case: bucket 63
moves from level 2 to level 1 while the 62 empty buckets below move from level 2 to 3,
so its probability (≈ 0.015 and ≈ 0.040 at ε = 1) changes by a factor e^(0.974·ε) — the
loss of this exponential mechanism approaches ε only as the far buckets outnumber the
near ones, which is why the grid has 64. The harness does not refute the mechanism at its
claimed ε and refutes it when its noise is 0.5× (2ε) of what is claimed. At 0.9× (ε/0.9,
a loss of 1.08 against 1 on these neighbours, an event of probability ≈ 0.04) a million
releases per database did not refute it (margin −0.0004, ε lower bound 0.99): no test at
0.9× is here, as none was found that runs in a test's time.
"""

from __future__ import annotations

from fractions import Fraction

import pytest

from gateway.analyze.quantiles import quantile_grid
from gateway.quantiles import choose_quantile

from .dp_harness import check_release

pytestmark = pytest.mark.slow

EPSILON = Fraction(1)
GRID = quantile_grid("integer", 0, 63, Fraction(1, 2), 1)
DB0 = {62: 1}
DB1 = {62: 1, 63: 1}


def _release(epsilon: Fraction) -> object:
    def release(histogram: dict[int, int]) -> int:
        return int(choose_quantile(GRID, histogram, epsilon))

    return release


def test_the_grid_is_the_one_the_test_reasons_about() -> None:
    assert GRID.integral and GRID.buckets == 64


def test_the_quantile_mechanism_is_not_refuted_at_its_epsilon() -> None:
    result = check_release(_release(EPSILON), DB0, DB1, epsilon=float(EPSILON), n=200_000)
    assert not result.rejected, result.summary()


def test_half_the_noise_is_refuted() -> None:
    result = check_release(_release(2 * EPSILON), DB0, DB1, epsilon=float(EPSILON), n=20_000)
    assert result.rejected, result.summary()
