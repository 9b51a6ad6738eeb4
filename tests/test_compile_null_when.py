"""``null_when`` is enforced by the compiled SQL, never taken on the config's word: a row
whose column is NULL where its declared condition does not hold (or holds a value where
it does) is left out of every query, on SQLite, DuckDB and PostgreSQL, with the condition
read as every query reads its columns (bounded numbers clamped). So a person outside the
declared domain changes no answer — the auditor may take the regions they would fill to
be empty (tests/test_audit_null_when.py)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from gateway.core.config_load import parse_config
from gateway.core.errors import AuditRefused
from gateway.core.plan import QueryPlan, QueryRequest
from gateway.pipeline.gateway import Gateway
from gateway.sql.compile import compile_plan
from gateway.sql.execute import run_aggregate
from tests import engines
from tests.conftest import ADMIN_KEY

COLUMNS = {
    "person_id": "integer",
    "age": "integer",
    "employment": "text",
    "occupation": "text",
    "hours_worked": "integer",
}
EMPLOYMENT = ["Employed", "Unemployed", "Not in labour force"]
OCCUPATIONS = ["Managers", "Clerical", "Elementary"]
#: Employment is asked from 16 on; occupation and hours of the employed only.
NOT_EMPLOYED = "employment IS NULL OR employment <> 'Employed'"


def _config(url: str, schema: str | None, ledger: Path, age: tuple[int, int]) -> dict[str, Any]:
    return {
        "database": {"url": url},
        "ledger": {"url": f"sqlite:///{ledger}?synchronous=normal"},
        "privacy": {"max_epsilon_per_query": 1.0},
        "execution": {"timing": "off"},
        "tables": {
            "persons": {
                "privacy_unit": "person_id",
                **({"schema": schema} if schema else {}),
                "columns": {
                    "person_id": {"type": "integer", "nullable": False},
                    "age": {"type": "integer", "lower": age[0], "upper": age[1]},
                    "employment": {"type": "text", "values": EMPLOYMENT, "null_when": "age < 16"},
                    "occupation": {
                        "type": "text",
                        "values": OCCUPATIONS,
                        "null_when": NOT_EMPLOYED,
                    },
                    "hours_worked": {
                        "type": "integer",
                        "lower": 0,
                        "upper": 99,
                        "null_when": NOT_EMPLOYED,
                    },
                },
            }
        },
    }


def _gateway(
    url: str, schema: str | None, folder: Path, age: tuple[int, int] = (0, 100)
) -> Gateway:
    folder.mkdir(exist_ok=True)
    return Gateway(parse_config(_config(url, schema, folder / "ledger.db", age)))


def exact(gateway: Gateway, sql: str) -> dict[tuple[Any, ...], tuple[Any, ...]]:
    """The exact aggregates of the statement compiled for ``sql``, by group key."""
    plan = gateway.analyze(sql)
    assert isinstance(plan, QueryPlan)
    compiled = compile_plan(plan, gateway.config.tables[plan.table], gateway.dialect)
    rows = run_aggregate(gateway.engine, compiled.sql, timeout_ms=60_000)
    return {tuple(r[: compiled.n_keys]): tuple(r[compiled.n_keys :]) for r in rows}


def _row(
    pid: int, age: int, employment: str | None, occupation: str | None, hours: int | None
) -> dict[str, Any]:
    return dict(zip(COLUMNS, (pid, age, employment, occupation, hours), strict=True))


#: Rows inside the declared domain at ages 0–100.
HONEST = [
    _row(1, 30, "Employed", "Managers", 40),
    _row(2, 40, "Unemployed", None, None),
    _row(3, 10, None, None, None),
    _row(4, 70, "Not in labour force", None, None),
]
#: Rows outside it, each in its own way.
OUTSIDE = [
    _row(5, 35, "Unemployed", "Clerical", None),  # an occupation, not employed
    _row(6, 45, "Employed", None, 38),  # employed, no occupation
    _row(7, 12, "Unemployed", None, None),  # an employment status under 16
    _row(8, 50, None, None, None),  # none from 16 on
    _row(9, -3, "Employed", "Managers", 20),  # -3 reads 0: under 16, employed
    _row(10, 25, "Employed", "Clerical", None),  # employed, no hours
]


@pytest.fixture(params=["sqlite", "duckdb", pytest.param("postgres", marks=pytest.mark.postgres)])
def backend(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, str | None]]:
    yield from engines.table_on(
        request.param, tmp_path_factory, "persons", COLUMNS, HONEST + OUTSIDE
    )


def test_rows_outside_a_declared_condition_are_left_out_of_every_query(
    backend: tuple[str, str | None], tmp_path: Path
) -> None:
    url, schema = backend
    gateway = _gateway(url, schema, tmp_path)
    assert exact(gateway, "SELECT COUNT(*) FROM persons") == {(): (4,)}
    assert exact(gateway, "SELECT occupation, COUNT(*) FROM persons GROUP BY occupation") == {
        ("Managers",): (1,),
        (None,): (3,),
    }
    assert exact(gateway, "SELECT SUM(hours_worked) FROM persons") == {(): (40,)}
    assert exact(
        gateway, "SELECT COUNT(*) FROM persons WHERE age < 16 AND employment IS NOT NULL"
    ) == {(): (0,)}


def test_the_condition_reads_bounded_numbers_clamped_as_every_query_does(
    backend: tuple[str, str | None], tmp_path: Path
) -> None:
    """Declared ages 16–100, so ``age < 16`` never holds (a stored 10 reads 16, as the
    auditor's cells have it): employment is never NULL, and the child without one is
    outside; the -3 and the 12 read 16, and keep their employment status."""
    url, schema = backend
    gateway = _gateway(url, schema, tmp_path, age=(16, 100))
    # kept: 1, 2, 4, and 7 and 9 (ages 12 and -3 read 16); 3 and 8 have no employment
    assert exact(gateway, "SELECT occupation, COUNT(*) FROM persons GROUP BY occupation") == {
        ("Managers",): (2,),
        (None,): (3,),
    }
    assert exact(gateway, "SELECT SUM(hours_worked) FROM persons") == {(): (60,)}
    assert exact(gateway, "SELECT COUNT(*) FROM persons WHERE employment IS NULL") == {(): (0,)}


def test_a_joined_table_keeps_its_declared_domain(tmp_path: Path) -> None:
    """``persons`` as the lookup of ``jobs`` (one row per job, on the privacy unit): its
    rows outside the declared domain match nothing, so their jobs are no one's."""
    db = tmp_path / "jobs.db"
    with sqlite3.connect(db) as conn:
        conn.execute(f"CREATE TABLE persons ({', '.join(COLUMNS)})")
        conn.executemany(
            f"INSERT INTO persons VALUES ({', '.join('?' for _ in COLUMNS)})",
            [tuple(r.values()) for r in HONEST + OUTSIDE],
        )
        conn.execute("CREATE TABLE jobs (person_id INTEGER, wage INTEGER)")
        conn.executemany(
            "INSERT INTO jobs VALUES (?, 1000)", [(r["person_id"],) for r in HONEST + OUTSIDE]
        )
    raw = _config(f"sqlite:///{db}", None, tmp_path / "ledger.db", (0, 100))
    raw["tables"]["jobs"] = {
        "max_rows_per_unit": 3,
        "references": {"person_id": "persons.person_id"},
        "columns": {"person_id": {"type": "integer"}, "wage": {"type": "integer"}},
    }
    gateway = Gateway(parse_config(raw))
    sql = (
        "SELECT p.occupation, COUNT(*) FROM jobs j JOIN persons p "
        "ON j.person_id = p.person_id GROUP BY p.occupation"
    )
    assert exact(gateway, sql) == {("Managers",): (1,), (None,): (3,)}


def test_the_domain_filter_is_in_the_statement_on_every_backend(tmp_path: Path) -> None:
    gateway = _gateway(f"sqlite:///{tmp_path / 'none.db'}", None, tmp_path)
    plan = gateway.analyze("SELECT occupation, AVG(hours_worked) FROM persons GROUP BY 1")
    assert isinstance(plan, QueryPlan)
    table = gateway.config.tables["persons"]
    for dialect, q in (("sqlite", '"'), ("postgres", '"'), ("duckdb", '"'), ("spark", "`")):
        sql = compile_plan(plan, table, dialect).sql
        occupation = (
            f"CASE WHEN ({q}employment{q} IS NULL OR {q}employment{q} <> 'Employed') THEN 1 "
            f"ELSE 0 END = CASE WHEN {q}occupation{q} IS NULL THEN 1 ELSE 0 END"
        )
        age = f"CASE WHEN {q}age{q} < 0 THEN 0 WHEN {q}age{q} > 100 THEN 100 ELSE {q}age{q} END"
        assert occupation in sql, (dialect, sql)
        assert f"CASE WHEN ({age} < 16) THEN 1 ELSE 0 END = CASE WHEN {q}employment{q}" in sql


# -- the attack: a person outside the declared domain -------------------------------------


def _population() -> list[dict[str, Any]]:
    """200 people inside the declared domain, deterministic."""
    rows = []
    for pid in range(1, 201):
        age = 5 + (pid * 37) % 90
        employment = None if age < 16 else EMPLOYMENT[pid % 3]
        employed = employment == "Employed"
        occupation = OCCUPATIONS[pid % 3 if pid % 5 else 0] if employed else None
        rows.append(_row(pid, age, employment, occupation, 30 + pid % 15 if employed else None))
    return rows


#: Queries over everything the declaration ties together, among them the differencing
#: pair that would isolate a person with an occupation who is not employed.
QUERIES = [
    "SELECT COUNT(*) FROM persons",
    "SELECT occupation, COUNT(*) FROM persons WHERE occupation = 'Managers' GROUP BY occupation",
    "SELECT COUNT(*) FROM persons WHERE occupation = 'Managers'",
    "SELECT COUNT(*) FROM persons WHERE occupation = 'Managers' AND employment = 'Employed'",
    "SELECT employment, occupation, COUNT(*) FROM persons GROUP BY 1, 2",
    "SELECT occupation, AVG(hours_worked), COUNT(hours_worked) FROM persons GROUP BY 1",
    "SELECT SUM(hours_worked) FROM persons WHERE employment <> 'Employed'",
    "SELECT COUNT(*) FROM persons WHERE employment IS NULL AND age >= 16",
]


def test_a_person_outside_the_declared_domain_changes_no_answer(
    tmp_path_factory: pytest.TempPathFactory,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two neighbouring databases: the same population, and the same with one more
    person who is unemployed yet has an occupation and hours (no such row is in the
    declared domain). Every query's exact aggregates are the same on both — so the
    differencing pair ``occupation = 'Managers'`` minus ``… AND employment =
    'Employed'``, which the auditor answers (the two are one region by declaration),
    learns nothing about that person."""
    monkeypatch.setenv("DPGATE_ADMIN_KEY", ADMIN_KEY)
    planted = _row(999, 33, "Unemployed", "Managers", 40)
    honest = engines.table_on("sqlite", tmp_path_factory, "persons", COLUMNS, _population())
    with_planted = engines.table_on(
        "sqlite", tmp_path_factory, "persons", COLUMNS, [*_population(), planted]
    )
    (url, _), (planted_url, _) = next(honest), next(with_planted)
    without, with_person = (
        _gateway(url, None, tmp_path / "a"),
        _gateway(planted_url, None, tmp_path / "b"),
    )
    for sql in QUERIES:
        assert exact(without, sql) == exact(with_person, sql), sql
    with sa.create_engine(planted_url).connect() as conn:  # the row is there, all the same
        assert (
            conn.execute(sa.text("SELECT COUNT(*) FROM persons WHERE person_id = 999")).scalar()
            == 1
        )
    # the auditor answers the pair: with the declaration it is one region twice
    with_person.ledger.create_analyst("mallory", 10.0, 1e-6)
    answered = 0
    for sql in QUERIES[2:4]:
        try:
            with_person.query("mallory", QueryRequest(sql, 1.0, 0.0, "laplace"))
            answered += 1
        except AuditRefused:
            pass
    assert answered == 2
