"""Releasing quantiles and spread: a bucket of a fine histogram chosen by the exponential
mechanism, and VARIANCE / STDDEV as post-processing of noisy sums, with their accuracy.

- A quantile (PERCENTILE_CONT, MEDIAN, MIN, MAX) of one cell is the value of the bucket
  of its public grid (``gateway/sql/analyze/quantiles.py``: one bucket per value of an
  integer column, up to 2^20 buckets) that ``mechanisms.choose_bucket_in_window`` picks
  from the cell's exact bucket counts near the target rank (the database returns only
  those: every other bucket is at the mechanism's level cap), with the query's share
  ε_c for it. Its accuracy is a *rank* interval, computed from public values only
  (``mechanisms.fine_rank_halfwidth``): with 95% probability the chosen bucket holds a
  value whose position among the cell's bounded, clamped values is within ± r of the
  target position p·(n − 1), or is empty and lies between two such values.
- VARIANCE / STDDEV of one cell from its noisy count n, sum S and sum of squares Q (of the
  clamped column): var_pop = Q/n − (S/n)², var_samp = (Q − S²/n)/(n − 1), clamped to
  [0, the largest variance the bounds allow]. Its 95% interval is conservative, not
  approximate: each of the three noises is within its (1 − 0.05/3) half-width with
  probability ≥ 1 − 0.05/3, so all three are with probability ≥ 95% (union bound), and
  on that event interval arithmetic over the three boxes contains the exact variance of
  the bounded values (as rounded to the sums' grids).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

from gateway.core.plan import Measure, OutputColumn, QuantileGrid, QueryPlan
from mechanisms import (
    Noise,
    RankWindow,
    choose_bucket_in_window,
    fine_rank_halfwidth,
    halfwidth,
    quantile_sensitivity,
    window_ranks,
)

Interval = tuple[float, float]


def choose_quantile(grid: QuantileGrid, window: RankWindow, epsilon: Fraction) -> Fraction:
    """The released value of one cell from its exact fine histogram's buckets near the
    target rank. ε-DP (add/remove one unit) for the cell; over all cells a unit's rows are
    at most ``grid.rows_per_unit``, and each row is in one cell, so the choices of all
    cells together are ε-DP too (parallel composition over the cells, each cell's
    utilities moving by the unit's rows there, at most ``grid.rows_per_unit``:
    ``mechanisms.choose_bucket_in_window``, the same distribution as
    ``mechanisms.choose_bucket`` on the whole histogram)."""
    sensitivity = quantile_sensitivity(grid.p, grid.rows_per_unit)
    index = choose_bucket_in_window(window, grid.buckets, grid.p, sensitivity, epsilon)
    return grid.value(index)


def rank_windows(plan: QueryPlan, choices: Sequence[Fraction]) -> tuple[Fraction, ...]:
    """Per quantile output, the ranks either side of its target that its statement must
    return (``mechanisms.window_ranks`` at the quantile's ε: public)."""
    grids = [o.quantile for o in plan.outputs if o.quantile is not None]
    return tuple(
        window_ranks(epsilon, g.buckets, quantile_sensitivity(g.p, g.rows_per_unit))
        for g, epsilon in zip(grids, choices, strict=True)
    )


def window_of(rows: Sequence[Sequence[Any]]) -> RankWindow:
    """(bucket, count, below, n) rows of the statement as a ``RankWindow``."""
    kept = tuple(
        (int(bucket), int(count), int(below))
        for bucket, count, below, _ in rows
        if bucket is not None and count
    )
    n = int(rows[0][3]) if rows else 0
    return RankWindow(n, kept)


def released_quantile(o: OutputColumn, value: Fraction) -> int | float:
    return int(value) if o.type == "integer" else float(value)


def quantile_accuracy(grid: QuantileGrid, epsilon: Fraction) -> dict[str, Any]:
    """The rank interval of a quantile output (public: no data involved)."""
    sensitivity = quantile_sensitivity(grid.p, grid.rows_per_unit)
    r = fine_rank_halfwidth(epsilon, sensitivity, grid.buckets)
    within = f"within ±{r}" if r is not None else "not bounded at this ε"
    return {
        "quantile": float(grid.p),
        "rank_ci95_halfwidth": r,
        "buckets": grid.buckets,
        "bucket_width": float(grid.width),
        "note": (
            f"with 95% probability the released bucket holds a value whose rank is {within} "
            f"of the target rank p·(n−1) among the group's bounded values, or is empty and "
            f"lies between two such values"
        ),
    }


def _variance_bound(m: Measure) -> float:
    assert m.lower is not None and m.upper is not None
    return (m.upper - m.lower) ** 2 / 4


def spread_value(o: OutputColumn, plan: QueryPlan, noisy: Sequence[int]) -> float | None:
    """VARIANCE / STDDEV of one cell from its noisy (sum, sum of squares, count)."""
    s_index, q_index, c_index = o.measures
    total, squares = plan.measures[s_index], plan.measures[q_index]
    n = noisy[c_index]
    samp = o.kind in ("var_samp", "stddev_samp")
    if n <= (1 if samp else 0):
        return None
    s = noisy[s_index] * float(total.resolution)
    q = noisy[q_index] * float(squares.resolution)
    var = (q - s * s / n) / (n - 1) if samp else q / n - (s / n) ** 2
    top = _variance_bound(total) * (n / (n - 1) if samp else 1)
    var = min(max(var, 0.0), top)
    return math.sqrt(var) if o.kind.startswith("stddev") else var


def spread_interval(
    o: OutputColumn, plan: QueryPlan, noises: Sequence[Noise], noisy: Sequence[int]
) -> list[float] | None:
    """A conservative 95% interval for ``spread_value`` (see the module doc)."""
    s_index, q_index, c_index = o.measures
    total, squares = plan.measures[s_index], plan.measures[q_index]
    samp = o.kind in ("var_samp", "stddev_samp")
    coverage = 1 - 0.05 / 3

    def box(j: int, r: float) -> Interval:
        h = halfwidth(noises[j], coverage)
        return ((noisy[j] - h) * r, (noisy[j] + h) * r)

    n_lo, n_hi = box(c_index, 1.0)
    n_lo = max(n_lo, 0.0)
    floor = 1.0 if samp else 0.0
    if n_lo <= floor:
        lo, hi = 0.0, _variance_bound(total) * (2 if samp else 1)
    else:
        s = box(s_index, float(total.resolution))
        q = box(q_index, float(squares.resolution))
        n = (n_lo, n_hi)
        s2 = _square(s)
        if samp:
            lo, hi = _div(_sub(q, _div(s2, n)), (n_lo - 1, n_hi - 1))
        else:
            lo, hi = _sub(_div(q, n), _div(s2, _square(n)))
        top = _variance_bound(total) * (n_lo / (n_lo - 1) if samp else 1)
        lo, hi = min(max(lo, 0.0), top), min(max(hi, 0.0), top)
    if o.kind.startswith("stddev"):
        return [math.sqrt(lo), math.sqrt(hi)]
    return [lo, hi]


def _square(a: Interval) -> Interval:
    lo = 0.0 if a[0] <= 0 <= a[1] else min(a[0] ** 2, a[1] ** 2)
    return (lo, max(a[0] ** 2, a[1] ** 2))


def _sub(a: Interval, b: Interval) -> Interval:
    return (a[0] - b[1], a[1] - b[0])


def _div(a: Interval, b: Interval) -> Interval:
    """a / b for b > 0."""
    ends = [a[0] / b[0], a[0] / b[1], a[1] / b[0], a[1] / b[1]]
    return (min(ends), max(ends))
