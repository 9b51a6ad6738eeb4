"""Per-unit bounding in the compiled SQL against a reference written from its definition
(docs/design.md, invariant 6: influence is bounded in the executed SQL; docs/privacy.md,
"Side channels": the rows read per person).

The compiler picks the cheapest statement for each query — a per-unit count capped at the
bound when a query only counts, one window without an analyst's WHERE, two with one,
QUALIFY on DuckDB — and every form must compute what the definition says, on SQLite,
DuckDB, PostgreSQL, ClickHouse (chDB) and Spark SQL alike:

1. the table is the rows inside the declared domain (here: ``dept`` one of A, B, C or
   NULL); bounded numbers are read clamped;
2. each unit's rows (NULL is one unit's rows) are taken in the order of their declared
   values on the columns the query reads (declared order, ascending, NULL last);
3. with a WHERE, only the first ``max_rows_read_per_unit`` of them are read, and the
   WHERE is evaluated on those; the first ``max_rows_per_unit`` rows that pass are kept
   (without a WHERE: the first ``max_rows_per_unit``);
4. with GROUP BY and ``max_groups_per_unit`` below the row bound, a unit's kept rows in
   its first ``max_groups_per_unit`` keys (ascending, NULL last) are kept;
5. the aggregates run over the kept rows; COUNT(DISTINCT unit) ignores the NULL unit.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import replace
from decimal import Decimal
from typing import Any

import pytest

from gateway.core.config import Config, with_nullability
from gateway.core.config_load import parse_config
from gateway.core.plan import QueryPlan
from gateway.sql.analyze import analyze
from gateway.sql.compile import compile_plan
from gateway.sql.execute import (
    nullability_by_schema,
    open_protected_engine,
    run_aggregate,
    sqlglot_dialect,
)
from tests import engines

DEPTS = ("A", "B", "C")
LOWER, UPPER = 0, 30
COLUMNS = ("pid", "dept", "stay", "year")  # declared order
STAYS = {"pid": "integer", "dept": "text", "stay": "integer", "year": "integer"}


def _rows() -> list[dict[str, Any]]:
    """Unit 1 has 40 rows, unit 2 has 15, units 3..14 one to four; six rows have no unit.
    Some departments are outside the domain (Z) or NULL; stays run past both bounds."""
    rng = random.Random(14)
    counts = {1: 40, 2: 15, **{p: rng.randint(1, 4) for p in range(3, 15)}, None: 6}
    out = []
    for pid, n in counts.items():
        for _ in range(n):
            out.append(
                {
                    "pid": pid,
                    "dept": rng.choice((*DEPTS, "A", "Z", None)),
                    "stay": rng.choice((None, -5, 0, 3, 10, 11, 17, 29, 30, 31, 44)),
                    "year": rng.randint(2019, 2022),
                }
            )
    return out


ROWS = _rows()


def _config(url: str, rows: int, groups: int | None, read: int) -> Config:
    table: dict[str, Any] = {
        "source": "stays",
        "privacy_unit": "pid",
        "max_rows_per_unit": rows,
        "max_rows_read_per_unit": read,
        "columns": {
            "pid": {"type": "integer"},
            "dept": {"type": "text", "values": list(DEPTS)},
            "stay": {"type": "integer", "lower": LOWER, "upper": UPPER},
            "year": {"type": "integer", "lower": 2000, "upper": 2030},
        },
    }
    if groups is not None:
        table["max_groups_per_unit"] = groups
    return parse_config(
        {
            "database": {"url": url},
            "ledger": {"url": "sqlite:///unused-ledger.db"},
            "privacy": {"epsilon": 10.0, "delta": 1e-6, "max_epsilon_per_query": 10.0},
            "tables": {"stays": table},
        }
    )


# -- the reference ------------------------------------------------------------------------

Row = dict[str, Any]


def _clamped(r: Row) -> Row:
    stay = r["stay"]
    return {**r, "stay": None if stay is None else min(max(stay, LOWER), UPPER)}


def _sort_key(columns: tuple[str, ...]) -> Callable[[Row], tuple[Any, ...]]:
    return lambda r: tuple((r[c] is None, r[c] if r[c] is not None else 0) for c in columns)


def reference(
    reads: tuple[str, ...],
    where: Callable[[Row], bool] | None,
    key: Callable[[Row], Any] | None,
    measures: list[Callable[[list[Row]], int]],
    *,
    rows: int,
    groups: int | None,
    read: int,
) -> list[tuple[Any, ...]]:
    units: dict[Any, list[Row]] = defaultdict(list)
    for r in ROWS:
        if r["dept"] in DEPTS or r["dept"] is None:
            units[r["pid"]].append(r)
    return bounded_answer(
        units, reads, where, key, measures, rows=rows, groups=groups, read=read, clamp=_clamped
    )


def bounded_answer(
    units: dict[Any, list[Row]],
    reads: tuple[str, ...],
    where: Callable[[Row], bool] | None,
    key: Callable[[Row], Any] | None,
    measures: list[Callable[[list[Row]], int]],
    *,
    rows: int,
    groups: int | None,
    read: int,
    clamp: Callable[[Row], Row] = lambda r: r,
) -> list[tuple[Any, ...]]:
    """Steps 2 to 5 of the definition on each unit's rows (inside the domain)."""
    kept: list[Row] = []
    for unit_rows in units.values():
        ordered = [clamp(r) for r in sorted(unit_rows, key=_sort_key(reads))]
        if where is not None:
            ordered = [r for r in ordered[:read] if where(r)]
        mine = ordered[:rows]
        if key is not None and groups is not None and groups < rows:
            keys = sorted({key(r) for r in mine}, key=lambda k: (k is None, k or ""))
            mine = [r for r in mine if key(r) in keys[:groups]]
        kept += mine
    if key is None:
        return [tuple(m(kept) for m in measures)]
    by_key: dict[Any, list[Row]] = defaultdict(list)
    for r in kept:
        by_key[key(r)].append(r)
    return sorted(
        ((k, *(m(rs) for m in measures)) for k, rs in by_key.items()), key=lambda t: repr(t)
    )


