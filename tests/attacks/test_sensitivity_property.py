"""Issue 31, as a property: over random schemas — storage types, affinities, collations,
unique or absent keys on both sides of a join — and random data full of duplicate and
respelled keys, removing any one person moves each exact aggregate dpgate computes (COUNT,
SUM, a join's COUNT, SUM and GROUP BY) by at most its declared sensitivity
(tests/attacks/neighbours.py), on SQLite, DuckDB and PostgreSQL. Example counts are kept
small: each example builds a database and a gateway.
"""

from __future__ import annotations

import contextlib
import sqlite3
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.attacks.neighbours import answers, assert_within_sensitivity, compile_all, config_for
from tests.conftest import POSTGRES_URL, drop_postgres_schema, postgres_schema_url

#: Storage per backend and declared type: what a key or join column may be stored as.
STORAGE = {
    "sqlite": {
        "integer": ["", "INTEGER", "TEXT", "REAL", "NUMERIC", "BIGINT"],
        "text": ["", "TEXT", "TEXT COLLATE NOCASE", "INTEGER"],
    },
    "duckdb": {
        "integer": ["INTEGER", "BIGINT", "DOUBLE", "DECIMAL(30, 20)"],
        "text": ["VARCHAR", "VARCHAR COLLATE NOCASE"],
    },
    "postgres": {
        "integer": ["integer", "bigint", "numeric", "double precision"],
        "text": ["text", "varchar(8)", 'text COLLATE "{schema}".ci'],
    },
}
#: Key values per declared type, with the respellings each backend can store.
SPELLINGS: dict[str, dict[str, list[Any]]] = {
    "sqlite": {"integer": [1, 2, "1", "01", "1.0", " 2", 2.0], "text": ["a", "A", "b", "B", "a "]},
    "duckdb": {"integer": [1, 2, 3], "text": ["a", "A", "b", "B"]},
    "postgres": {"integer": [1, 2, 3], "text": ["a", "A", "b", "B", "a "]},
}
KEYS = ["", "UNIQUE", "PRIMARY KEY"]
#: The anchor has no privacy unit: each row is its own (the neighbour lacks one row).
ROW_LEVEL = "row-level"


@dataclass(frozen=True)
class Case:
    declared: str
    key_storage: str
    key_constraint: str
    anchor_storage: str
    unit_constraint: str
    rows_per_unit: int
    lookup: list[tuple[Any, str]]
    anchor: list[tuple[int, Any, int]]


@st.composite
def cases(draw: st.DrawFn, backend: str) -> Case:
    declared = draw(st.sampled_from(["integer", "text"]))
    spellings = SPELLINGS[backend][declared]
    unit_constraint = draw(st.sampled_from([*KEYS, ROW_LEVEL]))
    rows_per_unit = 1 if unit_constraint else draw(st.sampled_from([1, 2]))
    # distinct stored keys, many of them respellings of one value, so that a UNIQUE key
    # holds them all
    keys = draw(st.lists(st.sampled_from(spellings), min_size=1, max_size=6, unique=True))
    lookup = [(k, draw(st.sampled_from(["g", "h", "i"]))) for k in keys]
    anchor = draw(
        st.lists(
            st.tuples(
                st.integers(1, 6),
                st.one_of(st.none(), st.sampled_from(spellings)),
                st.integers(-1, 4),
            ),
            min_size=1,
            max_size=14,
        )
    )
    return Case(
        declared=declared,
        key_storage=draw(st.sampled_from(STORAGE[backend][declared])),
        key_constraint=draw(st.sampled_from(KEYS)),
        anchor_storage=draw(st.sampled_from(STORAGE[backend][declared])),
        unit_constraint=unit_constraint,
        rows_per_unit=rows_per_unit,
        lookup=lookup,
        anchor=anchor,
    )


QUERIES = [
    "SELECT COUNT(*), SUM(x) FROM people",
    "SELECT COUNT(*), SUM(p.x) FROM people p JOIN look l ON p.k = l.k",
    "SELECT l.g, COUNT(*), SUM(p.x) FROM people p LEFT JOIN look l ON p.k = l.k GROUP BY l.g",
    "SELECT p.x, COUNT(*) FROM people p JOIN look l ON p.k = l.k GROUP BY p.x",
]


def _tables(case: Case, schema: str | None) -> dict[str, Any]:
    extra = {"schema": schema} if schema else {}
    unit: dict[str, Any] = {}
    if case.unit_constraint != ROW_LEVEL:
        unit = {"privacy_unit": "pid", "max_rows_per_unit": case.rows_per_unit}
    return {
        "people": {
            **extra,
            **unit,
            "columns": {
                "pid": {"type": "integer", "nullable": False},
                "k": {"type": case.declared},
                "x": {"type": "integer", "lower": 0, "upper": 3, "values": [0, 1, 2, 3]},
            },
            "references": {"k": "look.k"},
        },
        "look": {
            **extra,
            "public": True,
            "key": "k",
            "columns": {"k": {"type": case.declared}, "g": {"type": "text"}},
        },
    }


