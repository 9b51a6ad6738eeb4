"""ClickHouse (chDB) and Spark SQL as the protected database: opened read-only, statements
cut at their deadline, failures after the statement was sent stay charged
(docs/design.md, invariants 2 and 9; docs/privacy.md, "Side channels"); and the SQL that
Trino and BigQuery would receive (compile-only: no engine of theirs runs here).

The same exact aggregates as SQLite, on the same fixture queries, are in
tests/test_execution.py and tests/test_bounding.py; totality in tests/test_totality.py.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
import sqlglot
import yaml
from sqlglot import exp

from gateway.core.config_load import parse_config
from gateway.core.errors import DatabaseUnavailable
from gateway.core.plan import QueryPlan, QueryRequest
from gateway.demo.hospital import config_yaml
from gateway.pipeline.gateway import CHARGED_FAILURE_MESSAGE, Gateway
from gateway.sql.analyze import analyze
from gateway.sql.compile import compile_plan
from gateway.sql.execute import StatementFailed, open_protected_engine, run_aggregate
from tests import engines
from tests.test_bounding import QUERIES as BOUNDING_QUERIES
from tests.test_bounding import _config as bounding_config
from tests.test_execution import REPRESENTATIVE, demo_config

VISITS = {
    "visit_id": "integer",
    "patient_id": "integer",
    "year": "integer",
    "department": "text",
    "length_of_stay": "integer",
    "cost": "real",
}
VISIT_ROWS = [
    {
        "visit_id": i,
        "patient_id": i % 7,
        "year": 2020 + i % 3,
        "department": ("Cardiology", "Surgery")[i % 2],
        "length_of_stay": i % 11,
        "cost": 100.0 + i,
    }
    for i in range(60)
]


@pytest.fixture(scope="module", params=engines.ENGINES)
def visits(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, str, str]]:
    """(engine, URL, database) with a small ``visits`` table."""
    database = engines.new_database("eng")
    engines.load(request.param, tmp_path_factory, database, "visits", VISITS, VISIT_ROWS)
    yield request.param, engines.url(request.param, tmp_path_factory), database


def _count(engine: sa.Engine, database: str, table: str) -> int:
    rows = run_aggregate(engine, f"SELECT COUNT(*) FROM {database}.{table}", timeout_ms=60_000)
    return int(rows[0][0])


def test_the_engine_is_opened_read_only(visits: tuple[str, str, str]) -> None:
    kind, url, database = visits
    engine = open_protected_engine(url, statement_timeout_ms=60_000)
    try:
        before = _count(engine, database, "visits")
        writes = [
            f"INSERT INTO {database}.visits (visit_id) VALUES (1000)",
            f"CREATE TABLE {database}.leak (a INT)",
            f"DROP TABLE {database}.visits",
            f"SELECT 1; DROP TABLE {database}.visits",
        ]
        for statement in writes:
            with pytest.raises(StatementFailed):
                run_aggregate(engine, statement, timeout_ms=60_000)
        assert _count(engine, database, "visits") == before
        if kind == "clickhouse":
            [(readonly,)] = run_aggregate(
                engine, "SELECT getSetting('readonly')", timeout_ms=60_000
            )
            assert int(readonly) == 2
    finally:
        engine.dispose()


def test_the_statement_settings_are_dpgates_own(visits: tuple[str, str, str]) -> None:
    """ClickHouse: whatever a profile says, the deadline throws (never returns a partial
    aggregate) and COUNT(DISTINCT) is exact. Spark: errors that depend on the rows are
    NULL (ANSI mode off)."""
    kind, url, _database = visits
    engine = open_protected_engine(url, statement_timeout_ms=60_000)
    try:
        if kind == "clickhouse":
            settings = run_aggregate(
                engine,
                "SELECT getSetting('max_execution_time'), getSetting('timeout_overflow_mode'), "
                "getSetting('count_distinct_implementation')",
                timeout_ms=1500,
            )
            assert settings == [(1.5, "throw", "uniqExact")]
        else:
            assert run_aggregate(
                engine, "SELECT 1 DIV 0, 1 / 0, CAST('x' AS INT)", timeout_ms=60_000
            ) == [(None, None, None)]
    finally:
        engine.dispose()


#: Far longer than the 1.5 s deadline, and bounded on Spark (seconds to tens of seconds):
#: a job that goes on after its cancel holds Spark's cores only that long. Over 10¹² rows
#: the local session's job ran on for over ten minutes after the test, its two tasks
#: holding both of local[2]'s cores and stalling every Spark test after it.
SLOW_STATEMENT = {
    "clickhouse": "SELECT sum(number % 7) FROM numbers(1000000000000)",
    "spark": "SELECT sum(id % 7) FROM range(0, 20000000000)",
    "spark-connect": "SELECT sum(id % 7) FROM range(0, 20000000000)",
}


def test_a_slow_statement_is_cut_at_the_deadline(
    visits: tuple[str, str, str], caplog: pytest.LogCaptureFixture
) -> None:
    """ClickHouse stops it itself (``max_execution_time``, error 159); Spark's job group
    is cancelled by the gateway's timer."""
    kind, url, _database = visits
    engine = open_protected_engine(url, statement_timeout_ms=60_000)
    deadline_ms = 1500
    started = time.monotonic()
    try:
        with (
            caplog.at_level(logging.WARNING, logger="dpgate.execute"),
            pytest.raises(StatementFailed) as info,
        ):
            run_aggregate(engine, SLOW_STATEMENT[kind], timeout_ms=deadline_ms)
    finally:
        engine.dispose()
    elapsed = time.monotonic() - started
    assert info.value.timed_out
    # Cut near the deadline, not run to its end (minutes to hours on this machine).
    assert elapsed < deadline_ms / 1000 + 30, elapsed
    if kind == "clickhouse":
        assert "OperationalError 159 (timeout)" in caplog.text


