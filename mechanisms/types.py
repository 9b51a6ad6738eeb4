"""Frozen values that cross the mechanisms boundary: noise specs, costs, accuracy.

These are the contract between the gateway (which knows SQL), the mechanisms (which know
noise) and the budget (which knows composition). None of them knows the others' insides.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

MechanismName = Literal["laplace", "gaussian"]


@dataclass(frozen=True)
class PrivacyCost:
    """What one released query costs, in every currency the accountants use.

    - ``epsilon``: the pure-DP ε of a Laplace release, or the nominal ε a Gaussian
      release was calibrated for (informational for Gaussian: accounting uses ``rho``).
    - ``delta``: the nominal δ a Gaussian release was calibrated for (0 for Laplace).
    - ``rho``: the zCDP cost (Laplace: ε²/2; Gaussian: Δ₂²/(2σ²)).
    - ``selection_delta``: δ spent by DP partition selection; every accountant adds it on
      top of whatever δ its conversion yields.
    """

    epsilon: float
    delta: float
    rho: float
    selection_delta: float = 0.0

    def __add__(self, other: PrivacyCost) -> PrivacyCost:
        return PrivacyCost(
            self.epsilon + other.epsilon,
            self.delta + other.delta,
            self.rho + other.rho,
            self.selection_delta + other.selection_delta,
        )

    @staticmethod
    def zero() -> PrivacyCost:
        return PrivacyCost(0.0, 0.0, 0.0, 0.0)


@dataclass(frozen=True)
class Noise:
    """One calibrated integer noise distribution.

    ``mechanism == "laplace"``: discrete Laplace, P(x) ∝ exp(−|x| / scale).
    ``mechanism == "gaussian"``: discrete Gaussian, P(x) ∝ exp(−x² / (2·scale²)),
    where ``sigma2 = scale²`` is kept exact as a Fraction.
    """

    mechanism: MechanismName
    scale: Fraction
    sigma2: Fraction | None = None


@dataclass(frozen=True)
class Accuracy:
    """How far a released integer may be from the exact one, from the exact noise PMF."""

    stddev: float
    ci95_halfwidth: float


@dataclass(frozen=True)
class Sensitivity:
    """How much one privacy unit can move one measured integer aggregate (over all groups)."""

    l1: Fraction
    l2: Fraction
    linf: Fraction


@dataclass(frozen=True)
class PartitionSelection:
    """DP partition selection: release a group iff its noisy count ≥ ``threshold``.

    ``measure`` is the index (in ``QueryCalibration.noises``) of the count measure whose
    own noisy value selects — the very value then released, so selection costs no ε of
    its own; ``noise`` is then that measure's noise. ``measure is None``: a separate
    count of units, noised with ``noise``, selects.
    """

    noise: Noise
    threshold: int
    max_groups_per_unit: int
    measure: int | None = None


@dataclass(frozen=True)
class QueryCalibration:
    """The noise for each measure of one query, the optional selection, and the total cost.

    ``choices`` is the ε of each private choice the query makes (a quantile's bucket,
    chosen by permute-and-flip, ``mechanisms.selection``), in the plan's order.
    """

    noises: tuple[Noise, ...]
    selection: PartitionSelection | None
    cost: PrivacyCost
    choices: tuple[Fraction, ...] = ()