def n_rows(rs: list[Row]) -> int:
    return len(rs)


def n_units(rs: list[Row]) -> int:
    return len({r["pid"] for r in rs if r["pid"] is not None})


def sum_stay(rs: list[Row]) -> int:
    return sum(r["stay"] for r in rs if r["stay"] is not None)


def n_stay(rs: list[Row]) -> int:
    return sum(1 for r in rs if r["stay"] is not None)


QUERIES: dict[str, tuple[tuple[str, ...], Any, Any, list[Callable[[list[Row]], int]]]] = {
    "SELECT COUNT(*) FROM stays": ((), None, None, [n_rows]),
    "SELECT COUNT(DISTINCT pid) FROM stays": ((), None, None, [n_units]),
    "SELECT COUNT(*), COUNT(DISTINCT pid) FROM stays WHERE stay > 10": (
        ("stay",),
        lambda r: r["stay"] is not None and r["stay"] > 10,
        None,
        [n_rows, n_units],
    ),
    "SELECT COUNT(*) FROM stays WHERE dept = 'A' OR year > 2020": (
        ("dept", "year"),
        lambda r: r["dept"] == "A" or r["year"] > 2020,
        None,
        [n_rows],
    ),
    "SELECT AVG(stay) FROM stays": (("stay",), None, None, [sum_stay, n_stay]),
    "SELECT dept, COUNT(*), SUM(stay) FROM stays GROUP BY dept": (
        ("dept", "stay"),
        None,
        lambda r: r["dept"],
        [n_rows, sum_stay],
    ),
    "SELECT SUM(stay), COUNT(*) FROM stays WHERE year >= 2021": (
        ("stay", "year"),
        lambda r: r["year"] >= 2021,
        None,
        [sum_stay, n_rows],
    ),
    "SELECT dept, COUNT(*) FROM stays WHERE stay BETWEEN 5 AND 35 GROUP BY dept": (
        ("dept", "stay"),
        lambda r: r["stay"] is not None and 5 <= r["stay"] <= 35,
        lambda r: r["dept"],
        [n_rows],
    ),
}
#: (max_rows_per_unit, max_groups_per_unit, max_rows_read_per_unit); where the last two
#: agree, the rows read and passing the WHERE are kept without a second window.
BOUNDS = [(1, None, 3), (3, 2, 5), (5, None, 12), (2, 1, 2), (4, None, 4)]


