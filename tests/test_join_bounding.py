"""Join queries compute the same exact aggregates on SQLite, DuckDB and PostgreSQL, and
what the definition says (docs/design.md, "Joins"; invariant 6: influence is bounded in
the executed SQL, here after the join):

1. each table is its rows inside its declared domain; a lookup (``patients`` through
   its privacy unit, the public ``zips`` through its key) keeps one row per key, the
   first by its declared values (ascending, NULL last) — the data hold a patient with two
   rows and a zip with two regions, which must not multiply anyone's rows;
2. the join, inner or left as written, gives one row per row of the anchor (``visits``,
   or ``patients`` joined to ``zips``) with the lookups' columns (NULL where a left join
   found nothing);
3. per-unit bounding (the anchor's ``max_rows_per_unit``, ``max_groups_per_unit``, read
   bound) then applies to the joined rows exactly as to one table's rows (see
   tests/test_bounding.py): a unit's rows in the order of the declared values the query
   reads, NULL last; the WHERE on the first ``rows_read_bound``; the first
   ``max_rows_per_unit`` that pass; the first ``max_groups_per_unit`` keys.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import replace
from decimal import Decimal
from typing import Any

import pytest
import sqlalchemy as sa

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
from tests.conftest import POSTGRES_URL, drop_postgres_schema, postgres_schema_url
from tests.test_bounding import bounded_answer

Row = dict[str, Any]

PATIENTS: list[Row] = [
    {
        "pid": p,
        "sex": "FM"[p % 2],
        "age": 10 + 7 * p % 80,
        "zip": ("100", "200", "300", "400")[p % 4],
    }
    for p in range(1, 21)
] + [
    {"pid": 7, "sex": "F", "age": 99, "zip": "100"},  # a second row for patient 7
    {"pid": None, "sex": "M", "age": 40, "zip": "200"},
    {"pid": 13, "sex": "X", "age": 50, "zip": "100"},  # outside the domain
]
ZIPS: list[Row] = [
    {"zip": "100", "region": "North"},
    {"zip": "200", "region": "West"},
    {"zip": "200", "region": "South"},  # the key twice: the first by declared values wins
    {"zip": "300", "region": "East"},
    # no region for zip 400: a left join keeps those patients, an inner join drops them
]


def _visits() -> list[Row]:
    out: list[Row] = []
    counts = {1: 12, 2: 5, 99: 4, None: 3, **{p: 1 + p % 4 for p in range(3, 21)}}
    for pid, n in counts.items():
        for i in range(n):
            out.append(
                {
                    "pid": pid,
                    "dept": ("A", "B", "C", "Z")[(i + (pid or 0)) % 4],
                    "cost": (5 * i + 3 * (pid or 1)) % 71,
                }
            )
    return out


VISITS = _visits()


def _config(url: str) -> Config:
    return parse_config(
        {
            "database": {"url": url},
            "ledger": {"url": "sqlite:///unused-ledger.db"},
            "tables": {
                "patients": {
                    "privacy_unit": "pid",
                    "columns": {
                        "pid": {"type": "integer"},
                        "sex": {"type": "text", "values": ["F", "M"]},
                        "age": {"type": "integer", "lower": 0, "upper": 100},
                        "zip": {"type": "text"},
                    },
                    "references": {"zip": "zips.zip"},
                },
                "visits": {
                    "max_rows_per_unit": 3,
                    "max_groups_per_unit": 2,
                    "max_rows_read_per_unit": 4,
                    "columns": {
                        "pid": {"type": "integer"},
                        "dept": {"type": "text", "values": ["A", "B", "C"]},
                        "cost": {"type": "integer", "lower": 0, "upper": 50},
                    },
                    "references": {"pid": "patients.pid"},
                },
                "events": {  # row-level privacy: each row its own unit
                    "columns": {"zip": {"type": "text"}, "kind": {"type": "text"}},
                    "references": {"zip": "zips.zip"},
                },
                "zips": {
                    "public": True,
                    "key": "zip",
                    "columns": {"zip": {"type": "text"}, "region": {"type": "text"}},
                },
            },
        }
    )


# -- the reference ------------------------------------------------------------------------

LOOKUPS = {  # the lookups of each anchor, parents first: (table, via column, key)
    "events": [("zips", "zip", "zip")],
    "visits": [("patients", "pid", "pid"), ("zips", "patients.zip", "zip")],
    "patients": [("zips", "zip", "zip")],
}
DOMAIN: dict[str, Callable[[Row], bool]] = {
    "events": lambda r: True,
    "patients": lambda r: r["sex"] in ("F", "M", None),
    "visits": lambda r: r["dept"] in ("A", "B", "C", None),
    "zips": lambda r: True,
}
EVENTS: list[Row] = [
    {"zip": ("100", "200", "400", None)[i % 4], "kind": "ab"[i % 2]} for i in range(11)
]
STORED = {"patients": PATIENTS, "visits": VISITS, "zips": ZIPS, "events": EVENTS}
BOUNDS = {"visits": (3, 2, 4), "patients": (1, None, 10), "events": (1, None, 10)}


def _first(rows: list[Row], key: str) -> dict[Any, Row]:
    """One row per non-NULL key: the first by declared values."""
    out: dict[Any, Row] = {}
    for r in sorted(rows, key=lambda r: [(r[c] is None, r[c] or 0) for c in r]):
        if r[key] is not None:
            out.setdefault(r[key], r)
    return out


def relation(anchor: str, inner: set[str]) -> list[Row]:
    """The joined rows: one per anchor row inside its domain, and the lookups' columns."""
    rows = [dict(r) for r in STORED[anchor] if DOMAIN[anchor](r)]
    for table, via, key in LOOKUPS[anchor]:
        found = _first([r for r in STORED[table] if DOMAIN[table](r)], key)
        kept = []
        for r in rows:
            match = found.get(r.get(via))
            if match is None and table in inner:
                continue
            for c in STORED[table][0]:
                r[f"{table}.{c}"] = None if match is None else match[c]
            kept.append(r)
        rows = kept
    return rows


