"""The statistical DP test through the whole query path (analysis, compiled SQL with
bounding and clamping, execution on SQLite, noising, release), on neighbouring databases.

How 20,000 releases stay fast: one query groups a table by ``bucket`` (1,000 declared
values), and every bucket is its own pair of neighbours — bucket b holds c people in D
and c + 1 in D′ (for SUM: the extra person has value ``extreme``). Cells are computed by
the same statement, but each cell's value depends only on its bucket's rows and gets its
own independent noise, so the 1,000 cells of one query are 1,000 independent releases
of the per-cell mechanism on neighbours. 20 queries per database give N = 20,000.

The harness (tests/statistical/dp_harness.py) has false-alarm rate ≤ 1e-6 per test, so a
correct gateway fails this test with probability ≤ 2e-6. The same test is shown to reject
a gateway whose SUM clamp is missing.
"""

from __future__ import annotations

import itertools
import sqlite3
from collections.abc import Iterator
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from gateway.core.plan import QueryRequest
from mechanisms import Noise
from tests.statistical.dp_harness import check_release
from tests.statistical.gateway_neighbours import Side, side

BUCKETS = 1000
PEOPLE_PER_BUCKET = 3
UPPER = 100  # declared bound of `value`
EXTREME = 10**9  # what the neighbour's extra person has in `value`
EPSILON = 1.0
N = 20_000
PILOT = 2_000


def _build(path: Path, extra: bool) -> None:
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE people (pid INTEGER PRIMARY KEY, bucket INTEGER, value INTEGER)")
        rows = []
        pid = itertools.count(1)
        for b in range(BUCKETS):
            for _ in range(PEOPLE_PER_BUCKET):
                rows.append((next(pid), b, 50))
            if extra:
                rows.append((next(pid), b, EXTREME))
        conn.executemany("INSERT INTO people VALUES (?, ?, ?)", rows)


def _sides(root: Path) -> tuple[Side, Side]:
    table = {
        "privacy_unit": "pid",
        "columns": {
            "pid": {"type": "integer"},
            "bucket": {"type": "integer", "values": list(range(BUCKETS))},
            "value": {"type": "integer", "lower": 0, "upper": UPPER},
        },
    }
    return (
        side(root, "d0", lambda db: _build(db, extra=False), table),
        side(root, "d1", lambda db: _build(db, extra=True), table),
    )


def _release_many(aggregate: str) -> Any:
    def release_many(side: Side, k: int) -> list[int]:
        out: list[int] = []
        while len(out) < k:
            # A distinct text each time (always true, different canonical SQL): no cache hits.
            i = next(side.counter)
            sql = f"SELECT bucket, {aggregate} FROM people WHERE bucket > -{i + 1} GROUP BY bucket"
            release = side.gateway.query("tester", QueryRequest(sql, EPSILON, 0.0, "laplace"))
            out.extend(int(row[1]) for row in release.rows)
        return out[:k]

    return release_many


@pytest.fixture(scope="module")
def neighbours(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Side, Side]]:
    yield _sides(tmp_path_factory.mktemp("dp"))


def _check(
    neighbours: tuple[Side, Side], aggregate: str, noise: Noise, truth: tuple[int, int]
) -> Any:
    many = _release_many(aggregate)
    return check_release(
        lambda side: many(side, 1)[0],
        neighbours[0],
        neighbours[1],
        epsilon=EPSILON,
        n=N,
        n_pilot=PILOT,
        noise=noise,
        true_values=truth,
        release_many=many,
    )


def test_count_through_the_gateway_is_epsilon_dp(neighbours: tuple[Side, Side]) -> None:
    result = _check(
        neighbours,
        "COUNT(*)",
        Noise("laplace", Fraction(1) / Fraction(EPSILON)),
        (PEOPLE_PER_BUCKET, PEOPLE_PER_BUCKET + 1),
    )
    assert not result.rejected, result.summary()


def test_clamped_sum_through_the_gateway_is_epsilon_dp(neighbours: tuple[Side, Side]) -> None:
    result = _check(
        neighbours,
        "SUM(value)",
        Noise("laplace", Fraction(UPPER) / Fraction(EPSILON)),
        (50 * PEOPLE_PER_BUCKET, 50 * PEOPLE_PER_BUCKET + UPPER),
    )
    assert not result.rejected, result.summary()


def test_the_same_test_catches_a_missing_clamp(
    neighbours: tuple[Side, Side], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Break the compiler so SUM is not clamped: the neighbour's 10⁹ must be caught."""
    import gateway.sql.compile as compile_module
    import gateway.sql.portable as portable_module

    monkeypatch.setattr(portable_module, "clamped", lambda col: False)
    original = compile_module._measure_input

    def unclamped(m: Any, table: Any, dialect: str) -> Any:
        if m.kind == "sum" and m.expression is not None:
            return compile_module.portable(m.expression, table, dialect)
        return original(m, table, dialect)

    monkeypatch.setattr(compile_module, "_measure_input", unclamped)
    many = _release_many("SUM(value)")
    result = check_release(
        lambda side: many(side, 1)[0],
        neighbours[0],
        neighbours[1],
        epsilon=EPSILON,
        n=2_000,
        n_pilot=500,
        release_many=many,
    )
    assert result.rejected, result.summary()
