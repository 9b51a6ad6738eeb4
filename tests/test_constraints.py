"""Columns whose domain the database enforces (gateway/sql/constraints.py): the compiled SQL
leaves them out of its domain filter, and only when the catalogue guarantees what the
filter would check — NOT NULL where the domain has no NULL, a CHECK admitting only
declared values. The answers stay those of the filtered query."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from gateway.core.config import Config, TableConfig, with_enforced_domains
from gateway.core.config_load import parse_config
from gateway.core.plan import QueryPlan
from gateway.sql.analyze import analyze
from gateway.sql.compile import compile_plan
from gateway.sql.constraints import admitted_by_checks, bounded_columns, enforced_columns
from gateway.sql.execute import (
    domains_enforced_by_schema,
    open_protected_engine,
    run_aggregate,
    sqlglot_dialect,
)
from tests.conftest import drop_postgres_schema, postgres_schema_url

# -- reading CHECK texts --------------------------------------------------------------------


def test_check_texts_are_read_into_value_sets_and_bounds() -> None:
    pg = admitted_by_checks(
        [
            "a = ANY (ARRAY[0::bigint, 1::bigint])",
            "b >= 1 AND b <= 16",
            "c = ANY (ARRAY['x'::text, 'y'::text])",
            "(e > -1) AND (e < 3)",
        ],
        "postgres",
    )
    assert pg["a"].values == frozenset({0, 1})
    assert (pg["b"].lower, pg["b"].upper) == (1, 16)
    assert pg["c"].values == frozenset({"x", "y"})
    assert pg["e"].within([0, 1, 2], integral=True)
    assert not pg["e"].within([0, 1], integral=True)
    sqlite = admitted_by_checks(["a IN (0,1)", "b BETWEEN 1 AND 16", "d = 'only'"], "sqlite")
    assert sqlite["a"].values == frozenset({0, 1})
    assert sqlite["d"].values == frozenset({"only"})
    # an interval is a set of integers only where storage is integral
    assert sqlite["b"].within(range(1, 17), integral=True)
    assert not sqlite["b"].within(range(1, 17), integral=False)
    duck = admitted_by_checks(["(a IN (0, 1))", "(b BETWEEN 1 AND 16)"], "duckdb")
    assert duck["a"].values == frozenset({0, 1})


def test_what_a_check_does_not_say_for_certain_adds_nothing() -> None:
    admitted = admitted_by_checks(
        ["a IN (0, 1) OR a = 5", "NOT b IN (1, 2)", "length(c) < 3", "not sql at all ((("],
        "postgres",
    )
    assert admitted == {}
    # a conjunction narrows: both constraints hold
    both = admitted_by_checks(["a IN (0, 1, 2)", "a IN (1, 2, 3)"], "postgres")
    assert both["a"].values == frozenset({1, 2})


def test_a_column_is_enforced_only_when_the_catalogue_guarantees_its_whole_domain() -> None:
    declared: dict[str, tuple[tuple[Any, ...] | None, bool]] = {
        "sex": ((0, 1), False),  # values, no NULL
        "wide": ((0, 1), False),  # CHECK admits 2 as well
        "nullable_values": ((0, 1), True),  # NULL in the domain: the CHECK suffices
        "no_notnull": ((0, 1), False),  # CHECK, but the catalogue allows NULL
        "flag": ((False, True), False),  # BOOLEAN storage
        "plain": (None, False),  # only NOT NULL to check
        "open": (None, True),  # no filter at all
    }
    catalogue = {
        "sex": (True, True, False),
        "wide": (True, True, False),
        "nullable_values": (False, True, False),
        "no_notnull": (False, True, False),
        "flag": (True, False, True),
        "plain": (True, False, False),
        "open": (False, False, False),
    }
    checks = [
        "sex IN (0, 1)",
        "wide IN (0, 1, 2)",
        "nullable_values BETWEEN 0 AND 1",
        "no_notnull IN (0, 1)",
    ]
    assert enforced_columns(declared, catalogue, checks, "postgres") == {
        "sex",
        "nullable_values",
        "flag",
        "plain",
        "open",
    }


# -- the catalogue and the compiled SQL -----------------------------------------------------

_TABLE = """
CREATE TABLE people (
    pid INTEGER NOT NULL,
    sex INTEGER NOT NULL CHECK (sex IN (0, 1)),
    educ INTEGER NOT NULL CHECK (educ BETWEEN 1 AND 4),
    grade INTEGER NOT NULL CHECK (grade IN (1, 2, 3)),
    income INTEGER CHECK (income BETWEEN 0 AND 1000),
    score INTEGER CHECK (score >= 0 AND score <= 2000)
)
"""
_ROWS = [(i, i % 2, 1 + i % 4, 1 + i % 3, (i * 37) % 1000, (i * 53) % 2001) for i in range(1, 201)]
_YAML = """
database: {url: "%s"}
ledger: {url: "sqlite:///%s"}
tables:
  people:
    privacy_unit: pid
    max_rows_per_unit: 1
    columns:
      pid: {type: integer}
      sex: {type: integer, values: [0, 1]}
      educ: {type: integer, values: [1, 2, 3, 4]}
      grade: {type: integer, values: [1, 2]}
      income: {type: integer, lower: 0, upper: 1000}
      score: {type: integer, lower: 0, upper: 1000}
