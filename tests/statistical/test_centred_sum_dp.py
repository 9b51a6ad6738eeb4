"""Statistical DP test of the centred sum an AVG noises (``gateway/pipeline/noising.py``,
``centred``), false-alarm rate ≤ 1e-6 per test.

An AVG's sum is Σ(x − c) for the grid point c nearest the middle of the bounds, noised
for the sensitivity of the centred values, max(|lower − c|, |upper − c|) — 50 for
[0, 100], half the uncentred 100. The neighbours differ by one person whose value (10⁹)
the SQL clamps to the upper bound, the far end from c: the centred sum moves by exactly
50. Everything up to the noise is the gateway's own: analysis, calibration at ε, the
compiled statement on SQLite, ``centred``; the release is that exact centred sum plus a
draw of the calibrated noise (the AVG's ratio is post-processing of it). A gateway that
calibrates for the centred sensitivity but forgets to centre is refuted by the same test,
and so is one that noises the centred sum with 0.9× the calibrated noise: at 20,000
releases a side the harness's scale test (``dp_harness.noise_scale_test``, false alarm
≤ 1e-6) refutes that with probability ≥ 1 − 1e-6 (the exact binomial power of its best
threshold alone, ``test_the_power_at_0_9x_noise``).
"""

from __future__ import annotations

import itertools
import sqlite3
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from gateway.core.config_load import parse_config
from gateway.core.plan import QueryPlan, QueryRequest
from gateway.pipeline.gateway import Gateway
from gateway.pipeline.noising import centred
from gateway.sql.execute import run_aggregate
from mechanisms import Noise, sample
from tests.statistical.dp_harness import (
    HarnessResult,
    check_release,
    concentration_power,
    noise_pmf_abs,
)

pytestmark = pytest.mark.slow

EPSILON = 1.0
UPPER = 100
SQL = "SELECT AVG(value) FROM people"


def _gateway(root: Path, name: str, extra: bool) -> Gateway:
    db = root / f"{name}.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE people (pid INTEGER PRIMARY KEY, value INTEGER)")
        pid = itertools.count(1)
        rows = [(next(pid), v) for v in (10, 40, 50, 60, 70)]
        if extra:
            rows.append((next(pid), 10**9))
        conn.executemany("INSERT INTO people VALUES (?, ?)", rows)
    raw: dict[str, Any] = {
        "database": {"url": f"sqlite:///{db}"},
        "ledger": {"url": f"sqlite:///{root / (name + '-ledger.db')}"},
        "audit": {"mode": "off"},
        "tables": {
            "people": {
                "privacy_unit": "pid",
                "columns": {
                    "pid": {"type": "integer"},
                    "value": {"type": "integer", "lower": 0, "upper": UPPER},
                },
            }
        },
    }
    return Gateway(parse_config(raw))


@pytest.fixture(scope="module")
def sides(tmp_path_factory: pytest.TempPathFactory) -> tuple[Gateway, Gateway]:
    root = tmp_path_factory.mktemp("centred")
    return _gateway(root, "d0", extra=False), _gateway(root, "d1", extra=True)


def _exact_sum(gw: Gateway, centre: bool) -> tuple[int, Noise]:
    """The AVG's exact sum as the gateway noises it (centred unless told otherwise), and
    the noise the gateway calibrates for it at ε."""
    plan = gw.analyze(SQL)
    assert isinstance(plan, QueryPlan)
    (avg,) = plan.outputs
    s = avg.measures[0]
    assert plan.measures[s].center == 50  # the middle of [0, 100]
    calibration = gw.planner.calibrate(plan, QueryRequest(SQL, EPSILON, 0.0, "laplace"))
    compiled = gw.compile(plan)
    rows = [tuple(r) for r in run_aggregate(gw.engine, compiled.sql, timeout_ms=60_000)]
    exact = centred(plan, rows) if centre else rows
    return int(exact[0][s]), calibration.noises[s]


def _release_many(
    centre: bool, noise_factor: Fraction = Fraction(1)
) -> Callable[[Gateway, int], list[int]]:
    def release_many(gw: Gateway, k: int) -> list[int]:
        value, noise = _exact_sum(gw, centre)
        noise = Noise(noise.mechanism, noise.scale * noise_factor)
        return [value + z for z in sample(noise, k)]

    return release_many


def _check_centred(
    sides: tuple[Gateway, Gateway], many: Callable[[Gateway, int], list[int]]
) -> HarnessResult:
    """The DP check of a centred sum's releases ``many`` at the sum's half of ε, against
    the noise the gateway calibrates and the two sides' exact centred sums."""
    (t0, noise), (t1, _) = _exact_sum(sides[0], True), _exact_sum(sides[1], True)
    return check_release(
        lambda gw: many(gw, 1)[0],
        sides[0],
        sides[1],
        epsilon=EPSILON / 2,
        n=20_000,
        noise=noise,
        true_values=(t0, t1),
        release_many=many,
    )


def test_the_centred_sum_of_an_avg_is_epsilon_dp(sides: tuple[Gateway, Gateway]) -> None:
    many = _release_many(centre=True)
    (t0, noise), (t1, _) = _exact_sum(sides[0], True), _exact_sum(sides[1], True)
    assert (t0, t1) == (230 - 5 * 50, 230 + 100 - 6 * 50)  # moves by 50, not 100
    # calibrated for 50 at the sum's half of ε (the count has the other half)
    assert noise == Noise("laplace", Fraction(50) / (Fraction(EPSILON) / 2))
    # the AVG's ε is split between its sum and its count: the sum alone is ε/2-DP
    result = _check_centred(sides, many)
    assert not result.rejected, result.summary()


def test_a_sum_calibrated_as_centred_but_not_centred_is_refuted(
    sides: tuple[Gateway, Gateway],
) -> None:
    many = _release_many(centre=False)
    result = check_release(
        lambda gw: many(gw, 1)[0],
        sides[0],
        sides[1],
        epsilon=EPSILON / 2,
        n=20_000,
        release_many=many,
    )
    assert result.rejected, result.summary()


def test_the_centred_sum_with_0_9x_noise_is_refuted(sides: tuple[Gateway, Gateway]) -> None:
    many = _release_many(centre=True, noise_factor=Fraction(9, 10))
    result = _check_centred(sides, many)
    assert result.rejected, result.summary()


def test_the_power_at_0_9x_noise() -> None:
    scale = Fraction(50) / (Fraction(EPSILON) / 2)
    top = int(60 * scale + 60)
    claimed = noise_pmf_abs(Noise("laplace", scale), top)
    sharper = noise_pmf_abs(Noise("laplace", scale * Fraction(9, 10)), top)
    # the scale test sees both sides' errors: 2 × 20,000
    assert concentration_power(claimed, sharper, 40_000) >= 1 - 1e-6
