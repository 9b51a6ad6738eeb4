"""The time of ``sample`` does not depend on the noise it returns (docs/design.md,
invariant 4: noise is exact, secret and timing-blind).

Statistic: Spearman rank correlation between |noise| and the duration of the call, over
n = 20,000 single-value releases. Under independence √(n−1)·ρ is asymptotically N(0, 1), so
the rule |ρ| < 0.05 has a false-alarm rate of about P(|Z| > 0.05·√19999 = 7.07) ≈ 2e-12.
Machine load adds noise to the durations but, being independent of the values drawn, does
not create correlation; it can only hide it. The control shows the same statistic does
catch a sampler whose running time grows with |noise| with far fewer releases.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from mechanisms import Noise, prefill, sample

pytestmark = pytest.mark.slow

LIMIT = 0.05


def _timed(release: Callable[[], int], n: int) -> tuple[np.ndarray, np.ndarray]:
    values = np.empty(n, dtype=np.int64)
    durations = np.empty(n, dtype=np.int64)
    clock = time.perf_counter_ns
    for i in range(n):
        t0 = clock()
        x = release()
        durations[i] = clock() - t0
        values[i] = x
    return np.abs(values), durations


def _spearman(a: np.ndarray, b: np.ndarray) -> float:
    return float(stats.spearmanr(a, b).statistic)


@pytest.mark.parametrize(
    "noise",
    [
        Noise("laplace", Fraction(1000)),
        Noise("laplace", Fraction(3, 2)),
        Noise("gaussian", Fraction(300), Fraction(90_000)),
    ],
    ids=["laplace-1000", "laplace-1.5", "gaussian-300"],
)
def test_sample_time_does_not_depend_on_the_noise(noise: Noise) -> None:
    prefill(noise, 4096)
    mags, durations = _timed(lambda: sample(noise, 1)[0], 20_000)
    rho = _spearman(mags, durations)
    assert abs(rho) < LIMIT, f"Spearman(|noise|, time) = {rho:.4f}"


def _leaky_release() -> int:
    # Unary geometric: one trial per unit of |noise|, the textbook timing channel.
    g = 0
    while secrets.randbelow(100) < 90:
        g += 1
    return g if secrets.randbits(1) else -g


def test_the_statistic_catches_a_variable_time_sampler() -> None:
    mags, durations = _timed(_leaky_release, 2_000)
    rho = _spearman(mags, durations)
    assert rho > LIMIT, f"Spearman(|noise|, time) = {rho:.4f} on a leaky sampler"
