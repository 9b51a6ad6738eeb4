"""`dpgate config check` compares the declared join keys with the catalogue (issue 31):
a key stored otherwise than declared, and a join between columns of different storage
types, are reported, each naming the column — and a config whose keys are stored as
declared passes."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
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


PATIENTS = "CREATE TABLE patients (pid INTEGER PRIMARY KEY, bday INTEGER);"
CASES = {
    "an untyped key declared integer is reported": (
        "CREATE TABLE bday_info (bday NOT NULL UNIQUE, label TEXT NOT NULL);" + PATIENTS,
        2,
        [
            "tables.bday_info.columns.bday: declared integer but stored as no type",
            "tables.patients.references.bday: patients.bday is stored as INTEGER",
        ],
    ),
    "a text key declared integer is reported": (
        "CREATE TABLE bday_info (bday TEXT UNIQUE, label TEXT);" + PATIENTS,
        2,
        ["tables.bday_info.columns.bday: declared integer but stored as TEXT"],
    ),
    "keys stored as declared pass": (
        "CREATE TABLE bday_info (bday INTEGER PRIMARY KEY, label TEXT);"
        "CREATE TABLE patients (pid INTEGER PRIMARY KEY, bday BIGINT);",
        0,
        ["OK"],
    ),
}


@pytest.mark.parametrize(("ddl", "exit_code", "said"), list(CASES.values()), ids=list(CASES))
def test_config_check_compares_the_keys_with_their_storage(
    tmp_path: Path, ddl: str, exit_code: int, said: list[str]
) -> None:
    path = _config(tmp_path, ddl)
    result = CliRunner().invoke(main, ["config", "check", str(path)])
    assert result.exit_code == exit_code, result.output
    for line in said:
        assert line in result.output
