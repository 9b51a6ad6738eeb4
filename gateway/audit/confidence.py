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


@dataclass(frozen=True)
class CountNoise:
    """The public distribution of a released count's noise (``scale``: b for discrete
    Laplace, σ for discrete Gaussian, in units of the count)."""

    mechanism: Literal["laplace", "gaussian"]
    scale: float


def noise_quantile(terms: Sequence[tuple[float, CountNoise]], alpha: float) -> float:
    """A ``q`` with P(Σ cᵢ·Nᵢ ≥ q) ≤ ``alpha`` for independent noises (``terms``: pairs
    (cᵢ, noise of Nᵢ)); 0 when there is no noise, ``inf`` for an unknown scale."""
    laplace = [(abs(c), n.scale) for c, n in terms if n.mechanism == "laplace" and c]
    variance = sum(c * c * n.scale * n.scale for c, n in terms if n.mechanism == "gaussian")
    if any(not math.isfinite(b) or b < 0 for _, b in laplace):
        return math.inf
    laplace = [(c, b) for c, b in laplace if b > 0]
    log_alpha = math.log(1 / alpha)
    if not laplace:
        return math.sqrt(2 * variance * log_alpha)
    t_max = min(1 / (c * b) for c, b in laplace)
    t = _GRID * t_max
    # log E[exp(c·t·N)] on the grid once per distinct (c, b) — a combination's terms
    # mostly share a few —, then added up in the terms' order (bit for bit the sums of
    # one loop computing every term)
    distinct = list(dict.fromkeys(laplace))
    where = {cb: i for i, cb in enumerate(distinct)}
    p = np.array([math.exp(-1 / b) for _, b in distinct])[:, None]
    s = np.array([c for c, _ in distinct])[:, None] * t[None, :]
    each = np.array([2 * math.log1p(-float(q)) for q in p[:, 0]])[:, None]
    each = each - np.log1p(-p * np.exp(s))
    each = each - np.log1p(-p * np.exp(-s))
    log_mgf = 0.5 * variance * t * t
    for row in each[[where[cb] for cb in laplace]]:
        np.add(log_mgf, row, out=log_mgf)
    return float(np.min((log_alpha + log_mgf) / t))
