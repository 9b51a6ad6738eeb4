"""``dpgate config check`` on every engine dpgate serves on: it reads the catalogue (never
a traceback), exits 0 with a readable report on a valid config — NULL, keys, constraints
and what they mean for analysts — and names the problem on an invalid one."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
import yaml
from click.testing import CliRunner, Result

from gateway.cli import main
from gateway.demo.hospital import config_yaml
from tests import engines

POSTGRES_URL = os.environ.get("DPGATE_TEST_POSTGRES_URL")


def _check(tmp_path: Path, url: str, tables: dict[str, Any]) -> Result:
    path = tmp_path / "dpgate.yaml"
    raw = {
        "database": {"url": url},
        "ledger": {"url": f"sqlite:///{tmp_path / 'ledger.db'}"},
        "analysts": [{"name": "alice", "epsilon": 1.0}],
        "tables": tables,
    }
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    result = CliRunner().invoke(main, ["config", "check", str(path)])
    assert "Traceback" not in result.output, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result


def _people(schema: str | None = None, **extra: Any) -> dict[str, Any]:
    table: dict[str, Any] = {
        "privacy_unit": "pid",
        "columns": {
            "pid": {"type": "integer"},
            "age": {"type": "integer", "lower": 0, "upper": 120},
            "zip": {"type": "text"},
        },
        **extra,
    }
    if schema:
        table["schema"] = schema
    return table


def test_sqlite_reports_nullability_and_the_unit(demo_db: Path, tmp_path: Path) -> None:
    path = tmp_path / "dpgate.yaml"
    path.write_text(config_yaml(str(demo_db), str(tmp_path / "ledger.db")))
    result = CliRunner().invoke(main, ["config", "check", str(path)])
    assert result.exit_code == 0, result.output
    assert "database: SQLite; schema read from its catalogue" in result.output
    assert "tables.patients (patients):" in result.output
    assert "what this means for analysts:" in result.output


@pytest.fixture
def duckdb_file(tmp_path: Path) -> Path:
    """The issue's case: one table with a key, NOT NULL and a CHECK; the same rows copied
    by ``CREATE TABLE AS``, whose columns all come out nullable and unkeyed."""
    duckdb = pytest.importorskip("duckdb")
    path = tmp_path / "d.duckdb"
    con = duckdb.connect(str(path))
    con.execute(
        "CREATE TABLE people (pid INTEGER PRIMARY KEY, "
        "age INTEGER NOT NULL CHECK (age BETWEEN 0 AND 120), zip VARCHAR)"
    )
    con.execute("INSERT INTO people VALUES (1, 30, 'a'), (2, 40, 'b')")
    con.execute("CREATE TABLE copied AS SELECT pid, age, zip FROM people")
    con.close()
    return path


def test_duckdb_tells_a_keyed_table_from_a_copy_made_by_create_table_as(
    duckdb_file: Path, tmp_path: Path
) -> None:
    tables = {"people": _people(), "copied": _people(max_rows_per_unit=2)}
    result = _check(tmp_path, f"duckdb:///{duckdb_file}", tables)
    assert result.exit_code == 0, result.output
    out = result.output
    assert "database: DuckDB" in out
    people, copied = out.split("tables.people (people)")[1].split("tables.copied (copied)")
    assert "may hold NULL: zip\n" in people
    assert "privacy unit pid: kept unique and NOT NULL by the database" in people
    assert "unique keys: (pid)" in people and "CHECK constraints: 1" in people
    assert "may hold NULL: pid, age, zip" in copied
    assert "privacy unit pid: not kept unique by the database; bounded in SQL to 2" in copied
    assert "the auditor keeps a NULL cell for each" in out


def test_duckdb_names_a_missing_table_and_column(duckdb_file: Path, tmp_path: Path) -> None:
    wrong = _people()
    wrong["columns"]["height"] = {"type": "integer"}
    result = _check(tmp_path, f"duckdb:///{duckdb_file}", {"people": wrong, "gone": _people()})
    assert result.exit_code == 2, result.output
    assert "tables.people.columns.height: no such column" in result.output
    assert "tables.gone: no such table in the protected database" in result.output


@pytest.mark.postgres
@pytest.mark.skipif(not POSTGRES_URL, reason="DPGATE_TEST_POSTGRES_URL not set")
def test_postgres_reports_keys_and_checks(tmp_path: Path) -> None:
    assert POSTGRES_URL is not None
    schema = engines.new_database("check")
    engine = sa.create_engine(POSTGRES_URL)
    with engine.begin() as conn:
        conn.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
        conn.exec_driver_sql(
            f'CREATE TABLE "{schema}".people (pid INTEGER PRIMARY KEY, '
            "age INTEGER NOT NULL CHECK (age BETWEEN 0 AND 120), zip TEXT)"
        )
    try:
        result = _check(tmp_path, POSTGRES_URL, {"people": _people(schema)})
        assert result.exit_code == 0, result.output
        assert "database: PostgreSQL" in result.output
        assert "privacy unit pid: kept unique and NOT NULL by the database" in result.output
        assert "CHECK constraints: 1" in result.output
        assert "may hold NULL: zip\n" in result.output
    finally:
        with engine.begin() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA "{schema}" CASCADE')
        engine.dispose()


@pytest.mark.parametrize("kind", engines.ENGINES)
def test_each_distributed_engine_is_read_and_what_it_cannot_tell_is_said(
    kind: engines.Engine, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    database = engines.new_database("check")
    columns = {"pid": "integer", "age": "integer", "zip": "text"}
    rows = [{"pid": 1, "age": 30, "zip": "a"}]
    engines.load(kind, tmp_path_factory, database, "people", columns, rows, not_null=["age"])
    url = engines.url(kind, tmp_path_factory)
    result = _check(tmp_path, url, {"people": _people(database)})
    assert result.exit_code == 0, result.output
    out = result.output
    name = "ClickHouse" if kind == "clickhouse" else "Spark SQL"
    assert f"database: {name}; schema read from its catalogue" in out
    assert f"tables.people ({database}.people): 3 column(s)" in out
    # age was created NOT NULL; Spark's file tables make every column nullable on write
    nullable = "pid, zip" if kind == "clickhouse" else "pid, age, zip"
    assert f"may hold NULL: {nullable}\n" in out, out
    assert "privacy unit pid: not kept unique by the database; bounded in SQL" in out
    assert "not read: " in out

    wrong = _people(database)
    wrong["columns"]["height"] = {"type": "integer"}
    result = _check(tmp_path, url, {"people": wrong, "gone": _people(database)})
    assert result.exit_code == 2, result.output
    assert "tables.people.columns.height: no such column" in result.output
    assert "tables.gone: no such table in the protected database" in result.output


def test_an_unreachable_clickhouse_server_is_named_not_a_traceback(tmp_path: Path) -> None:
    pytest.importorskip("clickhouse_connect")
    result = _check(tmp_path, "clickhousedb://dpgate@127.0.0.1:1/x", {"people": _people()})
    assert result.exit_code == 2, result.output
    assert "database.url: cannot" in result.output and "ClickHouse" in result.output, result.output
