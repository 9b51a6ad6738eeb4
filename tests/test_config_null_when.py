"""``null_when``: a column declared NULL exactly when a condition on the table's other
columns holds — read and checked when the config loads (each problem with its field's
path and line), reported by ``dpgate config check`` and ``GET /v1/schema``."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner, Result

from gateway.cli import main
from gateway.core.config import ConfigError
from gateway.core.config_load import load_config, parse_config
from gateway.core.joins import audit_relations
from gateway.pipeline.catalog import public_schema

EMPLOYMENT = ["Employed", "Unemployed", "Not in labour force"]


def _raw(**columns: dict[str, Any]) -> dict[str, Any]:
    """A census-like config whose ``persons`` columns are the defaults updated by
    ``columns`` (a column given as ``{}`` is removed)."""
    declared: dict[str, dict[str, Any]] = {
        "person_id": {"type": "integer"},
        "age": {"type": "integer", "lower": 0, "upper": 100, "nullable": False},
        "employment": {"type": "text", "values": EMPLOYMENT, "null_when": "age < 16"},
        "occupation": {
            "type": "text",
            "values": ["Managers", "Clerical"],
            "null_when": "employment IS NULL OR employment <> 'Employed'",
        },
        "hours_worked": {"type": "integer", "lower": 0, "upper": 99},
        "retired": {"type": "boolean"},
        "moved_in": {"type": "date"},
        "area": {"type": "text"},
    }
    for name, column in columns.items():
        if column:
            declared[name] = {**declared.get(name, {}), **column}
        else:
            declared.pop(name)
    return {
        "database": {"url": "sqlite:///census.db"},
        "ledger": {"url": "sqlite:///ledger.db"},
        "tables": {
            "persons": {"privacy_unit": "person_id", "columns": declared},
            "areas": {
                "public": True,
                "key": "area",
                "columns": {"area": {"type": "text"}, "region": {"type": "text"}},
            },
        },
    }


def _problems(raw: dict[str, Any]) -> list[str]:
    with pytest.raises(ConfigError) as e:
        parse_config(raw)
    return e.value.problems


def test_a_condition_is_read_into_one_spelling_and_makes_the_column_nullable() -> None:
    config = parse_config(
        _raw(
            hours_worked={
                "null_when": "Employment IS NOT NULL AND NOT (employment IN ('Employed'))"
            },
            retired={"null_when": 'age BETWEEN 0 AND 15 OR "AGE" < 16'},
        )
    )
    columns = config.tables["persons"].columns
    assert columns["occupation"].null_when == "employment IS NULL OR employment <> 'Employed'"
    assert columns["occupation"].nullable is True  # the catalogue cannot say otherwise
    # IS NOT NULL is written NOT … IS NULL, and column names in lower case
    assert columns["hours_worked"].null_when == (
        "NOT employment IS NULL AND NOT (employment IN ('Employed'))"
    )
    assert columns["retired"].null_when == "age BETWEEN 0 AND 15 OR age < 16"
    assert columns["age"].null_when is None


@pytest.mark.parametrize(
    ("condition", "problem"),
    [
        ("employment =", "not a SQL condition"),
        ("age <", "not a SQL condition"),
        ("  ", "must be a SQL condition"),
        ("occupation IS NULL", "'occupation' is this column: whether it is NULL cannot"),
        ("salary > 0", "'salary' is not a declared column of this table"),
        ("name = 'x'", "'name' is not a declared column"),  # in the table, not declared
        ("areas.region = 'South'", "`areas.region` names another table's column"),
        ("person_id > 100", "'person_id' is the privacy unit"),
        ("LOWER(employment) = 'employed'", "compare a column itself with constants"),
        ("age + 1 > 16", "compare a column itself with constants"),
        ("age > hours_worked", "compare a column with constants only"),
        ("employment > 'E'", "text compares with =, <>, IN and NOT IN only"),
        ("employment = 1", "employment is text, so compare it with a quoted string"),
        ("age = '16'", "age is integer, so compare it with a number"),
        ("retired = 1", "retired is boolean, so compare it with TRUE or FALSE"),
        ("moved_in < '2020-01-01'", "a date column is read here with IS NULL only"),
        ("employment = NULL", "compare with NULL using IS NULL or IS NOT NULL"),
        ("employment <> 'Employd'", "'Employd' is not one of employment's declared values"),
        ("employment IN (SELECT 1)", "IN takes a list of constants"),
        ("retired", "is not supported: write comparisons"),
        ("retired IS TRUE", "is not supported: write comparisons"),
    ],
)
def test_a_condition_that_is_not_a_comparison_of_declared_columns_is_refused(
    condition: str, problem: str
) -> None:
    problems = _problems(_raw(occupation={"null_when": condition}))
    path = "tables.persons.columns.occupation.null_when: "
    assert any(p.startswith(path) and problem in p for p in problems), problems


def test_a_condition_contradicting_its_column_or_its_table_is_refused() -> None:
    problems = _problems(_raw(occupation={"nullable": False}))
    assert problems == [
        "tables.persons.columns.occupation.null_when: the column is declared nullable: "
        "false, so it is never NULL"
    ]
    raw = _raw()
    raw["tables"]["areas"]["columns"]["region"]["null_when"] = "area = '1000'"
    (problem,) = _problems(raw)
    assert problem.startswith("tables.areas.columns.region.null_when: a public table's rows")
    (problem,) = _problems(_raw(occupation={"null_when": 3}))
    assert (
        problem
        == "tables.persons.columns.occupation.null_when: must be a SQL condition, as a string"
    )


def test_every_problem_is_reported_with_its_line(tmp_path: Path) -> None:
    raw = _raw(occupation={"null_when": "salary > 0"}, retired={"null_when": "retired = TRUE"})
    path = tmp_path / "dpgate.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    with pytest.raises(ConfigError) as e:
        load_config(path)
    lines = path.read_text().splitlines()
    assert len(e.value.problems) == 2
    for problem, column in zip(e.value.problems, ("occupation", "retired"), strict=True):
        number = int(problem.split(":", 1)[0].removeprefix("line "))
        assert lines[number - 1].strip().startswith("null_when:"), (problem, lines[number - 1])
        assert f"columns.{column}.null_when" in problem


def test_a_lookup_keeps_its_condition_only_where_every_row_matches() -> None:
    """In a join's relation a lookup's columns are named ``table.column``; its condition
    follows them where every row matches (inner-joined in every query), and is dropped
    where a row may match nothing (its columns then all NULL, whatever it says)."""
    raw = _raw()
    raw["tables"]["jobs"] = {
        "privacy_unit": "person_id",
        "max_rows_per_unit": 3,
        "references": {"person_id": {"to": "persons.person_id", "every_row_matches": True}},
        "columns": {"person_id": {"type": "integer"}, "wage": {"type": "integer"}},
    }
    relation = audit_relations(parse_config(raw).tables)["jobs"]
    assert relation.columns["persons.occupation"].null_when == (
        '"persons.employment" IS NULL OR "persons.employment" <> \'Employed\''
    )
    raw["tables"]["jobs"]["references"] = {"person_id": "persons.person_id"}
    relation = audit_relations(parse_config(raw).tables)["jobs"]
    assert relation.columns["persons.occupation"].null_when is None


def test_the_schema_publishes_the_condition() -> None:
    config = parse_config(_raw())
    (persons,) = [t for t in public_schema(config.tables)["tables"] if t["name"] == "persons"]
    columns = {c["name"]: c for c in persons["columns"]}
    assert columns["employment"]["null_when"] == "age < 16"
    assert columns["employment"]["nullable"] is True
    assert "null_when" not in columns["age"]


def _config_check(tmp_path: Path, employment: str) -> Result:
    """``dpgate config check`` of the census config over an empty database whose
    ``employment`` column is declared ``employment`` in its DDL."""
    db = tmp_path / "census.db"
    with sqlite3.connect(db) as conn:
        conn.execute(
            "CREATE TABLE persons (person_id INTEGER PRIMARY KEY, age INTEGER NOT NULL, "
            f"employment {employment}, occupation TEXT, hours_worked INTEGER, "
            "retired INTEGER, moved_in TEXT, area TEXT)"
        )
        conn.execute("CREATE TABLE areas (area TEXT PRIMARY KEY, region TEXT)")
    raw = _raw()
    raw["database"]["url"] = f"sqlite:///{db}"
    raw["ledger"]["url"] = f"sqlite:///{tmp_path / 'ledger.db'}"
    path = tmp_path / "dpgate.yaml"
    path.write_text(yaml.safe_dump(raw))
    return CliRunner().invoke(main, ["config", "check", str(path)])


def test_config_check_lists_the_declared_conditions(tmp_path: Path) -> None:
    result = _config_check(tmp_path, "TEXT")
    assert result.exit_code == 0, result.output
    assert "NULL exactly when: employment (age < 16)" in result.output
    assert (
        "NULL exactly when: occupation (employment IS NULL OR employment <> 'Employed')"
        in result.output
    )
    assert "`null_when`" in result.output  # what it means, once
    # a column with a condition is nullable by declaration, not by the catalogue
    catalogue_only = result.output.split("Nullable only by the catalogue", 1)[-1]
    assert "columns.occupation" not in catalogue_only
    assert "columns.employment" not in catalogue_only
    assert "keeps it NOT NULL" not in result.output


def test_config_check_warns_of_a_condition_on_a_column_kept_not_null(tmp_path: Path) -> None:
    """The catalogue's NOT NULL and a condition that holds somewhere leave out every row
    where it holds: said, from catalogue metadata alone."""
    result = _config_check(tmp_path, "TEXT NOT NULL")
    assert result.exit_code == 0, result.output
    (line,) = [x for x in result.output.splitlines() if "NOT NULL:" in x]
    assert "NULL exactly when: employment (age < 16)" in line
    assert "every row where the condition holds is left out" in line
