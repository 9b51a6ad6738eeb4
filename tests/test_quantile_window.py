"""The quantile's rank window: the database returns only the buckets near the target
rank, and the mechanism gives every bucket the level it would get from the whole
histogram (``mechanisms.choose_bucket_in_window``).

The checks are exact, not statistical: for many histograms, every bucket's level from
the window equals its level from the whole histogram (so the two mechanisms are one
distribution, and the DP proof of ``choose_bucket`` carries over); the statement the
gateway compiles returns, on SQLite and DuckDB (and PostgreSQL when
``DPGATE_TEST_POSTGRES_URL`` is set), exactly the rows the window says, however the data
lies; and how many rows come back is bounded by public values, whatever the data.
Statistical tests of the windowed mechanism: tests/statistical/test_histogram_quantile_dp.py.
"""

from __future__ import annotations

import math
import os
import random
import sqlite3
from collections.abc import Callable, Iterator, Mapping, Sequence
from fractions import Fraction

import pytest

from gateway.core.config_load import parse_config
from gateway.core.plan import QueryPlan
from gateway.pipeline.cost_model import histogram_returned
from gateway.pipeline.quantiles import rank_windows, window_of
from gateway.sql.analyze import analyze
from gateway.sql.compile import HISTOGRAM_COLUMNS, WINDOW_MARGIN, compile_plan
from mechanisms import RankWindow, quantile_sensitivity, window_ranks
from mechanisms.histogram_quantile import LevelRun, level_cap, level_runs, window_level_runs


def window_like_the_statement(
    counts: Mapping[int, int], p: Fraction, window: Fraction
) -> RankWindow:
    """What the compiled statement returns for one cell (``gateway/sql/compile.py``,
    ``_near_target``), computed the way it computes it: positions summed in bucket
    order, the target p·(n − 1) in doubles, the window widened by the margin."""
    n = sum(counts.values())
    t = (float(n) - 1) * float(p)
    w = float(window) + WINDOW_MARGIN
    kept, below = [], 0
    for j in sorted(counts):
        c = counts[j]
        if c > 0 and below <= t + w and below + c >= t - w:
            kept.append((j, c, below))
        below += c
    return RankWindow(n, tuple(kept))


def _levels(runs: Sequence[LevelRun] | Iterator[LevelRun], buckets: int) -> list[int]:
    out = [-1] * buckets
    for r in runs:
        for j in range(r.start, r.start + r.size):
            assert out[j] == -1, "runs overlap"
            out[j] = r.level
    assert -1 not in out, "runs leave a bucket out"
    return out


