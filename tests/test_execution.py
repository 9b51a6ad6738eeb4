"""Execution: contribution bounding enforced in SQL (docs/design.md, invariant 6:
influence is bounded in the executed SQL), read-only access,
statement timeouts, and the same exact aggregates on SQLite, PostgreSQL, DuckDB,
ClickHouse (chDB) and Spark SQL.
"""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import Iterator
from dataclasses import replace
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
import yaml

from gateway.core.config import Config, with_nullability
from gateway.core.config_load import parse_config
from gateway.core.errors import DatabaseUnavailable
from gateway.core.plan import QueryPlan
from gateway.demo.hospital import config_yaml
from gateway.sql.analyze import analyze
from gateway.sql.compile import compile_plan
from gateway.sql.execute import (
    StatementFailed,
    nullability_by_schema,
    open_protected_engine,
    run_aggregate,
    sqlglot_dialect,
    units_unique_by_schema,
)
from tests import engines

REPRESENTATIVE = [
    "SELECT COUNT(*) FROM patients",
    "SELECT COUNT(*) FROM patients WHERE age > 30 AND sex = 'F'",
    "SELECT COUNT(glucose), SUM(glucose), AVG(income) FROM patients "
    "WHERE disease IN ('Diabetes', 'Crohn')",
    "SELECT sex, COUNT(*), SUM(income) FROM patients GROUP BY sex",
    "SELECT age / 10, COUNT(*) FROM patients GROUP BY age / 10",
    "SELECT CASE WHEN age < 40 THEN 'young' ELSE 'old' END, COUNT(*) FROM patients GROUP BY 1",
    "SELECT COUNT(*) FROM patients WHERE zip LIKE '1%' OR city = 'Szeged' OR glucose IS NULL",
    "SELECT COUNT(*) FROM patients WHERE age BETWEEN 20 AND 40 AND NOT smoker",
    "SELECT COUNT(*) FROM patients WHERE (age * 3 + 1) / 7 = 9 AND ABS(age - 40) < 30",
    "SELECT zip, COUNT(*) FROM patients GROUP BY zip",
    "SELECT COUNT(*), COUNT(DISTINCT patient_id), SUM(cost), AVG(length_of_stay) FROM visits",
    "SELECT department, COUNT(*), SUM(length_of_stay) FROM visits GROUP BY department",
    "SELECT year, department, COUNT(DISTINCT patient_id) FROM visits GROUP BY year, department",
    # quantiles (histogram counts on a public grid) and spread (sums of squares)
    "SELECT MEDIAN(age), PERCENTILE_CONT(0.9) WITHIN GROUP (ORDER BY glucose) FROM patients",
    "SELECT sex, MIN(income), MAX(glucose), STDDEV(age), VAR_POP(glucose) FROM patients "
    "GROUP BY sex",
    "SELECT department, MEDIAN(cost), VARIANCE(length_of_stay) FROM visits GROUP BY department",
]


def demo_config(db_url: str, schema: str | None = None) -> Config:
    raw = yaml.safe_load(config_yaml("/unused.db", "/unused-ledger.db"))
    raw["database"]["url"] = db_url
    if schema:
        for t in raw["tables"].values():
            t["schema"] = schema
    return parse_config(raw)


def as_the_gateway_reads(engine: sa.Engine, config: Config) -> Config:
    """``config`` with undeclared ``nullable`` taken from the catalogue, as the gateway
    does at start-up."""
    nullable = nullability_by_schema(engine, config.tables)
    return replace(config, tables=with_nullability(config.tables, nullable))


def exact(engine: sa.Engine, config: Config, sql: str, unique: set[str]) -> list[tuple[Any, ...]]:
    plan = analyze(sql, config.tables)
    assert isinstance(plan, QueryPlan)
    compiled = compile_plan(
        plan,
        config.tables[plan.table],
        sqlglot_dialect(engine),
        unit_unique=plan.table in unique,
    )
    # not a timing test: a loaded machine has taken 29 s for one Spark Connect statement
    rows = run_aggregate(engine, compiled.sql, timeout_ms=120_000)
    return sorted((tuple(_normal(v) for v in r) for r in rows), key=repr)


