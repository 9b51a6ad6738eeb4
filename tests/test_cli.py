"""The `dpgate` command: config check says precisely what is wrong, demo builds and
prints a working key, query talks to a gateway."""

from __future__ import annotations

from pathlib import Path

import yaml
from click.testing import CliRunner

from gateway.cli import main
from gateway.demo.hospital import config_yaml


def test_config_check_accepts_the_demo_config(demo_db: Path, tmp_path: Path) -> None:
    path = tmp_path / "dpgate.yaml"
    path.write_text(config_yaml(str(demo_db), str(tmp_path / "ledger.db")))
    result = CliRunner().invoke(main, ["config", "check", str(path)])
    assert result.exit_code == 0, result.output
    assert "OK" in result.output and "patients" in result.output


def test_config_check_lists_every_problem_with_its_path(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "database": {"url": "sqlite:///x.db", "colour": "red"},
                "privacy": {"epsilon": -1, "composition": "basic"},
                "audit": {"mode": "maybe"},
                "tables": {
                    "t": {
                        "privacy_unit": "uid",
                        "columns": {"age": {"type": "integer", "lower": 10, "upper": 5}},
                    }
                },
            }
        )
    )
    result = CliRunner().invoke(main, ["config", "check", str(path)])
    assert result.exit_code == 2
    out = result.output
    for expected in (
        "ledger: missing",
        "database.colour: unknown setting",
        "privacy.epsilon: must be > 0",
        "privacy.composition: 'basic' is not one of zcdp, pure",
        "audit.mode: 'maybe' is not one of refuse, flag, off",
        "tables.t.privacy_unit: 'uid' is not a declared column",
        "tables.t.columns.age: lower (10.0) is above upper (5.0)",
    ):
        assert expected in out, out


def test_config_check_compares_with_the_database(demo_db: Path, tmp_path: Path) -> None:
    raw = yaml.safe_load(config_yaml(str(demo_db), str(tmp_path / "l.db")))
    raw["tables"]["patients"]["columns"]["height"] = {"type": "integer"}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    result = CliRunner().invoke(main, ["config", "check", str(path)])
    assert result.exit_code == 2
    assert "tables.patients.columns.height: no such column" in result.output


def test_config_check_reports_invalid_yaml(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("database: {url: [unclosed\n")
    result = CliRunner().invoke(main, ["config", "check", str(path)])
    assert result.exit_code == 2 and "not valid YAML" in result.output


def test_demo_builds_data_and_prints_a_working_key(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["demo", "--dir", str(tmp_path / "d"), "--no-serve"])
    assert result.exit_code == 0, result.output
    key = next(
        line.split(":", 1)[1].strip()
        for line in result.output.splitlines()
        if "demo analyst key" in line
    )
    assert (tmp_path / "d" / "hospital.db").exists()
    import budget
    from gateway.config import load_config

    config = load_config(tmp_path / "d" / "dpgate.yaml")
    ledger = budget.Ledger.from_url(config.ledger.url)
    analyst = ledger.authenticate(key)
    assert analyst is not None and analyst.name == "demo"
    assert "curl" in result.output and "/v1/query" in result.output
    # Running it again keeps the data and gives a fresh key.
    again = CliRunner().invoke(main, ["demo", "--dir", str(tmp_path / "d"), "--no-serve"])
    assert again.exit_code == 0 and key not in again.output
