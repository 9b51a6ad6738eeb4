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
    lines = [line for line in result.output.splitlines() if line.startswith("  - ")]
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
