"""``dpgate config check`` lists the columns nullable only by the catalogue, and says
what ``nullable: false`` would change; the demo declares every column's nullability."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import yaml
from click.testing import CliRunner

from gateway.cli import main
from gateway.demo.hospital import config_yaml


def _people(tmp_path: Path, income: dict[str, object]) -> Path:
    db = tmp_path / "people.db"
    with sqlite3.connect(db) as conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS people "
            "(id INTEGER PRIMARY KEY, city TEXT NOT NULL, income INTEGER)"
        )
    path = tmp_path / "people.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "database": {"url": f"sqlite:///{db}"},
                "ledger": {"url": f"sqlite:///{tmp_path / 'ledger.db'}"},
                "tables": {
                    "people": {
                        "privacy_unit": "id",
                        "columns": {
                            "id": {"type": "integer"},
                            "city": {"type": "text", "values": ["Budapest", "Eger"]},
                            "income": {"type": "integer", "lower": 0, "upper": 100000, **income},
                        },
                    }
                },
            }
        )
    )
    return path


def test_a_column_nullable_only_by_the_catalogue_is_listed_with_what_to_declare(
    tmp_path: Path,
) -> None:
    result = CliRunner().invoke(main, ["config", "check", str(_people(tmp_path, {}))])
    assert result.exit_code == 0, result.output
    assert "OK" in result.output
    report = result.output.split("Nullable only by the catalogue", 1)[1]
    lines = [line for line in report.splitlines() if line.startswith("  - ")]
    assert len(lines) == 1  # city is NOT NULL in the catalogue, id the primary key
    (line,) = lines
    assert "tables.people.columns.income: nullable by the catalogue" in line
    assert "'income IS NULL'" in line and "`nullable: false`" in line


def test_a_declared_nullability_is_not_listed(tmp_path: Path) -> None:
    for declared in (True, False):
        path = _people(tmp_path, {"nullable": declared})
        result = CliRunner().invoke(main, ["config", "check", str(path)])
        assert result.exit_code == 0, result.output
        assert "income" not in result.output


def test_the_demo_declares_every_column_nullability(demo_db: Path, tmp_path: Path) -> None:
    raw = yaml.safe_load(config_yaml(str(demo_db), str(tmp_path / "ledger.db")))
    for table in raw["tables"].values():
        if table.get("public"):
            continue
        for name, column in table["columns"].items():
            assert name == table["privacy_unit"] or "nullable" in column, name
    path = tmp_path / "dpgate.yaml"
    path.write_text(yaml.safe_dump(raw))
    result = CliRunner().invoke(main, ["config", "check", str(path)])
    assert result.exit_code == 0, result.output
    assert "Nullable only by the catalogue" not in result.output


def test_only_a_sqlite_key_that_cannot_hold_null_is_taken_as_not_null(tmp_path: Path) -> None:
    """SQLite lets a PRIMARY KEY column hold NULL, except the rowid alias (``INTEGER
    PRIMARY KEY``) and a ``WITHOUT ROWID`` table's key: config check says so in both of
    its reports, and the gateway's nullability (the auditor's NULL cells) agrees."""
    from gateway.core.config_load import load_config
    from gateway.sql.execute import nullability_by_schema, open_protected_engine

    db = tmp_path / "keys.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE a (row_id INTEGER PRIMARY KEY, person INTEGER, n INTEGER)")
        conn.execute("CREATE TABLE b (code TEXT PRIMARY KEY, person INTEGER)")
        conn.execute("CREATE TABLE c (tag TEXT PRIMARY KEY, person INTEGER) WITHOUT ROWID")
        conn.execute("CREATE TABLE d (num INT PRIMARY KEY, person INTEGER)")  # INT: no alias
        conn.execute("INSERT INTO b VALUES (NULL, 1)")  # what SQLite lets a key hold
        conn.execute("INSERT INTO d VALUES (NULL, 1)")
    column = {"type": "integer", "lower": 0, "upper": 10}
    tables = {
        "a": {"row_id": column, "n": column},
        "b": {"code": {"type": "text"}},
        "c": {"tag": {"type": "text"}},
        "d": {"num": column},
    }
    path = tmp_path / "keys.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "database": {"url": f"sqlite:///{db}"},
                "ledger": {"url": f"sqlite:///{tmp_path / 'ledger.db'}"},
                "tables": {
                    name: {
                        "privacy_unit": "person",
                        "columns": {"person": {"type": "integer"}, **columns},
                    }
                    for name, columns in tables.items()
                },
            }
        )
    )
    result = CliRunner().invoke(main, ["config", "check", str(path)])
    assert result.exit_code == 0, result.output
    schema, notes = result.output.split("Nullable only by the catalogue", 1)
    listed = [line.strip() for line in schema.splitlines() if "may hold NULL:" in line]
    assert listed[:4] == [
        "may hold NULL: n, person",  # row_id, the rowid alias, is not there
        "may hold NULL: code, person",
        "may hold NULL: person",  # tag: the key of a WITHOUT ROWID table
        "may hold NULL: num, person",
    ]
    named = {line.split(":")[0] for line in notes.splitlines() if line.startswith("  - ")}
    assert named == {
        "  - tables.a.columns.n",
        "  - tables.b.columns.code",
        "  - tables.d.columns.num",
    }
    cfg = load_config(str(path))
    engine = open_protected_engine(cfg.database.url, statement_timeout_ms=5000)
    try:
        nullable = nullability_by_schema(engine, cfg.tables)
    finally:
        engine.dispose()
    assert (nullable["a"]["row_id"], nullable["b"]["code"]) == (False, True)
    assert (nullable["c"]["tag"], nullable["d"]["num"]) == (False, True)
