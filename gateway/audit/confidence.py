"""How large a determined group is, with high confidence, from public noise scales only.

A determined region's size is estimated by a combination ``Σ cᵢ·yᵢ`` of released noisy
counts ``yᵢ = xᵢ + Nᵢ``. The noises ``Nᵢ`` are independent, and their distributions are
public (the mechanism and its scale are in every response's accuracy section). So

    P( Σ cᵢ·Nᵢ ≥ q ) ≤ α   ⇒   Σ cᵢ·yᵢ − q  is a lower confidence bound at level 1 − α

on the true size ``Σ cᵢ·xᵢ``. The auditor refuses unless that bound reaches k. ``q`` comes
from the Chernoff bound with each noise's exact moment generating function,

    P(X ≥ q) ≤ exp(−t·q) · E[exp(t·X)]   for every t > 0,

minimised over t: for a discrete Laplace noise with scale b (P(x) ∝ exp(−|x|/b), p =
exp(−1/b)), E[exp(sN)] = (1 − p)² / ((1 − p·eˢ)(1 − p·e⁻ˢ)) for |s| < 1/b; a discrete
Gaussian with scale σ is σ²-subgaussian, E[exp(sN)] ≤ exp(σ²s²/2) (Canonne, Kamath,
Steinke 2020, Cor. 9). Any t gives a valid bound, so minimising on a grid is safe.

Everything here is a function of released values and public scales: deciding with it is
post-processing of the DP releases (simulatable, like the rest of the auditor).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

_GRID = np.geomspace(1e-4, 1 - 1e-6, 256)


@dataclass(frozen=True, slots=True)
class CountNoise:
    """The public distribution of a released count's noise (``scale``: b for discrete
    Laplace, σ for discrete Gaussian, in units of the count)."""

    mechanism: Literal["laplace", "gaussian"]
    scale: float


def noise_quantile(terms: Sequence[tuple[float, CountNoise]], alpha: float) -> float:
    """A ``q`` with P(Σ cᵢ·Nᵢ ≥ q) ≤ ``alpha`` for independent noises (``terms``: pairs
    (cᵢ, noise of Nᵢ)); 0 when there is no noise, ``inf`` for an unknown scale."""
    return _quantile(terms, alpha, 1)


def quantile_upper_bound(terms: Sequence[tuple[float, CountNoise]], alpha: float) -> float:
    """A number no smaller than ``noise_quantile(terms, alpha)``, for a sixteenth of its
    cost: the same bound minimised over every sixteenth point of the grid (a minimum
    over fewer points), plus a margin of 1e-9 (relative and absolute) for the last bits
    of the arithmetic. A size whose bound clears k with it clears k with the exact one."""
    q = _quantile(terms, alpha, 16)
    return q + 1e-9 * abs(q) + 1e-9


def _quantile(terms: Sequence[tuple[float, CountNoise]], alpha: float, step: int) -> float:
    """The Chernoff bound minimised over every ``step``-th point of the grid. Every
    term's log E[exp(c·t·N)] is one row of a matrix, added up in the terms' order (a
    sum down the rows: bit for bit the sums of a loop over the terms, which it was)."""
    coefs: list[float] = []  # the Laplace terms' |cᵢ| and scales bᵢ (cᵢ ≠ 0)
    scales: list[float] = []
    squares: list[float] = []  # the Gaussian terms' cᵢ²σᵢ²
    for coef, n in terms:
        if n.mechanism == "laplace":
            if coef:
                coefs.append(abs(coef))
                scales.append(n.scale)
        elif n.mechanism == "gaussian":
            squares.append(coef * coef * n.scale * n.scale)
    variance = sum(squares)
    b = np.array(scales, dtype=float)
    if not np.all(np.isfinite(b) & (b >= 0)):
        return math.inf
    c = np.array(coefs, dtype=float)[b > 0]
    b = b[b > 0]
    log_alpha = math.log(1 / alpha)
    if not len(b):
        return math.sqrt(2 * variance * log_alpha)
    t = (_GRID * float(np.min(1 / (c * b))))[::step]
    # p and log(1 − p)² depend on the scale alone: once per scale
    distinct, which = np.unique(b, return_inverse=True)
    ps = [math.exp(-1 / float(x)) for x in distinct]
    p = np.array(ps)[which][:, None]
    first = np.array([2 * math.log1p(-q) for q in ps])[which][:, None]
    s = c[:, None] * t[None, :]
    rows = np.empty((len(c) + 1, len(t)))
    rows[0] = 0.5 * variance * t * t
    rows[1:] = first - np.log1p(-p * np.exp(s)) - np.log1p(-p * np.exp(-s))
    log_mgf = np.sum(rows, axis=0)
    return float(np.min((log_alpha + log_mgf) / t))