def _normal(v: Any) -> Any:
    if isinstance(v, Decimal):
        v = float(v)
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return v


def test_negated_tests_run_negated(demo_db: Path) -> None:
    """``NOT LIKE``, ``NOT ILIKE`` and ``IS NOT NULL`` count the rows their positive form
    does not (sqlglot 30 marks them with a ``negate`` flag, which the compiler once
    dropped: ``NOT LIKE`` ran as ``LIKE``)."""
    engine = open_protected_engine(f"sqlite:///{demo_db}", statement_timeout_ms=60_000)
    config = as_the_gateway_reads(engine, demo_config(f"sqlite:///{demo_db}"))
    count = "SELECT COUNT(*) FROM patients WHERE "
    ((everyone,),) = exact(engine, config, "SELECT COUNT(*) FROM patients", set())
    for positive, negated in (
        ("zip LIKE '1%'", "zip NOT LIKE '1%'"),
        ("city ILIKE 'eg%'", "city NOT ILIKE 'eg%'"),
        ("glucose IS NULL", "glucose IS NOT NULL"),
    ):
        ((yes,),) = exact(engine, config, count + positive, set())
        ((no,),) = exact(engine, config, count + negated, set())
        assert 0 < yes < everyone and yes + no == everyone, (positive, yes, no)
    engine.dispose()


# -- docs/design.md, invariant 6: influence is bounded in the executed SQL -----------------


@pytest.fixture
def heavy_db(tmp_path: Path) -> Path:
    """Person 1 has 50 visits in 10 departments; persons 2..4 have 1 visit each."""
    db = tmp_path / "heavy.db"
    with sqlite3.connect(db) as conn:
        conn.execute(
            "CREATE TABLE visits (visit_id INTEGER PRIMARY KEY, patient_id INTEGER, "
            "year INTEGER, department TEXT, length_of_stay INTEGER, cost REAL)"
        )
        rows = [(i, 1, 2020, f"D{i % 10}", 30, 1e9) for i in range(50)]
        rows += [(100 + p, p, 2021, "D0", 2, 100.0) for p in (2, 3, 4)]
        conn.executemany("INSERT INTO visits VALUES (?,?,?,?,?,?)", rows)
    return db


def test_bounds_are_enforced_in_the_executed_sql(heavy_db: Path) -> None:
    raw = yaml.safe_load(config_yaml("/unused.db", "/unused.db"))
    raw["database"]["url"] = f"sqlite:///{heavy_db}"
    raw["tables"] = {
        "visits": {
            "privacy_unit": "patient_id",
            "max_rows_per_unit": 5,
            "max_groups_per_unit": 2,
            "columns": {
                "patient_id": {"type": "integer"},
                "department": {"type": "text"},
                "length_of_stay": {"type": "integer", "lower": 0, "upper": 30},
                "cost": {"type": "real", "lower": 0.0, "upper": 1000.0},
            },
        }
    }
    config = parse_config(raw)
    engine = open_protected_engine(config.database.url, statement_timeout_ms=5000)
    # Person 1 contributes at most 5 rows, however many they have.
    assert exact(engine, config, "SELECT COUNT(*) FROM visits", set()) == [(5 + 3,)]
    # Their clamped values: 5 rows × 30 days, 5 rows × 1000 (not 1e9) in cost.
    total = exact(engine, config, "SELECT SUM(length_of_stay), SUM(cost) FROM visits", set())
    stay, cost = total[0]
    assert stay == 5 * 30 + 3 * 2
    assert cost * float(config_cost_resolution(config)) == pytest.approx(5 * 1000 + 3 * 100)
    # And they appear in at most 2 departments.
    per_group = exact(
        engine,
        config,
        "SELECT department, COUNT(DISTINCT patient_id) FROM visits GROUP BY department",
        set(),
    )
    assert sum(1 for _key, _n, units in per_group if units) <= 2 + 1
    assert sum(n for _key, n, _u in per_group) <= 5 + 3