def _clamp(v: Any, low: int, high: int) -> Any:
    return None if v is None else min(max(v, low), high)


def reference(
    anchor: str,
    inner: set[str],
    reads: list[str],
    where: Callable[[Row], bool] | None,
    key: Callable[[Row], Any] | None,
    measures: list[Callable[[list[Row]], int]],
) -> list[tuple[Any, ...]]:
    rows_bound, groups_bound, read = BOUNDS[anchor]
    units: dict[Any, list[Row]] = defaultdict(list)
    for i, r in enumerate(relation(anchor, inner)):
        units[r.get("pid", ("row", i))].append(r)  # row-level: each row its own unit
    # steps 2 to 5 of tests/test_bounding.py's definition, on the joined rows
    return bounded_answer(
        units, tuple(reads), where, key, measures, rows=rows_bound, groups=groups_bound, read=read
    )


def n_rows(rs: list[Row]) -> int:
    return len(rs)


def n_units(rs: list[Row]) -> int:
    return len({r["pid"] for r in rs if r["pid"] is not None})


def sum_cost(rs: list[Row]) -> int:
    return sum(_clamp(r["cost"], 0, 50) or 0 for r in rs)


def sum_age(rs: list[Row]) -> int:
    return sum(_clamp(r["age"], 0, 100) or 0 for r in rs)


def n_age(rs: list[Row]) -> int:
    return sum(1 for r in rs if r["age"] is not None)


QUERIES: dict[str, tuple[str, set[str], list[str], Any, Any, list[Any]]] = {
    "SELECT z.region, COUNT(*) FROM events e JOIN zips z ON e.zip = z.zip GROUP BY z.region": (
        "events",
        {"zips"},
        ["zips.region"],
        None,
        lambda r: r["zips.region"],
        [n_rows],
    ),
    "SELECT COUNT(*) FROM events e LEFT JOIN zips z ON e.zip = z.zip WHERE e.kind = 'a'": (
        "events",
        set(),
        ["kind"],
        lambda r: r["kind"] == "a",
        None,
        [n_rows],
    ),
    "SELECT COUNT(*) FROM visits v JOIN patients p ON p.pid = v.pid": (
        "visits",
        {"patients"},
        [],
        None,
        None,
        [n_rows],
    ),
    "SELECT COUNT(*), COUNT(DISTINCT v.pid) FROM visits v LEFT JOIN patients p ON p.pid = v.pid": (
        "visits",
        set(),
        [],
        None,
        None,
        [n_rows, n_units],
    ),
    "SELECT p.sex, COUNT(*) FROM patients p JOIN visits v ON p.pid = v.pid GROUP BY p.sex": (
        "visits",
        {"patients"},
        ["patients.sex"],
        None,
        lambda r: r["patients.sex"],
        [n_rows],
    ),
    "SELECT v.dept, SUM(v.cost) FROM visits v JOIN patients p ON p.pid = v.pid "
    "WHERE p.age > 30 GROUP BY v.dept": (
        "visits",
        {"patients"},
        ["dept", "cost", "patients.age"],
        lambda r: r["patients.age"] > 30,
        lambda r: r["dept"],
        [sum_cost],
    ),
    "SELECT z.region, COUNT(*), COUNT(DISTINCT v.pid) FROM visits v JOIN patients p "
    "ON p.pid = v.pid LEFT JOIN zips z ON z.zip = p.zip GROUP BY z.region": (
        "visits",
        {"patients"},
        ["zips.region"],
        None,
        lambda r: r["zips.region"],
        [n_rows, n_units],
    ),
    "SELECT z.region, COUNT(*) FROM patients p JOIN zips z ON p.zip = z.zip GROUP BY z.region": (
        "patients",
        {"zips"},
        ["zips.region"],
        None,
        lambda r: r["zips.region"],
        [n_rows],
    ),
    "SELECT region, AVG(p.age) FROM patients p LEFT JOIN zips z ON p.zip = z.zip "
    "WHERE p.sex = 'F' OR z.region = 'South' GROUP BY region": (
        "patients",
        set(),
        ["sex", "age", "zips.region"],
        lambda r: r["sex"] == "F" or r["zips.region"] == "South",
        lambda r: r["zips.region"],
        [sum_age, n_age],
    ),
}