# -- the databases --------------------------------------------------------------------------


@pytest.fixture(
    scope="module", params=["sqlite", "duckdb", "postgres", *engines.IN_PROCESS_ENGINES]
)
def backend(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, str | None]]:
    """(URL, schema) of a database holding ROWS."""
    yield from engines.table_on(request.param, tmp_path_factory, "stays", STAYS, ROWS)


def _normal(v: Any) -> Any:
    return int(v) if isinstance(v, Decimal | float) else v


@pytest.mark.parametrize(("rows", "groups", "read"), BOUNDS)
@pytest.mark.parametrize("sql", list(QUERIES))
def test_bounded_sql_computes_the_definition(
    sql: str, rows: int, groups: int | None, read: int, backend: tuple[str, str | None]
) -> None:
    url, schema = backend
    config = _config(url, rows, groups, read)
    if schema is not None:
        config = replace(
            config, tables={k: replace(t, schema=schema) for k, t in config.tables.items()}
        )
    engine = open_protected_engine(url, statement_timeout_ms=30_000)
    try:
        tables = with_nullability(config.tables, nullability_by_schema(engine, config.tables))
        plan = analyze(sql, tables)
        assert isinstance(plan, QueryPlan)
        compiled = compile_plan(plan, tables["stays"], sqlglot_dialect(engine))
        got = sorted(
            (
                tuple(_normal(v) for v in r)
                for r in run_aggregate(engine, compiled.sql, timeout_ms=30_000)
            ),
            key=lambda t: repr(t),
        )
    finally:
        engine.dispose()
    reads, where, key, measures = QUERIES[sql]
    expected = reference(reads, where, key, measures, rows=rows, groups=groups, read=read)
    assert got == expected, compiled.sql


@pytest.mark.parametrize("dialect", ["sqlite", "duckdb", "postgres"])
def test_a_read_bound_equal_to_the_row_bound_needs_no_second_window(dialect: str) -> None:
    """Read ``max_rows_per_unit`` rows of each unit and no more: those passing the WHERE
    are the kept rows, so the statement has one window fewer (the test above shows it
    computes the definition)."""
    sql = "SELECT SUM(stay), COUNT(*) FROM stays WHERE year >= 2021"

    def windows(read: int) -> int:
        tables = _config("sqlite:///unused.db", 3, None, read).tables
        plan = analyze(sql, tables)
        assert isinstance(plan, QueryPlan)
        return compile_plan(plan, tables["stays"], dialect).sql.upper().count(" OVER (")

    assert (windows(3), windows(4)) == (1, 2)


def test_the_reference_data_exercises_every_bound() -> None:
    """The test above can only fail if the data needs bounding: a unit past every read and
    row bound, rows without a unit, rows outside the domain, values past both bounds."""
    per_unit: dict[Any, int] = defaultdict(int)
    for r in ROWS:
        per_unit[r["pid"]] += 1
    assert per_unit[1] > max(read for _r, _g, read in BOUNDS)
    assert per_unit[None] > 1
    assert any(r["dept"] == "Z" for r in ROWS) and any(r["dept"] is None for r in ROWS)
    stays = {r["stay"] for r in ROWS}
    assert (
        min(s for s in stays if s is not None) < LOWER
        and max(s for s in stays if s is not None) > UPPER
    )
    # And bounding changes the answers: the unbounded count is larger.
    unbounded = sum(1 for r in ROWS if r["dept"] != "Z")
    bounded = reference((), None, None, [n_rows], rows=1, groups=None, read=3)[0][0]
    assert bounded < unbounded
