"""Statistical DP test of partition selection by the count's own noise, through the whole
query path (analysis, compiled SQL, SQLite, noising, release); false-alarm rate ≤ 1e-6.

``COUNT(*) … GROUP BY tag`` where ``tag`` has no declared values: a group is released iff
its noisy COUNT(*), drawn once at the query's full ε, reaches the threshold τ, and that
same noisy count is what is released. Each of 1,000 tags is its own pair of neighbours:
τ − 1 people in D and τ in D′, so whether the group appears at all is in play on both
sides (a withheld group is released as the value ``WITHHELD``, below every count, which
the harness's threshold events treat like any value). One query gives 1,000 independent
releases of the per-group mechanism.

The same harness refutes the mechanism when the count's noise is 0.9× or 0.5× of the
calibrated one (threshold unchanged), at the same 60,000 releases per side. The power at
that size, from 200 runs of the harness on simulated releases of the same mechanism
(discrete Laplace of scale 1 on counts τ − 1 and τ, τ = 15): the refuting margin of the
harness was 0.0445 ± 0.0048 (mean ± sd; least 0.033) at 0.9× and 0.531 ± 0.004 at 0.5×,
so a miss would take a margin ≥ 9 sd below its mean; at the calibrated noise it was
−0.0071 ± 0.0011 (never refuted, as the 1e-6 false-alarm bound says). N was 200,000;
60,000 keeps both refutations certain for all practical purposes at 62 queries a side
and test instead of 202. A group that exists only because of the added person is covered
by ``tests/statistical/test_mechanisms_dp.py`` (its release probability against the
charged δ).
"""

from __future__ import annotations

import dataclasses
import itertools
import sqlite3
from collections.abc import Callable, Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

import gateway.pipeline.planning as planning_module
from gateway.core.plan import QueryRequest
from mechanisms import Noise, QueryCalibration, Sensitivity, calibrate_query
from tests.statistical.dp_harness import check_release
from tests.statistical.gateway_neighbours import Side, side

pytestmark = pytest.mark.slow

TAGS = 1000
EPSILON = 1.0
DELTA = 1e-6
N = 60_000  # releases per side (see the module doc for the power at this size)
PILOT = 2_000
WITHHELD = -(2**62)
ONE = Sensitivity(Fraction(1), Fraction(1), Fraction(1))
THRESHOLD = calibrate_query(
    "laplace", EPSILON, DELTA, [ONE], max_groups_per_unit=1, selector=0
).selection.threshold  # type: ignore[union-attr]


def _build(path: Path, people: int) -> None:
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE people (pid INTEGER PRIMARY KEY, tag TEXT, k INTEGER)")
        pid = itertools.count(1)
        rows = [(next(pid), f"t{t:04d}", 0) for t in range(TAGS) for _ in range(people)]
        conn.executemany("INSERT INTO people VALUES (?, ?, ?)", rows)


def _sides(root: Path) -> tuple[Side, Side]:
    table = {
        "privacy_unit": "pid",
        "max_groups_per_unit": 1,
        "columns": {"pid": {"type": "integer"}, "tag": {"type": "text"}, "k": {"type": "integer"}},
    }
    return (
        side(root, "d0", lambda db: _build(db, THRESHOLD - 1), table),
        side(root, "d1", lambda db: _build(db, THRESHOLD), table),
    )


def _release_many(side: Side, k: int) -> list[int]:
    out: list[int] = []
    while len(out) < k:
        i = next(side.counter)  # a distinct text each time: no cache hits
        sql = f"SELECT tag, COUNT(*) FROM people WHERE k > -{i + 1} GROUP BY tag"
        release = side.gateway.query("tester", QueryRequest(sql, EPSILON, DELTA, "laplace"))
        released = {row[0]: int(row[1]) for row in release.rows}
        out.extend(released.get(f"t{t:04d}", WITHHELD) for t in range(TAGS))
    return out[:k]


@pytest.fixture(scope="module")
def neighbours(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Side, Side]]:
    yield _sides(tmp_path_factory.mktemp("selection"))


def _check(neighbours: tuple[Side, Side]) -> Any:
    return check_release(
        lambda side: _release_many(side, 1)[0],
        neighbours[0],
        neighbours[1],
        epsilon=EPSILON,
        delta=DELTA,
        n=N,
        n_pilot=PILOT,
        release_many=_release_many,
    )


def _narrower(factor: Fraction) -> Callable[..., QueryCalibration]:
    """The real calibration with the counts' noise scaled by ``factor`` (τ unchanged)."""
    original = planning_module.calibrate_with_choices

    def calibrate(*args: Any, **kwargs: Any) -> QueryCalibration:
        cal = original(*args, **kwargs)
        noises = tuple(Noise(n.mechanism, n.scale * factor) for n in cal.noises)
        selection = cal.selection
        assert selection is not None and selection.measure is not None
        selection = dataclasses.replace(selection, noise=noises[selection.measure])
        return dataclasses.replace(cal, noises=noises, selection=selection)

    return calibrate


def test_own_count_selection_is_not_refuted_at_its_epsilon(
    neighbours: tuple[Side, Side],
) -> None:
    planned = neighbours[0].gateway.planner.plan(
        QueryRequest("SELECT tag, COUNT(*) FROM people GROUP BY tag", EPSILON, DELTA, "laplace")
    )
    selection = planned.calibration.selection  # type: ignore[union-attr]
    assert selection is not None and selection.measure == 0  # the count selects itself
    assert selection.threshold == THRESHOLD
    result = _check(neighbours)
    assert not result.rejected, result.summary()


@pytest.mark.parametrize("factor", [Fraction(9, 10), Fraction(1, 2)])
def test_own_count_selection_with_less_noise_is_refuted(
    neighbours: tuple[Side, Side], monkeypatch: pytest.MonkeyPatch, factor: Fraction
) -> None:
    monkeypatch.setattr(planning_module, "calibrate_with_choices", _narrower(factor))
    result = _check(neighbours)
    assert result.rejected, result.summary()