def config_cost_resolution(config: Config) -> Any:
    plan = analyze("SELECT SUM(cost) FROM visits", config.tables)
    assert isinstance(plan, QueryPlan)
    return plan.measures[0].resolution


def test_a_unique_unit_column_is_recognised_from_the_schema(demo_db: Path) -> None:
    config = demo_config(f"sqlite:///{demo_db}")
    engine = open_protected_engine(config.database.url, statement_timeout_ms=5000)
    config = as_the_gateway_reads(engine, config)
    # patients.patient_id is the primary key; visits.patient_id repeats.
    assert units_unique_by_schema(engine, config.tables) == {"patients"}
    plan = analyze("SELECT SUM(length_of_stay) FROM visits", config.tables)
    assert isinstance(plan, QueryPlan)
    assert "ROW_NUMBER" in compile_plan(plan, config.tables["visits"], "sqlite").sql
    plan = analyze("SELECT SUM(age) FROM patients", config.tables)
    assert isinstance(plan, QueryPlan)
    sql = compile_plan(plan, config.tables["patients"], "sqlite", unit_unique=True).sql
    assert "ROW_NUMBER" not in sql


def test_the_domain_filter_is_generated_once_and_put_only_in_its_place(demo_db: Path) -> None:
    """The compiler generates each table's domain filter once and puts its SQL where its
    placeholder is; a string literal (or comment) spelling the placeholder stays as
    written, and each statement holds the filter exactly once."""
    from gateway.core.domain import row_filter
    from gateway.sql.compile import _DOMAIN_MARK

    config = demo_config(f"sqlite:///{demo_db}")
    table = config.tables["patients"]
    condition = row_filter(table)
    assert condition is not None
    expected = condition.sql(dialect="sqlite")  # parenthesised or not, where it stands
    quoted = _DOMAIN_MARK.replace("'", "''")
    for sql in (
        "SELECT COUNT(*) FROM patients WHERE age > 30",
        f"SELECT COUNT(*) FROM patients WHERE city = '\"{quoted}\"'",
        f"SELECT COUNT(*) FROM patients /* \"{_DOMAIN_MARK}\" */ WHERE city = 'x'",
    ):
        plan = analyze(sql, config.tables)
        assert isinstance(plan, QueryPlan)
        for _ in range(2):  # the second compile uses the cached filter
            compiled = compile_plan(plan, table, "sqlite").sql
            assert compiled.count(expected) == 1, compiled
            assert f'"{_DOMAIN_MARK}"' not in compiled.replace(f"'\"{quoted}\"'", "")
    literal = analyze(f"SELECT COUNT(*) FROM patients WHERE city = '\"{quoted}\"'", config.tables)
    assert isinstance(literal, QueryPlan)
    assert f"'\"{quoted}\"'" in compile_plan(literal, table, "sqlite").sql


# -- read-only and timeouts -----------------------------------------------------------------


def test_the_protected_database_is_opened_read_only(demo_db: Path) -> None:
    engine = open_protected_engine(f"sqlite:///{demo_db}", statement_timeout_ms=5000)
    with pytest.raises(StatementFailed) as info:
        run_aggregate(engine, "DELETE FROM patients", timeout_ms=5000)
    assert "patients" not in str(info.value) and not info.value.timed_out
    assert run_aggregate(engine, "SELECT COUNT(*) FROM patients", timeout_ms=5000)[0][0] > 0


def test_an_unreachable_database_fails_before_the_statement_is_sent(tmp_path: Path) -> None:
    """Only this failure may be refunded: the statement never reached the database."""
    missing = tmp_path / "gone.db"
    engine = open_protected_engine(f"sqlite:///{missing}", statement_timeout_ms=5000)
    with pytest.raises(DatabaseUnavailable) as info:
        run_aggregate(engine, "SELECT COUNT(*) FROM patients", timeout_ms=5000)
    assert "nothing was charged" in info.value.message