# -- the databases --------------------------------------------------------------------------


def _load(engine: sa.Engine, schema: str | None) -> None:
    meta = sa.MetaData(schema=schema)
    text, integer = sa.Text, sa.Integer
    shapes = {
        "patients": [("pid", integer), ("sex", text), ("age", integer), ("zip", text)],
        "visits": [("pid", integer), ("dept", text), ("cost", integer)],
        "zips": [("zip", text), ("region", text)],
        "events": [("zip", text), ("kind", text)],
    }
    tables = {
        name: sa.Table(name, meta, *[sa.Column(c, t) for c, t in cols])
        for name, cols in shapes.items()
    }
    with engine.begin() as conn:
        meta.create_all(conn)
        for name, rows in STORED.items():
            conn.execute(tables[name].insert(), rows)


@pytest.fixture(scope="module", params=["sqlite", "duckdb", "postgres"])
def backend(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, str | None]]:
    """(URL, schema) of a database holding the three tables."""
    if request.param in ("sqlite", "duckdb"):
        if request.param == "duckdb":
            pytest.importorskip("duckdb_engine")
        path = tmp_path_factory.mktemp("joins") / f"joins.{request.param}"
        url = f"{request.param}:///{path}"
        writer = sa.create_engine(url)
        _load(writer, None)
        writer.dispose()
        yield url, None
        return
    if not POSTGRES_URL:
        pytest.skip("set DPGATE_TEST_POSTGRES_URL to run PostgreSQL tests")
    _, schema = postgres_schema_url(POSTGRES_URL)
    try:
        writer = sa.create_engine(POSTGRES_URL)
        _load(writer, schema)
        writer.dispose()
        yield POSTGRES_URL, schema
    finally:
        drop_postgres_schema(POSTGRES_URL, schema)


def _normal(v: Any) -> Any:
    return int(v) if isinstance(v, Decimal | float) else v


@pytest.mark.parametrize("sql", list(QUERIES))
def test_join_sql_computes_the_definition(sql: str, backend: tuple[str, str | None]) -> None:
    url, schema = backend
    config = _config(url)
    tables = {k: replace(t, schema=schema) for k, t in config.tables.items()}
    engine = open_protected_engine(url, statement_timeout_ms=30_000)
    try:
        tables = with_nullability(tables, nullability_by_schema(engine, tables))
        plan = analyze(sql, tables)
        assert isinstance(plan, QueryPlan) and plan.join is not None
        compiled = compile_plan(plan, tables[plan.table], sqlglot_dialect(engine))
        width = compiled.n_keys + compiled.n_measures  # not partition selection's count
        got = sorted(
            (
                tuple(_normal(v) for v in r[:width])
                for r in run_aggregate(engine, compiled.sql, timeout_ms=30_000)
            ),
            key=repr,
        )
    finally:
        engine.dispose()
    anchor, inner, reads, where, key, measures = QUERIES[sql]
    assert got == reference(anchor, inner, reads, where, key, measures), compiled.sql


def test_the_data_needs_every_part_of_the_definition() -> None:
    """The test above can fail only if the data need it: a duplicated lookup key (both
    tables), rows outside a domain, units past the bounds, visits without a patient."""
    joined = relation("visits", {"patients"})
    assert len([p for p in PATIENTS if p["pid"] == 7]) == 2
    assert len([z for z in ZIPS if z["zip"] == "200"]) == 2
    per_unit: dict[Any, int] = defaultdict(int)
    for r in joined:
        per_unit[r["pid"]] += 1
    assert max(per_unit.values()) > BOUNDS["visits"][2]  # past the read bound
    assert len(relation("visits", set())) > len(joined)  # the left join keeps more
    unbounded = reference("visits", {"patients"}, [], None, None, [n_rows])
    assert unbounded[0][0] < len(joined)  # bounding after the join changes the count