def _gateway(url: str, database: str, tmp_path: Path, **execution: Any) -> Gateway:
    raw = yaml.safe_load(config_yaml("/unused.db", str(tmp_path / "ledger.db")))
    raw["database"]["url"] = url
    raw["tables"] = {
        "visits": {
            "schema": database,
            "privacy_unit": "patient_id",
            "max_rows_per_unit": 3,
            "columns": {
                "visit_id": {"type": "integer"},
                "patient_id": {"type": "integer"},
                "year": {"type": "integer", "lower": 2019, "upper": 2025},
                "department": {"type": "text", "values": ["Cardiology", "Surgery"]},
                "length_of_stay": {"type": "integer", "lower": 0, "upper": 30},
                "cost": {"type": "real", "lower": 0, "upper": 1000},
            },
        }
    }
    raw["execution"] = {"timing": "off", **execution}
    return Gateway(parse_config(raw))


def test_answers_and_charges_after_the_statement_was_sent(
    visits: tuple[str, str, str],
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The pipeline answers on the engine; and a statement that fails once it reached the
    engine (its table dropped under it) is charged, never refunded, with the same
    message as any other failure after the send."""
    kind, url, _database = visits
    monkeypatch.setenv("DPGATE_ADMIN_KEY", "admin-" + "k" * 40)
    own = engines.new_database("charge")
    engines.load(kind, tmp_path_factory, own, "visits", VISITS, VISIT_ROWS)
    gw = _gateway(url, own, tmp_path)
    try:
        gw.ledger.create_analyst("erin", 100.0, 1e-6)
        sql = "SELECT department, COUNT(*), SUM(length_of_stay) FROM visits GROUP BY department"
        query = QueryRequest(sql=sql, epsilon=0.1, delta=0.0, mechanism="laplace")
        answer = gw.query("erin", query)
        assert {"Cardiology", "Surgery"} <= {r[0] for r in answer.rows}
        spent = gw.ledger.budget_status("erin").rho_spent
        assert spent == pytest.approx(0.1**2 / 2)

        engines.drop_table(kind, tmp_path_factory, own, "visits")
        with pytest.raises(DatabaseUnavailable) as info:
            gw.query("erin", QueryRequest(sql=sql, epsilon=0.2, delta=0.0, mechanism="laplace"))
        assert info.value.to_dict()["error"] == {
            "code": "database_unavailable",
            "message": CHARGED_FAILURE_MESSAGE,
            "detail": {"charged": True},
        }
        assert gw.ledger.budget_status("erin").rho_spent == pytest.approx(spent + 0.2**2 / 2)
    finally:
        gw.engine.dispose()


# -- compile-only: the SQL Trino and BigQuery would receive ---------------------------------

COMPILE_ONLY = ("trino", "bigquery")


def _compiled(dialect: str) -> Iterator[tuple[str, str]]:
    config = demo_config("sqlite:///unused.db", schema="hospital")
    for sql in REPRESENTATIVE:
        plan = analyze(sql, config.tables)
        assert isinstance(plan, QueryPlan)
        yield sql, compile_plan(plan, config.tables[plan.table], dialect).sql
    stays = bounding_config("sqlite:///unused.db", 3, 2, 5)
    for sql in BOUNDING_QUERIES:
        plan = analyze(sql, stays.tables)
        assert isinstance(plan, QueryPlan)
        yield sql, compile_plan(plan, stays.tables["stays"], dialect).sql


@pytest.mark.parametrize("dialect", COMPILE_ONLY)
def test_compiled_sql_parses_back_in_its_dialect(dialect: str) -> None:
    """Every fixture query compiles to one statement that the dialect's own parser reads
    back to the same tree (what the engine would receive is valid in it)."""
    for sql, compiled in _compiled(dialect):
        [tree] = sqlglot.parse(compiled, read=dialect)
        # one query: a SELECT, or (a quantile's fine histogram) a UNION ALL of SELECTs
        assert isinstance(tree, exp.Select | exp.Union), sql
        assert tree.sql(dialect=dialect) == compiled, sql


def _find(dialect: str, sql: str) -> str:
    return dict(_compiled(dialect))[sql]


@pytest.mark.parametrize(
    ("dialect", "parts"),
    [
        (
            "trino",
            [
                'ROW_NUMBER() OVER (PARTITION BY "patient_id" ORDER BY "age")',
                # integer division stays integer (truncating), its divisor NULL at zero
                'AS BIGINT) / NULLIF(CAST(10 AS BIGINT), 0) AS "k0"',
                'FROM "hospital"."patients"',
            ],
        ),
        (
            "bigquery",
            [
                "ROW_NUMBER() OVER (PARTITION BY `patient_id` ORDER BY `age` NULLS LAST)",
                "DIV(CAST(CASE WHEN `age` < 0 THEN 0 WHEN `age` > 100 THEN 100 ELSE `age` END "
                "AS INT64), NULLIF(CAST(10 AS INT64), 0)) AS `k0`",
                "FROM `hospital`.`patients`",
            ],
        ),
    ],
)
def test_integer_division_and_bounding_windows_in_each_dialect(
    dialect: str, parts: list[str]
) -> None:
    compiled = _find(dialect, "SELECT age / 10, COUNT(*) FROM patients GROUP BY age / 10")
    for part in parts:
        assert part in compiled, (part, compiled)
    assert "DOUBLE" not in compiled and "FLOAT64" not in compiled


@pytest.mark.parametrize(
    ("dialect", "parts"),
    [
        ("trino", ['COUNT(DISTINCT "dp_unit")', '"dp_group_rank" <= 3', "DENSE_RANK() OVER"]),
        ("bigquery", ["COUNT(DISTINCT `dp_unit`)", "`dp_group_rank` <= 3", "DENSE_RANK() OVER"]),
    ],
)
def test_group_bounds_and_unit_counts_in_each_dialect(dialect: str, parts: list[str]) -> None:
    compiled = _find(
        dialect,
        "SELECT year, department, COUNT(DISTINCT patient_id) FROM visits GROUP BY year, department",
    )
    for part in parts:
        assert part in compiled, (part, compiled)


def test_clickhouse_and_spark_compile_their_own_forms() -> None:
    """The rewrites of gateway/sql/engines/dialects.py, where the engines would otherwise
    differ from SQLite: exact integer division, halves rounded away from zero, NaN read
    as +inf on ClickHouse; every window ordered on Spark."""
    sql = "SELECT age / 10, COUNT(*) FROM patients GROUP BY age / 10"
    clickhouse = _find("clickhouse", sql)
    assert "intDiv(" in clickhouse and "Float" not in clickhouse
    glucose = _find("clickhouse", REPRESENTATIVE[2])
    assert 'CASE WHEN isNaN("glucose") THEN inf ELSE "glucose" END AS "glucose"' in glucose
    rounding = _find("clickhouse", REPRESENTATIVE[2])
    assert "trunc(" in rounding and "ROUND(" not in rounding
    spark = _find("spark", "SELECT COUNT(*) FROM stays")
    assert "ROW_NUMBER() OVER (PARTITION BY `pid` ORDER BY `pid`" in spark