def test_a_slow_statement_is_cut_at_the_timeout(
    demo_db: Path, caplog: pytest.LogCaptureFixture
) -> None:
    engine = open_protected_engine(f"sqlite:///{demo_db}", statement_timeout_ms=100)
    slow = (
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 100000000) "
        "SELECT COUNT(*) FROM n"
    )
    with (
        caplog.at_level("WARNING", logger="dpgate.execute"),
        pytest.raises(StatementFailed) as info,
    ):
        run_aggregate(engine, slow, timeout_ms=100)
    assert info.value.timed_out
    # The operator's log names the database's own error code: an interrupt at the
    # deadline, not (say) a full temp store — an SQLite OperationalError is either.
    assert "OperationalError SQLITE_INTERRUPT (timeout)" in caplog.text


# -- the same answers on every backend ------------------------------------------------------


@pytest.fixture(scope="module")
def sqlite_reference(demo_db: Path) -> tuple[sa.Engine, Config]:
    config = demo_config(f"sqlite:///{demo_db}")
    engine = open_protected_engine(config.database.url, statement_timeout_ms=30_000)
    return engine, as_the_gateway_reads(engine, config)


def _copy_demo(demo_db: Path, target: sa.Engine, schema: str | None) -> None:
    source = sa.create_engine(f"sqlite:///{demo_db}")
    meta = sa.MetaData()
    meta.reflect(source)
    with source.connect() as src, target.begin() as dst:
        for table in meta.sorted_tables:
            columns = []
            for c in table.columns:
                ctype: Any = c.type
                if c.name == "smoker":
                    ctype = sa.Boolean()
                columns.append(
                    sa.Column(c.name, ctype, primary_key=c.primary_key, autoincrement=False)
                )
            copy = sa.Table(table.name, sa.MetaData(schema=schema), *columns)
            copy.create(dst)
            rows = [dict(r._mapping) for r in src.execute(sa.select(table))]
            for r in rows:
                if "smoker" in r:
                    r["smoker"] = bool(r["smoker"])
            dst.execute(copy.insert(), rows)


@pytest.fixture(scope="module")
def postgres_copy(demo_db: Path) -> Iterator[tuple[sa.Engine, Config]]:
    import os

    url = os.environ.get("DPGATE_TEST_POSTGRES_URL")
    if not url:
        pytest.skip("set DPGATE_TEST_POSTGRES_URL to run PostgreSQL tests")
    schema = f"dpgate_test_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(url)
    with admin.begin() as conn:
        conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    try:
        _copy_demo(demo_db, admin, schema)
        config = demo_config(url, schema=schema)
        engine = open_protected_engine(url, statement_timeout_ms=30_000)
        yield engine, as_the_gateway_reads(engine, config)
    finally:
        with admin.begin() as conn:
            conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


@pytest.fixture(scope="module")
def duckdb_copy(
    demo_db: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[sa.Engine, Config]]:
    pytest.importorskip("duckdb_engine")
    path = tmp_path_factory.mktemp("duck") / "hospital.duckdb"
    writer = sa.create_engine(f"duckdb:///{path}")
    _copy_demo(demo_db, writer, None)
    writer.dispose()
    config = demo_config(f"duckdb:///{path}")
    engine = open_protected_engine(config.database.url, statement_timeout_ms=30_000)
    yield engine, as_the_gateway_reads(engine, config)
    engine.dispose()


@pytest.mark.postgres
@pytest.mark.parametrize("sql", REPRESENTATIVE)
def test_postgres_computes_the_same_exact_aggregates(
    sql: str,
    sqlite_reference: tuple[sa.Engine, Config],
    postgres_copy: tuple[sa.Engine, Config],
) -> None:
    ref_engine, ref_config = sqlite_reference
    pg_engine, pg_config = postgres_copy
    reference = exact(
        ref_engine, ref_config, sql, units_unique_by_schema(ref_engine, ref_config.tables)
    )
    assert (
        exact(pg_engine, pg_config, sql, units_unique_by_schema(pg_engine, pg_config.tables))
        == reference
    )
    # And with the bounding window forced on, where the schema would let it be skipped.
    assert exact(pg_engine, pg_config, sql, set()) == exact(ref_engine, ref_config, sql, set())


