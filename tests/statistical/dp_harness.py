"""A statistical differential-privacy test for any ``release(db) -> int``.

The harness runs a release many times on two neighbouring databases and tries to *refute*
the claimed guarantee. It can fail: it rejects mechanisms whose noise is too small, whose
clamp is missing, or whose noise is not the one claimed. It never proves privacy.

Two tests, each with a false-alarm rate (probability of rejecting a mechanism that is
exactly as private / exactly as noisy as claimed) of at most ``alpha`` (default 1e-6):

1. Privacy profile (``privacy_profile_test``). (ε, δ)-DP says P[M(D₀) ∈ E] ≤ e^ε P[M(D₁) ∈ E]
   + δ for every event E, in both directions. The events are threshold events {x ≥ k} and
   {x ≤ k} with thresholds at quantiles of a separate *pilot* run (so the events do not
   depend on the data used to test them). For each event and database, Clopper–Pearson
   bounds (exact binomial) at level alpha / (4 · #events) are computed; E refutes the claim
   if lower(P₀(E)) > e^ε · upper(P₁(E)) + δ (or with 0 and 1 swapped). If every bound
   covers its probability — which fails with probability ≤ alpha by the union bound — no
   event can refute a true claim.
2. Noise scale (``noise_scale_test``), needs the true answers. Given the claimed ``Noise``,
   the errors (release − truth) must not be more concentrated than claimed:
   for h at the claimed 25/50/75% quantiles of |X|, a one-sided Clopper–Pearson lower bound
   at level alpha/3 on P(|error| ≤ h) above the exact claimed probability rejects. This is
   the test that catches noise at 0.9× the claimed scale at 20,000 releases, which the
   profile test alone detects only some of the time (it must hold for all events
   simultaneously and pays for it in Bonferroni corrections). It also reports the z-score
   of the mean absolute error against its exact claimed value (``mae_z``; informational —
   the CLT is not trusted at 1e-6, so it does not decide).

API (for the gateway's end-to-end tests)::

    result = check_release(release, db0, db1, epsilon=…, delta=…,
                           n=20_000, noise=claimed_noise, true_values=(v0, v1))
    assert not result.rejected, result.summary()

``release`` is called n + n_pilot times per database; pass ``release_many(db, k) -> list[int]``
as well to batch. ``noise`` and ``true_values`` are optional (no scale test without them).
Through the full gateway: give the test analyst a budget for 2·(n + n_pilot) queries and
make every request a cache miss (docs/design.md, invariant 7: same question, same
answer, free — would otherwise return one answer n times).
A withheld answer (a group not selected, an audit refusal) can be encoded as a fixed
integer outside the output range (e.g. −2**62): threshold events treat it like any value,
so the profile test covers "was it released" too (leave the scale test out then).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt
from scipy import stats

from mechanisms import Noise

DB = TypeVar("DB")
Ints = npt.NDArray[np.int64]

DEFAULT_ALPHA = 1e-6
PILOT_QUANTILES = (
    0.005,
    0.02,
    0.05,
    0.1,
    0.2,
    0.3,
    0.4,
    0.5,
    0.6,
    0.7,
    0.8,
    0.9,
    0.95,
    0.98,
    0.995,
)


def cp_lower(successes: int, n: int, level: float) -> float:
    """One-sided Clopper–Pearson lower bound: P(bound > p) ≤ level."""
    if successes == 0:
        return 0.0
    return float(stats.beta.ppf(level, successes, n - successes + 1))


def cp_upper(successes: int, n: int, level: float) -> float:
    """One-sided Clopper–Pearson upper bound: P(bound < p) ≤ level."""
    if successes == n:
        return 1.0
    return float(stats.beta.ppf(1 - level, successes + 1, n - successes))


def draw(
    release: Callable[[Any], int],
    db: Any,
    n: int,
    release_many: Callable[[Any, int], Sequence[int]] | None = None,
) -> Ints:
    """n releases on one database."""
    if release_many is not None:
        return np.asarray(release_many(db, n), dtype=np.int64)
    return np.fromiter((release(db) for _ in range(n)), dtype=np.int64, count=n)


@dataclass(frozen=True)
class ProfileResult:
    rejected: bool
    worst_event: str
    margin: float  # max over events of lower(P_a) − e^ε·upper(P_b) − δ; > 0 rejects
    epsilon_lower_bound: float  # the largest ε the data proves (at the claimed δ), ≥ 0
    events: int
    n: int


@dataclass(frozen=True)
class ScaleResult:
    rejected: bool
    worst: str
    margin: float  # max over h of lower(P(|err| ≤ h)) − claimed; > 0 rejects
    mae_z: float  # (observed − claimed mean |err|) / its claimed standard error
    n: int


@dataclass(frozen=True)
class HarnessResult:
    profile: ProfileResult
    scale: ScaleResult | None

    @property
    def rejected(self) -> bool:
        return self.profile.rejected or (self.scale is not None and self.scale.rejected)

    def summary(self) -> str:
        s = (
            f"profile: rejected={self.profile.rejected} margin={self.profile.margin:.4g} "
            f"eps_lb={self.profile.epsilon_lower_bound:.4g} worst={self.profile.worst_event}"
        )
        if self.scale is not None:
            s += (
                f"; scale: rejected={self.scale.rejected} margin={self.scale.margin:.4g} "
                f"mae_z={self.scale.mae_z:.3g} worst={self.scale.worst}"
            )
        return s


def thresholds_from_pilot(pilot: Ints) -> list[int]:
    """Distinct event thresholds at fixed quantiles of a pilot run (independent of the test)."""
    qs = np.quantile(pilot, PILOT_QUANTILES, method="nearest")
    return sorted({int(v) for v in qs})


def privacy_profile_test(
    out0: Ints,
    out1: Ints,
    epsilon: float,
    delta: float,
    thresholds: Sequence[int],
    *,
    alpha: float = DEFAULT_ALPHA,
) -> ProfileResult:
    """Refute (ε, δ)-DP between two output samples on threshold events (see module doc)."""
    n0, n1 = out0.size, out1.size
    s0, s1 = np.sort(out0), np.sort(out1)
    events: list[tuple[str, int, int]] = []
    for k in thresholds:
        ge0 = n0 - int(np.searchsorted(s0, k, side="left"))
        ge1 = n1 - int(np.searchsorted(s1, k, side="left"))
        le0 = int(np.searchsorted(s0, k, side="right"))
        le1 = int(np.searchsorted(s1, k, side="right"))
        events.append((f"x>={k}", ge0, ge1))
        events.append((f"x<={k}", le0, le1))
    level = alpha / (4 * len(events))
    e_eps = math.exp(epsilon)
    worst, worst_name, eps_lb = -math.inf, "", 0.0
    for name, c0, c1 in events:
        lo0, hi0 = cp_lower(c0, n0, level), cp_upper(c0, n0, level)
        lo1, hi1 = cp_lower(c1, n1, level), cp_upper(c1, n1, level)
        for tag, lo_a, hi_b in (("P0>P1", lo0, hi1), ("P1>P0", lo1, hi0)):
            margin = lo_a - e_eps * hi_b - delta
            if margin > worst:
                worst, worst_name = margin, f"{name} {tag}"
            if lo_a - delta > 0:
                eps_lb = max(eps_lb, math.log((lo_a - delta) / hi_b) if hi_b > 0 else math.inf)
    return ProfileResult(worst > 0, worst_name, worst, eps_lb, len(events), min(n0, n1))


def noise_pmf_abs(noise: Noise, top: int) -> npt.NDArray[np.float64]:
    """P(|X| = j), j = 0..top, of the claimed noise (float64 is ample for a test)."""
    j = np.arange(top + 1, dtype=np.float64)
    if noise.mechanism == "laplace":
        w = np.exp(-j / float(noise.scale))
    else:
        s2 = float(noise.sigma2 if noise.sigma2 is not None else noise.scale**2)
        w = np.exp(-(j * j) / (2 * s2))
    w[1:] *= 2
    return w / w.sum()


def noise_scale_test(errors: Ints, noise: Noise, *, alpha: float = DEFAULT_ALPHA) -> ScaleResult:
    """Refute "errors are distributed as ``noise``" when errors are too concentrated."""
    scale = float(noise.scale)
    top = int(60 * scale + 60)
    return concentration_test(np.abs(errors), noise_pmf_abs(noise, top), alpha=alpha)


def concentration_thresholds(pmf: npt.NDArray[np.float64]) -> list[int]:
    """The distances h the concentration test asks about: the claimed quartiles."""
    cdf = np.cumsum(pmf)
    return sorted({int(np.searchsorted(cdf, q)) for q in (0.25, 0.5, 0.75)})


def concentration_test(
    mags: Ints, pmf: npt.NDArray[np.float64], *, alpha: float = DEFAULT_ALPHA
) -> ScaleResult:
    """Refute "the distances ``mags`` (≥ 0) are distributed as ``pmf`` (P(distance = j),
    j = 0, 1, …) or less concentrated": for h at the claimed quartiles, a one-sided
    Clopper–Pearson lower bound at level alpha/#h on P(distance ≤ h) above the claimed
    P(distance ≤ h) rejects. False alarm ≤ alpha for any mechanism whose distances are
    stochastically at least as large as claimed (each bound covers with probability
    ≥ 1 − alpha/#h; union bound)."""
    top = pmf.size - 1
    cdf = np.cumsum(pmf)
    n = mags.size
    hs = concentration_thresholds(pmf)
    level = alpha / len(hs)
    worst, worst_name = -math.inf, ""
    for h in hs:
        observed = int(np.count_nonzero(mags <= h))
        margin = cp_lower(observed, n, level) - float(cdf[h])
        if margin > worst:
            worst, worst_name = (
                margin,
                f"P(|err|<={h}) claimed {cdf[h]:.4f}, seen {observed / n:.4f}",
            )
    j = np.arange(top + 1, dtype=np.float64)
    mags = np.minimum(mags, top)
    mean = float((j * pmf).sum())
    sd = math.sqrt(float((j * j * pmf).sum()) - mean * mean)
    mae_z = (float(mags.mean()) - mean) / (sd / math.sqrt(n))
    return ScaleResult(worst > 0, worst_name, worst, mae_z, n)


def concentration_power(
    pmf: npt.NDArray[np.float64],
    true_pmf: npt.NDArray[np.float64],
    n: int,
    *,
    alpha: float = DEFAULT_ALPHA,
) -> float:
    """A lower bound on the probability that ``concentration_test`` rejects when n
    distances are drawn from ``true_pmf`` while ``pmf`` is claimed: the exact binomial
    probability that its best single threshold h alone rejects (the least count whose
    Clopper–Pearson lower bound exceeds the claim, then the binomial tail above it)."""
    cdf, true_cdf = np.cumsum(pmf), np.cumsum(true_pmf)
    hs = concentration_thresholds(pmf)
    level = alpha / len(hs)
    best = 0.0
    for h in hs:
        lo, hi = 0, n + 1  # least x with cp_lower(x, n, level) > cdf[h] (monotone in x)
        while lo < hi:
            mid = (lo + hi) // 2
            if cp_lower(mid, n, level) > float(cdf[h]):
                hi = mid
            else:
                lo = mid + 1
        if lo <= n:
            best = max(best, float(stats.binom.sf(lo - 1, n, float(true_cdf[h]))))
    return best


def check_release(
    release: Callable[[Any], int],
    db0: Any,
    db1: Any,
    *,
    epsilon: float,
    delta: float = 0.0,
    n: int = 20_000,
    n_pilot: int = 2_000,
    alpha: float = DEFAULT_ALPHA,
    noise: Noise | None = None,
    true_values: tuple[int, int] | None = None,
    release_many: Callable[[Any, int], Sequence[int]] | None = None,
) -> HarnessResult:
    """Run ``release`` on neighbours ``db0``/``db1`` and test the claimed (ε, δ) and noise.

    The two tests have false-alarm rates ≤ alpha each (so ≤ 2·alpha together when both run).
    """
    pilot = np.concatenate(
        (draw(release, db0, n_pilot, release_many), draw(release, db1, n_pilot, release_many))
    )
    thresholds = thresholds_from_pilot(pilot)
    out0 = draw(release, db0, n, release_many)
    out1 = draw(release, db1, n, release_many)
    profile = privacy_profile_test(out0, out1, epsilon, delta, thresholds, alpha=alpha)
    scale = None
    if noise is not None and true_values is not None:
        errors = np.concatenate((out0 - true_values[0], out1 - true_values[1]))
        scale = noise_scale_test(errors, noise, alpha=alpha)
    return HarnessResult(profile, scale)
