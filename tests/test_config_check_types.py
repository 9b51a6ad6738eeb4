"""`dpgate config check` compares the declared join keys with the catalogue (issue 31):
a key stored otherwise than declared, and a join between columns of different storage
types, are reported, each naming the column — and a config whose keys are stored as
declared passes."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import yaml
from click.testing import CliRunner

from gateway.cli import main


def _config(tmp_path: Path, ddl: str) -> Path:
    db = sqlite3.connect(tmp_path / "p.db")
    db.executescript(ddl)
    db.close()
    config = {
        "database": {"url": "sqlite:///p.db"},
        "ledger": {"url": "sqlite:///ledger.db"},
        "tables": {
            "patients": {
                "privacy_unit": "pid",
                "columns": {"pid": {"type": "integer"}, "bday": {"type": "integer"}},
                "references": {"bday": "bday_info.bday"},
            },
            "bday_info": {
                "public": True,
                "key": "bday",
                "columns": {"bday": {"type": "integer"}, "label": {"type": "text"}},
            },
        },
    }
    path = tmp_path / "dpgate.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_an_untyped_key_declared_integer_is_reported(tmp_path: Path) -> None:
    path = _config(
        tmp_path,
        "CREATE TABLE bday_info (bday NOT NULL UNIQUE, label TEXT NOT NULL);"
        "CREATE TABLE patients (pid INTEGER PRIMARY KEY, bday INTEGER);",
    )
    result = CliRunner().invoke(main, ["config", "check", str(path)])
    assert result.exit_code == 2, result.output
    assert "tables.bday_info.columns.bday: declared integer but stored as no type" in result.output
    assert "tables.patients.references.bday: patients.bday is stored as INTEGER" in result.output


def test_a_text_key_declared_integer_is_reported(tmp_path: Path) -> None:
    path = _config(
        tmp_path,
        "CREATE TABLE bday_info (bday TEXT UNIQUE, label TEXT);"
        "CREATE TABLE patients (pid INTEGER PRIMARY KEY, bday INTEGER);",
    )
    result = CliRunner().invoke(main, ["config", "check", str(path)])
    assert result.exit_code == 2, result.output
    assert "tables.bday_info.columns.bday: declared integer but stored as TEXT" in result.output


def test_keys_stored_as_declared_pass(tmp_path: Path) -> None:
    path = _config(
        tmp_path,
        "CREATE TABLE bday_info (bday INTEGER PRIMARY KEY, label TEXT);"
        "CREATE TABLE patients (pid INTEGER PRIMARY KEY, bday BIGINT);",
    )
    result = CliRunner().invoke(main, ["config", "check", str(path)])
    assert result.exit_code == 0, result.output
    assert "OK" in result.output