def _random_histogram(rng: random.Random, buckets: int) -> dict[int, int]:
    shape = rng.choice(["spread", "clustered", "heavy", "sparse", "empty", "edges", "gaps"])
    n = rng.choice([0, 1, 2, 5, 50, 300, 2000]) if shape != "empty" else 0
    counts: dict[int, int] = {}
    if shape == "gaps":
        return _gapped_histogram(rng, buckets, n)
    for _ in range(n):
        if shape == "clustered":
            j = min(buckets - 1, max(0, int(rng.gauss(buckets / 2, 3))))
        elif shape == "heavy":
            j = rng.choice([0, buckets // 3, buckets // 3 + 1, buckets - 1])
        elif shape == "sparse":
            j = rng.choice([0, buckets - 1, rng.randrange(buckets)])
        elif shape == "edges":
            j = rng.choice([0, buckets - 1])
        else:
            j = rng.randrange(buckets)
        j = min(j, buckets - 1)
        counts[j] = counts.get(j, 0) + 1
    return counts


def _gapped_histogram(rng: random.Random, buckets: int, n: int) -> dict[int, int]:
    """Few values per bucket with empty runs of random lengths (often one bucket)
    between them, so that the window's edges fall next to empty buckets."""
    counts: dict[int, int] = {}
    j = rng.randrange(min(buckets, 4))
    while n > 0 and j < buckets:
        c = min(n, rng.choice([1, 1, 1, 2, 3]))
        counts[j] = c
        n -= c
        j += rng.choice([1, 2, 2, 2, 3, 5])
    return counts


P_VALUES = [
    Fraction(0),
    Fraction(1, 4),
    Fraction(1, 3),
    Fraction(1, 2),
    Fraction(9, 10),
    Fraction(1),
]


def _random_query(
    rng: random.Random, counts: dict[int, int], buckets: int
) -> tuple[Fraction, int, Fraction, Fraction, int, list[int]]:
    """A random (p, rows per unit, ε) for a histogram: with Δ, the level cap and every
    bucket's level over the whole histogram."""
    p = rng.choice(P_VALUES)
    rows = rng.choice([1, 1, 2, 3])
    epsilon = rng.choice([Fraction(1, 10), Fraction(1, 2), Fraction(1), Fraction(4)])
    delta = quantile_sensitivity(p, rows)
    cap = level_cap(epsilon, buckets)
    return (
        p,
        rows,
        epsilon,
        delta,
        cap,
        _levels(level_runs(counts, buckets, p, delta, cap), buckets),
    )


def test_every_bucket_gets_the_level_the_whole_histogram_gives_it() -> None:
    rng = random.Random(34)
    for _ in range(1500):
        buckets = rng.choice([1, 2, 7, 64, 500, 4096])
        counts = _random_histogram(rng, buckets)
        p, rows, epsilon, delta, cap, whole = _random_query(rng, counts, buckets)
        window = window_like_the_statement(counts, p, window_ranks(epsilon, buckets, delta))
        windowed = _levels(window_level_runs(window, buckets, p, delta, cap), buckets)
        assert windowed == whole, (buckets, counts, p, rows, epsilon)


def test_an_empty_bucket_between_the_two_middle_values_is_the_best() -> None:
    """Issue 34's 1M-row median: the two middle values (positions m − 1 and m) are two
    apart with no value between, so the exact median's bucket is empty. It lies in the
    gap whose middle is the target t = m − ½ and scores 0 (level 0); its neighbours, half a
    rank away, are at level ⌈½/Δ⌉ — so it is the likeliest bucket, by a factor b. (Its
    gap's farther end scored it ½ like them before.)"""
    # n = 8: positions 0-2 in bucket 10, 3 in 48, 4 in 50, 5-7 in 90; t = 3.5
    counts = {10: 3, 48: 1, 50: 1, 90: 3}
    buckets, p, epsilon = 101, Fraction(1, 2), Fraction(1)
    for rows in (1, 2, 3):
        delta = quantile_sensitivity(p, rows)
        cap = level_cap(epsilon, buckets)
        whole = _levels(level_runs(counts, buckets, p, delta, cap), buckets)
        assert whole[49] == 0
        assert whole[48] == whole[50] == math.ceil(Fraction(1, 2) / delta) == 1
        assert all(level >= 1 for j, level in enumerate(whole) if j != 49)
        window = _exact_window(counts, p, window_ranks(epsilon, buckets, delta))
        assert _levels(window_level_runs(window, buckets, p, delta, cap), buckets) == whole
    # the same at a million rows, as the bench's table lies around its median
    n_half = 500_000
    big = {0: n_half - 1, 249_998: 1, 250_000: 1, 500_000: n_half - 1}
    delta = quantile_sensitivity(p, 1)
    cap = level_cap(epsilon, 500_001)
    runs = {r.start: r for r in level_runs(big, 500_001, p, delta, cap)}
    assert runs[249_999].level == 0 and runs[249_999].size == 1
    assert runs[249_998].level == runs[250_000].level == 1


def _exact_window(counts: Mapping[int, int], p: Fraction, width: Fraction) -> RankWindow:
    """The buckets whose [below, below + count] meet [t − width, t + width], exactly."""
    n = sum(counts.values())
    t = p * (n - 1)
    kept, below = [], 0
    for j in sorted(counts):
        if below <= t + width and below + counts[j] >= t - width:
            kept.append((j, counts[j], below))
        below += counts[j]
    return RankWindow(n, tuple(kept))


def test_the_window_is_exactly_wide_enough() -> None:
    """With no margin at all the levels still agree (the margin only absorbs the
    statement's rounding), and a window half a rank narrower than W loses a bucket
    below the cap — on data with an empty bucket between every two values, the empty
    bucket just past t + (M − 1)·Δ, scored at its gap's middle, half a rank nearer than
    the next value (``window_ranks_at_cap``); on data without empty buckets, a rank and
    a half narrower does: the test can fail."""
    p, delta, epsilon = Fraction(1, 2), Fraction(1, 2), Fraction(4)
    dense = dict.fromkeys(range(400), 1)  # t = 199.5
    gapped = dict.fromkeys(range(0, 401, 2), 1)  # values in the even buckets; t = 100
    for counts, buckets, short in ((dense, 400, Fraction(3, 2)), (gapped, 401, Fraction(1, 2))):
        cap = level_cap(epsilon, buckets)
        w = window_ranks(epsilon, buckets, delta)
        assert w == (cap - 1) * delta + Fraction(1, 2)
        whole = _levels(level_runs(counts, buckets, p, delta, cap), buckets)
        exact = _exact_window(counts, p, w)
        assert _levels(window_level_runs(exact, buckets, p, delta, cap), buckets) == whole
        narrow = _exact_window(counts, p, w - short)
        assert _levels(window_level_runs(narrow, buckets, p, delta, cap), buckets) != whole


def test_an_exact_window_gives_every_bucket_its_level_on_sparse_histograms() -> None:
    """As the test above, but with the window cut exactly at W (no margin, which would
    hide a window one rank too narrow) on histograms with empty buckets everywhere, so
    that empty runs sit at the window's edges: the empty bucket just past either edge
    must be at the cap or be known."""
    rng = random.Random(3434)
    too_narrow = 0
    for _ in range(1500):
        buckets = rng.choice([7, 64, 500, 4096])
        counts = _gapped_histogram(rng, buckets, rng.choice([1, 2, 5, 50, 300, 2000]))
        p, rows, epsilon, delta, cap, whole = _random_query(rng, counts, buckets)
        w = window_ranks(epsilon, buckets, delta)
        window = _exact_window(counts, p, w)
        windowed = _levels(window_level_runs(window, buckets, p, delta, cap), buckets)
        assert windowed == whole, (buckets, counts, p, rows, epsilon)
        narrow = _exact_window(counts, p, w - Fraction(1, 2))  # (M − 1)·Δ
        if _levels(window_level_runs(narrow, buckets, p, delta, cap), buckets) != whole:
            too_narrow += 1
    assert too_narrow > 10  # the data puts empty buckets at the window's edge (28 times)


def test_a_window_of_buckets_that_are_not_consecutive_is_refused() -> None:
    broken = RankWindow(10, ((3, 2, 4), (5, 1, 7)))  # 4 + 2 ≠ 7: a bucket is missing
    with pytest.raises(ValueError, match="consecutive"):
        window_level_runs(broken, 10, Fraction(1, 2), Fraction(1, 2), 50)


# --- the statement, on real engines -------------------------------------------------

CONFIG = {
    "database": {"url": "sqlite:///unused.db"},
    "ledger": {"url": "sqlite:///unused-ledger.db"},
    "tables": {
        "t": {
            "columns": {
                "g": {"type": "integer", "values": [0, 1, 2]},
                "v": {"type": "integer", "lower": 0, "upper": 5000},
                "x": {"type": "real", "lower": -1.0, "upper": 1.0},
            }
        }
    },
}
Row = tuple[int | None, int | None, float]
#: (query, which rows its WHERE keeps)
QUERIES: list[tuple[str, Callable[[Row], bool]]] = [
    ("SELECT MEDIAN(v) FROM t", lambda r: True),
    (
        "SELECT g, PERCENTILE_CONT(0.9) WITHIN GROUP (ORDER BY v) FROM t GROUP BY g",
        lambda r: True,
    ),
    ("SELECT MIN(x), MAX(v) FROM t", lambda r: True),
    (
        "SELECT g, MEDIAN(x) FROM t WHERE v > 10 GROUP BY g",
        lambda r: r[1] is not None and r[1] > 10,
    ),
]


def _datasets(rng: random.Random) -> Iterator[list[Row]]:
    yield []
    yield [(0, 7, 0.5)]
    yield [
        (rng.choice([0, 1, 2, None]), rng.randrange(5001), rng.uniform(-1, 1)) for _ in range(3000)
    ]
    # clustered, heavy ties, values past the bounds and NULLs
    yield [
        (rng.choice([0, 1]), rng.choice([20, 21, 4000, None, 9000, -5]), 1.0) for _ in range(2000)
    ]
    yield [(2, 2500 + int(rng.gauss(0, 4)), rng.gauss(0, 0.01)) for _ in range(4000)]


def _expected(
    plan: QueryPlan, rows: list[Row], keep: Callable[[Row], bool], windows: Sequence[Fraction]
) -> dict[tuple[int, tuple[object, ...]], RankWindow]:
    """Each (quantile, group) cell's window, from the rows in Python."""
    quantiles = [o for o in plan.outputs if o.quantile is not None]
    grouped = bool(plan.group_keys)
    filtered = [r for r in rows if keep(r)]
    out: dict[tuple[int, tuple[object, ...]], RankWindow] = {}
    for q, o in enumerate(quantiles):
        grid = o.quantile
        assert grid is not None
        column = _column_of(plan, q)
        cells: dict[tuple[object, ...], dict[int, int]] = {}
        for r in filtered:
            key = (r[0],) if grouped else ()
            value = r[column]
            if value is None:
                cells.setdefault(key, {})
                continue
            clamped = min(max(Fraction(value), grid.lower), grid.upper)
            j = min(int((clamped - grid.lower) // grid.width), grid.buckets - 1)
            cell = cells.setdefault(key, {})
            cell[j] = cell.get(j, 0) + 1
        for key, counts in cells.items():
            window = window_like_the_statement(counts, grid.p, windows[q])
            if window.kept:
                out[(q, key)] = window
    return out


def _column_of(plan: QueryPlan, q: int) -> int:
    quantiles = [o for o in plan.outputs if o.quantile is not None]
    measure = plan.measures[quantiles[q].measures[-1]]
    assert measure.expression is not None
    return {"v": 1, "x": 2}[measure.expression.name]


def _engines() -> Iterator[tuple[str, object]]:
    yield "sqlite", None
    yield "duckdb", None
    if os.environ.get("DPGATE_TEST_POSTGRES_URL"):
        yield "postgres", os.environ["DPGATE_TEST_POSTGRES_URL"]


def _run(dialect: str, url: object, rows: list[Row], sql: str) -> list[tuple[object, ...]]:
    if dialect == "sqlite":
        conn = sqlite3.connect(":memory:")
        conn.execute("CREATE TABLE t (g INTEGER, v INTEGER, x REAL)")
        conn.executemany("INSERT INTO t VALUES (?, ?, ?)", rows)
        return [tuple(r) for r in conn.execute(sql).fetchall()]
    if dialect == "duckdb":
        import duckdb

        con = duckdb.connect()
        con.execute("CREATE TABLE t (g BIGINT, v BIGINT, x DOUBLE)")
        if rows:
            con.executemany("INSERT INTO t VALUES (?, ?, ?)", rows)
        return [tuple(r) for r in con.execute(sql).fetchall()]
    import sqlalchemy as sa

    engine = sa.create_engine(str(url))
    schema = f"dpgate_qw_{os.getpid()}"
    with engine.begin() as conn:
        conn.execute(sa.text(f"CREATE SCHEMA IF NOT EXISTS {schema}"))
        conn.execute(sa.text(f"SET search_path TO {schema}"))
        conn.execute(sa.text("DROP TABLE IF EXISTS t"))
        conn.execute(sa.text("CREATE TABLE t (g BIGINT, v BIGINT, x DOUBLE PRECISION)"))
        if rows:
            conn.execute(
                sa.text("INSERT INTO t VALUES (:g, :v, :x)"),
                [{"g": g, "v": v, "x": x} for g, v, x in rows],
            )
        result = [tuple(r) for r in conn.execute(sa.text(sql)).fetchall()]
        conn.execute(sa.text(f"DROP SCHEMA {schema} CASCADE"))
    engine.dispose()
    return result


@pytest.mark.parametrize(("dialect", "url"), list(_engines()))
def test_the_statement_returns_exactly_the_window(dialect: str, url: object) -> None:
    config = parse_config(CONFIG)
    rng = random.Random(7)
    datasets = list(_datasets(rng))
    for text, keep in QUERIES:
        plan = analyze(text, config.tables)
        assert isinstance(plan, QueryPlan)
        quantiles = [o for o in plan.outputs if o.quantile is not None]
        for epsilon in (Fraction(1, 2), Fraction(3)):
            windows = rank_windows(plan, [epsilon] * len(quantiles))
            compiled = compile_plan(plan, config.tables["t"], dialect, rank_windows=windows)
            for rows in datasets:
                got: dict[tuple[int, tuple[object, ...]], list[tuple[object, ...]]] = {}
                for r in _run(dialect, url, rows, compiled.sql):
                    tail = r[len(r) - HISTOGRAM_COLUMNS :]
                    if tail[0] is not None:
                        key = tuple(r[: compiled.n_keys])
                        got.setdefault((int(tail[0]), key), []).append(tail[1:])
                windows_got = {k: window_of(v) for k, v in got.items()}
                expected = _expected(plan, rows, keep, windows)
                normal = {k: RankWindow(w.n, tuple(sorted(w.kept))) for k, w in windows_got.items()}
                assert normal == expected, (dialect, text, epsilon, len(rows))


def test_the_rows_a_quantile_brings_back_are_bounded_by_public_values() -> None:
    """Whatever the data, a cell's window holds at most 2·(W + margin) + 2 buckets; the
    cost model counts that many per cell, never the grid's 2^20."""
    config = parse_config(CONFIG)
    plan = analyze("SELECT MEDIAN(x) FROM t", config.tables)
    assert isinstance(plan, QueryPlan)
    grid = plan.outputs[0].quantile
    assert grid is not None
    rng = random.Random(3)
    w = rank_windows(plan, [Fraction(1)])[0]
    bound = 2 * (int(w) + 1 + WINDOW_MARGIN) + 2
    for _ in range(200):
        counts = _random_histogram(rng, grid.buckets)
        assert len(window_like_the_statement(counts, grid.p, w).kept) <= bound
    spread = dict.fromkeys(range(grid.buckets), 1)  # every bucket holds a value
    assert len(window_like_the_statement(spread, grid.p, w).kept) <= bound
    returned = histogram_returned(plan, 1_000_000)
    assert returned < 20_000 < grid.buckets  # the widest window, not the grid