"""


def _config(url: str, tmp_path: Path) -> Config:
    import yaml

    return parse_config(yaml.safe_load(_YAML % (url, tmp_path / "ledger.db")))


def _fill(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        conn.exec_driver_sql(_TABLE)
        conn.execute(
            sa.text("INSERT INTO people VALUES (:p, :s, :e, :g, :i, :c)"),
            [dict(zip("psegic", r, strict=True)) for r in _ROWS],
        )


@pytest.fixture(params=["sqlite", "duckdb", pytest.param("postgres", marks=pytest.mark.postgres)])
def protected(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/data.db"
        _fill(sa.create_engine(url))
        yield url
    elif request.param == "duckdb":
        url = f"duckdb:///{tmp_path}/data.duckdb"
        engine = sa.create_engine(url)
        _fill(engine)
        engine.dispose()
        yield url
    else:
        from tests.conftest import POSTGRES_URL

        if not POSTGRES_URL:
            pytest.skip("DPGATE_TEST_POSTGRES_URL not set")
        url, schema = postgres_schema_url(POSTGRES_URL)
        engine = sa.create_engine(url)
        _fill(engine)
        engine.dispose()
        try:
            yield url
        finally:
            drop_postgres_schema(POSTGRES_URL, schema)


def _filtered(table: TableConfig) -> TableConfig:
    """The table as read without its catalogue: every column filtered."""
    return replace(
        table,
        columns={
            n: replace(c, enforced=False, within_bounds=False) for n, c in table.columns.items()
        },
    )


def test_enforced_columns_leave_the_filter_and_the_answers_stay(
    protected: str, tmp_path: Path
) -> None:
    config = _config(protected, tmp_path)
    engine = open_protected_engine(protected, statement_timeout_ms=5000)
    enforced = domains_enforced_by_schema(engine, config.tables).domains
    backend = engine.dialect.name
    # sex: CHECK IN, NOT NULL. educ: an integer interval, read as one only where storage
    # is integral (not SQLite's). grade: the CHECK admits 3, which is not declared.
    # income: nullable, no values: there is nothing to filter. pid: NOT NULL.
    expected = {"pid", "sex", "income", "score"} | ({"educ"} if backend != "sqlite" else set())
    assert enforced == {"people": expected}
    tables = with_enforced_domains(config.tables, enforced)
    table = tables["people"]
    dialect = sqlglot_dialect(engine)
    for sql in (
        "SELECT COUNT(*) FROM people",
        "SELECT sex, COUNT(*), SUM(income) FROM people GROUP BY sex",
        "SELECT educ, AVG(income) FROM people WHERE grade = 1 GROUP BY educ",
    ):
        plan = analyze(sql, tables)
        assert isinstance(plan, QueryPlan)
        fast = compile_plan(plan, table, dialect).sql
        slow = compile_plan(plan, _filtered(table), dialect).sql
        assert '"grade" IN (1, 2)' in fast  # not enforced: still filtered
        assert '"sex" IN (0, 1)' not in fast and '"sex" IN (0, 1)' in slow
        assert ('"educ" IN (1, 2, 3, 4)' in fast) == (backend == "sqlite")
        got = run_aggregate(engine, fast, timeout_ms=5000)
        want = run_aggregate(engine, slow, timeout_ms=5000)
        assert sorted(map(repr, got)) == sorted(map(repr, want))
    engine.dispose()


def test_a_sum_reads_a_column_unclamped_only_where_checks_keep_it_inside_its_bounds(
    protected: str, tmp_path: Path
) -> None:
    """income: integral storage and a CHECK inside its bounds, so SUM reads it as stored.
    score: its CHECK admits up to 2000, above its declared 1000, so it stays clamped and
    a row of 2000 adds 1000 (the sensitivity the noise is calibrated to). SQLite keeps
    both clamped: 1.5 fits in an INTEGER column there."""
    config = _config(protected, tmp_path)
    engine = open_protected_engine(protected, statement_timeout_ms=5000)
    guarantees = domains_enforced_by_schema(engine, config.tables)
    backend = engine.dialect.name
    assert guarantees.within_bounds == {"people": set() if backend == "sqlite" else {"income"}}
    table = with_enforced_domains(config.tables, *guarantees)["people"]
    dialect = sqlglot_dialect(engine)
    plan = analyze("SELECT SUM(income), SUM(score) FROM people", {"people": table})
    assert isinstance(plan, QueryPlan)
    fast = compile_plan(plan, table, dialect).sql
    slow = compile_plan(plan, _filtered(table), dialect).sql
    clamps = fast.count("CASE WHEN")
    assert clamps == (2 if backend == "sqlite" else 1), fast  # score's clamp stays
    assert slow.count("CASE WHEN") == 2
    got = run_aggregate(engine, fast, timeout_ms=5000)
    want = run_aggregate(engine, slow, timeout_ms=5000)
    assert got == want
    kept = [r for r in _ROWS if r[3] in (1, 2)]  # grade's declared domain
    income = sum(r[4] for r in kept)
    score = sum(min(r[5], 1000) for r in kept)
    assert income in got[0] and score in got[0]
    engine.dispose()


def test_bounded_columns_need_integral_storage_and_checks_inside_the_bounds() -> None:
    # column: (catalogue (NOT NULL, integral, boolean), its CHECK, kept inside [0, 100])
    cases: dict[str, tuple[tuple[bool, bool, bool], str | None, bool]] = {
        "inside": ((False, True, False), "inside BETWEEN 0 AND 100", True),  # NULL: skipped
        "wide": ((True, True, False), "wide >= 0 AND wide <= 101", False),
        "real": ((True, False, False), "real BETWEEN 0 AND 100", False),  # DOUBLE holds 1.5
        "one_sided": ((True, True, False), "one_sided >= 0", False),
        "unchecked": ((True, True, False), None, False),
    }
    bounds = dict.fromkeys(cases, (0.0, 100.0))
    catalogue = {name: facts for name, (facts, _, _) in cases.items()}
    checks = [check for _, check, _ in cases.values() if check is not None]
    expected = {name for name, (_, _, kept) in cases.items() if kept}
    assert bounded_columns(bounds, catalogue, checks, "postgres") == expected


@pytest.mark.postgres
def test_a_postgres_urls_own_options_are_kept_beside_read_only(postgres_url: str) -> None:
    """``?options=-csearch_path=…`` in the protected database's URL still applies (it
    used to be replaced by dpgate's read-only options, so its tables were not found)."""
    url, schema = postgres_schema_url(postgres_url)
    try:
        engine = open_protected_engine(url, statement_timeout_ms=5000)
        with engine.connect() as conn:
            assert conn.exec_driver_sql("SHOW search_path").scalar() == schema
            assert conn.exec_driver_sql("SHOW default_transaction_read_only").scalar() == "on"
        engine.dispose()
    finally:
        drop_postgres_schema(postgres_url, schema)


@pytest.mark.postgres
def test_a_check_added_not_valid_keeps_the_filter(postgres_url: str, tmp_path: Path) -> None:
    """PostgreSQL enforces a constraint added ``NOT VALID`` on new rows only: a row
    written before it may hold any value, so such a constraint enforces nothing."""
    url, schema = postgres_schema_url(postgres_url)
    try:
        engine = sa.create_engine(url)
        _fill(engine)
        with engine.begin() as conn:
            conn.exec_driver_sql("ALTER TABLE people DROP CONSTRAINT people_grade_check")
            conn.exec_driver_sql("INSERT INTO people VALUES (999, 0, 1, 5, 1)")
            conn.exec_driver_sql(
                "ALTER TABLE people ADD CONSTRAINT late CHECK (grade IN (1, 2)) NOT VALID"
            )
        engine.dispose()
        config = _config(url, tmp_path)
        protected = open_protected_engine(url, statement_timeout_ms=5000)
        enforced = domains_enforced_by_schema(protected, config.tables).domains
        assert "grade" not in enforced["people"]
        protected.dispose()
    finally:
        drop_postgres_schema(postgres_url, schema)