@pytest.mark.parametrize("sql", REPRESENTATIVE)
def test_duckdb_computes_the_same_exact_aggregates(
    sql: str,
    sqlite_reference: tuple[sa.Engine, Config],
    duckdb_copy: tuple[sa.Engine, Config],
) -> None:
    ref_engine, ref_config = sqlite_reference
    duck_engine, duck_config = duckdb_copy
    reference = exact(
        ref_engine, ref_config, sql, units_unique_by_schema(ref_engine, ref_config.tables)
    )
    # DuckDB's own catalogue says patients.patient_id is the primary key (its SQLAlchemy
    # dialect cannot reflect it), so the same shortcut applies as on SQLite.
    duck_unique = units_unique_by_schema(duck_engine, duck_config.tables)
    assert duck_unique == {"patients"}
    assert exact(duck_engine, duck_config, sql, duck_unique) == reference
    assert exact(duck_engine, duck_config, sql, set()) == exact(ref_engine, ref_config, sql, set())


def _engine_kind(column: sa.Column[Any]) -> str:
    if column.name == "smoker":
        return "boolean"
    if isinstance(column.type, sa.Integer):
        return "integer"
    if isinstance(column.type, sa.Float | sa.Numeric):
        return "real"
    return "text"


@pytest.fixture(scope="module", params=engines.ENGINES)
def engine_copy(
    request: pytest.FixtureRequest, demo_db: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[sa.Engine, Config]]:
    """The demo hospital on ClickHouse (chDB) or Spark SQL, NOT NULL kept where the
    engine has it, as a loader would."""
    source = sa.create_engine(f"sqlite:///{demo_db}")
    meta = sa.MetaData()
    meta.reflect(source)
    database = engines.new_database("demo")
    with source.connect() as src:
        for table in meta.sorted_tables:
            rows = [dict(r._mapping) for r in src.execute(sa.select(table))]
            for r in rows:
                if "smoker" in r:
                    r["smoker"] = bool(r["smoker"])
            engines.load(
                request.param,
                tmp_path_factory,
                database,
                table.name,
                {c.name: _engine_kind(c) for c in table.columns},
                rows,
                not_null=[c.name for c in table.columns if not c.nullable or c.primary_key],
            )
    source.dispose()
    url = engines.url(request.param, tmp_path_factory)
    config = demo_config(url, schema=database)
    engine = open_protected_engine(url, statement_timeout_ms=30_000)
    # warm the engine: a cold Spark (Connect's server above all) plans its first statements
    # slowly, and a loaded machine can push one past the 30 s a test statement gets
    run_aggregate(engine, f"SELECT COUNT(*) FROM {database}.patients", timeout_ms=300_000)
    yield engine, as_the_gateway_reads(engine, config)
    engine.dispose()


@pytest.mark.parametrize("sql", REPRESENTATIVE)
def test_distributed_engines_compute_the_same_exact_aggregates(
    sql: str,
    sqlite_reference: tuple[sa.Engine, Config],
    engine_copy: tuple[sa.Engine, Config],
) -> None:
    """ClickHouse and Spark keep no uniqueness constraint, so the bounding window is
    always in their SQL: compared with SQLite's answers with the window forced on too."""
    ref_engine, ref_config = sqlite_reference
    engine, config = engine_copy
    assert units_unique_by_schema(engine, config.tables) == set()
    assert exact(engine, config, sql, set()) == exact(ref_engine, ref_config, sql, set())


def test_many_threads_share_the_protected_sqlite_database(demo_db: Path) -> None:
    """Threaded workers run statements side by side. SQLAlchemy's default pool for a
    'sqlite://' URL closes older threads' connections past five threads (while they run:
    the worker crashed with SIGSEGV); the engine keeps a queue of connections instead."""
    from concurrent.futures import ThreadPoolExecutor

    engine = open_protected_engine(f"sqlite:///{demo_db}", statement_timeout_ms=5000)
    assert isinstance(engine.pool, sa.pool.QueuePool)

    def count(i: int) -> int:
        rows = run_aggregate(
            engine, f"SELECT COUNT(*) FROM patients WHERE age > {i % 90}", timeout_ms=5000
        )
        return int(rows[0][0])

    with ThreadPoolExecutor(16) as pool:
        counts = list(pool.map(count, range(320)))
    assert all(c > 0 for c in counts)