def _ddl(case: Case, schema: str = "") -> list[str]:
    prefix = f'"{schema}".' if schema else ""
    key = case.key_storage.format(schema=schema)
    anchor = case.anchor_storage.format(schema=schema)
    unit = "" if case.unit_constraint == ROW_LEVEL else case.unit_constraint
    return [
        f"CREATE TABLE {prefix}look (k {key} {case.key_constraint}, g VARCHAR(4))",
        f"CREATE TABLE {prefix}people (pid INTEGER {unit}, k {anchor}, x INTEGER)",
    ]


def _check(url: str, case: Case, tmp_path: Path, schema: str | None = None) -> None:
    queries = compile_all(
        config_for(url, _tables(case, schema), tmp_path / f"{uuid.uuid4().hex}.db"), QUERIES
    )
    writer = sa.create_engine(url)
    try:
        qs = list(queries.values())
        whole = answers(writer, qs, None, schema)
        if case.unit_constraint == ROW_LEVEL:
            people = [[("people", None, row)] for row in _row_ids(writer, schema)]
        else:
            people = [[("people", "pid", p)] for p in sorted({p for p, _, _ in case.anchor})]
        for person in people:
            after = answers(writer, qs, person, schema)
            for q, b, a in zip(qs, whole, after, strict=True):
                assert_within_sensitivity(q, b, a, person)
    finally:
        writer.dispose()


def _row_ids(writer: sa.Engine, schema: str | None) -> list[Any]:
    row_id = "ctid" if writer.dialect.name == "postgresql" else "rowid"
    table = f'"{schema}".people' if schema else "people"
    with writer.connect() as conn:
        return [r[0] for r in conn.execute(sa.text(f"SELECT {row_id} FROM {table}"))]


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(case=cases("sqlite"))
def test_sqlite_one_person_moves_no_aggregate_past_its_sensitivity(
    case: Case, tmp_path: Path
) -> None:
    path = tmp_path / f"{uuid.uuid4().hex}.db"
    db = sqlite3.connect(path)
    for statement in _ddl(case):
        db.execute(statement)
    for table, rows in (("look", case.lookup), ("people", case.anchor)):
        marks = ", ".join("?" * len(rows[0]))
        for row in rows:
            # a row a key refuses (a duplicate, text in an INTEGER PRIMARY KEY) is left out
            with contextlib.suppress(sqlite3.IntegrityError):
                db.execute(f"INSERT INTO {table} VALUES ({marks})", row)
    db.commit()
    db.close()
    _check(f"sqlite:///{path}", case, tmp_path)


def _load(url: str, case: Case, schema: str = "") -> None:
    engine = sa.create_engine(url)
    prefix = f'"{schema}".' if schema else ""
    try:
        with engine.begin() as conn:
            conn.execute(sa.text(f"DROP TABLE IF EXISTS {prefix}look"))
            conn.execute(sa.text(f"DROP TABLE IF EXISTS {prefix}people"))
            for statement in _ddl(case, schema):
                conn.execute(sa.text(statement))
        cast = {"integer": "BIGINT", "text": "VARCHAR"}[case.declared]
        for table, rows in (("look", case.lookup), ("people", case.anchor)):
            marks = ", ".join(
                f"CAST(:v{i} AS {cast})"
                if (table == "look" and i == 0) or (table == "people" and i == 1)
                else f":v{i}"
                for i in range(len(rows[0]))
            )
            for row in rows:
                # one row per transaction: a row a unique key refuses is left out
                with contextlib.suppress(sa.exc.IntegrityError), engine.begin() as conn:
                    conn.execute(
                        sa.text(f"INSERT INTO {prefix}{table} VALUES ({marks})"),
                        {f"v{i}": v for i, v in enumerate(row)},
                    )
    finally:
        engine.dispose()


@settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(case=cases("duckdb"))
def test_duckdb_one_person_moves_no_aggregate_past_its_sensitivity(
    case: Case, tmp_path: Path
) -> None:
    pytest.importorskip("duckdb_engine")
    url = f"duckdb:///{tmp_path / uuid.uuid4().hex}.duckdb"
    _load(url, case)
    _check(url, case, tmp_path)


@pytest.fixture(scope="module")
def pg_schema() -> Iterator[str]:
    if not POSTGRES_URL:
        pytest.skip("set DPGATE_TEST_POSTGRES_URL to run PostgreSQL tests")
    _, schema = postgres_schema_url(POSTGRES_URL)
    engine = sa.create_engine(POSTGRES_URL)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text(f'CREATE SCHEMA IF NOT EXISTS "{schema}"'))
            conn.execute(
                sa.text(
                    f'CREATE COLLATION "{schema}".ci '
                    "(provider = icu, locale = 'und-u-ks-level2', deterministic = false)"
                )
            )
        yield schema
    finally:
        engine.dispose()
        drop_postgres_schema(POSTGRES_URL, schema)


@settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(case=cases("postgres"))
def test_postgres_one_person_moves_no_aggregate_past_its_sensitivity(
    case: Case, pg_schema: str, tmp_path: Path
) -> None:
    assert POSTGRES_URL is not None
    _load(POSTGRES_URL, case, pg_schema)
    _check(POSTGRES_URL, case, tmp_path, pg_schema)
