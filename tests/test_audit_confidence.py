"""The auditor's confidence margin: a valid upper quantile of the noise combination.

``noise_quantile`` must be at least the exact quantile (else the "lower confidence bound"
would be too high and small groups would get through more often than the level says);
checked against the exact distribution of sums of discrete Laplace noises, computed by
convolution — no sampling, so no false alarms.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from gateway.audit.confidence import CountNoise, noise_quantile

N = 2000


def _laplace(b: float) -> np.ndarray:
    p = math.exp(-1 / b)
    x = np.arange(-N, N + 1)
    return (1 - p) / (1 + p) * p ** np.abs(x)


def _exact_tail(coefs: list[int], scales: list[float]) -> tuple[np.ndarray, np.ndarray]:
    """P(Σ cᵢ·Nᵢ ≥ x) on the integer grid (integer coefficients)."""
    dist = np.array([1.0])
    offset = 0
    for c, b in zip(coefs, scales, strict=True):
        w = _laplace(b)
        spread = np.zeros(abs(c) * (len(w) - 1) + 1)
        spread[:: abs(c)] = w if c > 0 else w[::-1]
        dist = np.convolve(dist, spread)
        offset += abs(c) * N
    xs = np.arange(len(dist)) - offset
    return xs, np.cumsum(dist[::-1])[::-1]


@pytest.mark.parametrize(
    ("coefs", "scales"),
    [
        ([1], [1.0]),
        ([1, -1], [1.0, 1.0]),
        ([1, -1], [2.0, 2.0]),
        ([1, 1, -1], [1.0, 1.0, 1.0]),
        ([2, -1], [3.0, 1.0]),
        ([1, -1, 1, -1], [5.0, 5.0, 2.0, 2.0]),
    ],
)
@pytest.mark.parametrize("alpha", [0.05, 1e-3, 1e-6])
def test_the_margin_is_an_upper_quantile(
    coefs: list[int], scales: list[float], alpha: float
) -> None:
    q = noise_quantile(
        [(c, CountNoise("laplace", b)) for c, b in zip(coefs, scales, strict=True)], alpha
    )
    xs, tail = _exact_tail(coefs, scales)
    assert tail[np.searchsorted(xs, math.ceil(q))] <= alpha
    # and not absurdly loose (Chernoff is loosest at large alpha)
    exact = xs[np.argmax(tail <= alpha)]
    assert q <= 2.5 * max(exact, 1)


def test_gaussian_and_degenerate_margins() -> None:
    g = noise_quantile([(1.0, CountNoise("gaussian", 3.0))], 1e-3)
    assert math.isclose(g, 3.0 * math.sqrt(2 * math.log(1e3)))
    assert noise_quantile([], 1e-3) == 0.0
    assert noise_quantile([(1.0, CountNoise("laplace", 0.0))], 1e-3) == 0.0
    assert noise_quantile([(1.0, CountNoise("laplace", math.inf))], 1e-3) == math.inf