@pytest.mark.parametrize("backend", ["sqlite", "duckdb"])
def test_a_unique_unit_column_that_may_hold_null_is_bounded_in_sql(
    backend: str, tmp_path: Path
) -> None:
    """UNIQUE lets any number of rows hold NULL: without the domain excluding NULL, those
    rows would all be one unbounded unit. A primary key, or a unique NOT NULL column, is
    enough — read from DuckDB's own catalogue too."""
    if backend == "duckdb":
        pytest.importorskip("duckdb_engine")
    url = f"{backend}:///{tmp_path / ('u.' + backend)}"
    writer = sa.create_engine(url)
    with writer.begin() as conn:
        conn.execute(sa.text("CREATE TABLE pk (id INTEGER PRIMARY KEY, x INTEGER)"))
        conn.execute(sa.text("CREATE TABLE uq (id INTEGER UNIQUE, x INTEGER)"))
        conn.execute(sa.text("CREATE TABLE uq_nn (id INTEGER NOT NULL UNIQUE, x INTEGER)"))
        conn.execute(sa.text("CREATE TABLE ix (id INTEGER NOT NULL, x INTEGER)"))
        conn.execute(sa.text("CREATE UNIQUE INDEX ix_id ON ix (id)"))
        conn.execute(sa.text("CREATE TABLE plain (id INTEGER NOT NULL, x INTEGER)"))
    writer.dispose()
    tables = {
        name: {
            "privacy_unit": "id",
            "columns": {"id": {"type": "integer"}, "x": {"type": "integer"}},
        }
        for name in ("pk", "uq", "uq_nn", "ix", "plain")
    }
    raw = yaml.safe_load(config_yaml("/unused.db", "/unused.db"))
    raw["database"]["url"] = url
    raw["tables"] = tables
    config = parse_config(raw)
    engine = open_protected_engine(url, statement_timeout_ms=5000)
    config = as_the_gateway_reads(engine, config)
    assert units_unique_by_schema(engine, config.tables) == {"pk", "uq_nn", "ix"}
    # Declaring the column not nullable puts the NULL rows outside the domain instead.
    raw["tables"]["uq"]["columns"]["id"]["nullable"] = False
    config = as_the_gateway_reads(engine, parse_config(raw))
    assert "uq" in units_unique_by_schema(engine, config.tables)
    engine.dispose()


def test_an_integer_sum_adds_whole_numbers_within_the_bounds_whatever_is_stored(
    tmp_path: Path,
) -> None:
    """SUM of an integer column with whole bounds needs no ROUND: clamped, each value is in
    [lower, upper]. SQLite keeps 2.5 in an INTEGER column, though, so the compiled SQL
    CASTs each clamped value (a no-op where the column is stored as BIGINT): the sum is
    exact integer arithmetic and one row moves it by at most max(|lower|, |upper|)."""
    db = tmp_path / "frac.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE t (x INTEGER)")
        conn.executemany("INSERT INTO t VALUES (?)", [(2.5,), (-1.5,), (7.9,), (3,), (None,)])
    raw = yaml.safe_load(config_yaml("/unused.db", "/unused.db"))
    raw["database"]["url"] = f"sqlite:///{db}"
    raw["tables"] = {"t": {"columns": {"x": {"type": "integer", "lower": 0, "upper": 5}}}}
    config = parse_config(raw)
    plan = analyze("SELECT SUM(x) FROM t", config.tables)
    assert isinstance(plan, QueryPlan)
    for dialect in ("sqlite", "postgres", "duckdb"):
        assert "ROUND" not in compile_plan(plan, config.tables["t"], dialect).sql.upper()
    engine = open_protected_engine(config.database.url, statement_timeout_ms=5000)
    [(total,)] = run_aggregate(
        engine, compile_plan(plan, config.tables["t"], "sqlite").sql, timeout_ms=5000
    )
    # 2.5 → 2, -1.5 → 0 (clamped), 7.9 → 5 (clamped), 3, NULL skipped.
    assert total == 10 and isinstance(total, int)
