"""``dpgate config check --measure`` (gateway/pipeline/calibration.py): it counts each table's rows,
times the statements dpgate compiles for each query shape on the real protected database
(SQLite, PostgreSQL), and prints coefficients that make the cost model cover every shape
it measured — as config the admin can paste, since the deadline may only follow what the
config declares (docs/privacy.md, "Timing"). It touches neither the protected data nor
the ledger. No assertion here is about how fast anything runs: only about what the
report says and how its figures relate.
"""

from __future__ import annotations

import os
import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
import yaml
from click.testing import CliRunner

from gateway.cli import main
from gateway.cli.measure_report import measure_config
from gateway.core.config_load import load_config, parse_config
from gateway.demo.hospital import build, config_yaml
from gateway.pipeline.calibration import (
    Calibration,
    Shape,
    fit,
    power_of_two_up,
    round_rows_up,
    rounded_up,
)
from gateway.pipeline.cost_model import CostModel, EngineCosts, TableCost

POSTGRES_URL = os.environ.get("DPGATE_TEST_POSTGRES_URL")
TABLES = ("patients", "visits", "zip_regions")
BOOLEANS = ("smoker",)


@pytest.fixture(scope="module")
def small_demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("measure") / "hospital.db"
    build(path, patients=400)
    return path


def _suggested(output: str) -> dict[str, Any]:
    """The YAML the report ends with (from its ``execution:`` line)."""
    lines = output.splitlines()
    start = lines.index("execution:")
    raw = yaml.safe_load("\n".join(line.split("   #")[0] for line in lines[start:]))
    assert isinstance(raw, dict)
    return raw


def test_measure_prints_config_that_loads_and_counts_every_table(
    small_demo: Path, tmp_path: Path
) -> None:
    ledger = tmp_path / "ledger.db"
    path = tmp_path / "dpgate.yaml"
    path.write_text(config_yaml(str(small_demo), str(ledger)))
    before = small_demo.read_bytes()
    result = CliRunner().invoke(main, ["config", "check", str(path), "--measure", "--repeat", "1"])
    assert result.exit_code == 0, result.output
    assert "Measured on the protected database (sqlite" in result.output
    assert "become public only if you put them in the config" in result.output
    suggested = _suggested(result.output)
    db = sqlite3.connect(small_demo)
    for table in TABLES:
        count = db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
        assert f"tables.{table}: {count:,} rows" in result.output
        assert suggested["tables"][table]["rows"] >= count
    db.close()
    coefficients = suggested["execution"]
    # the margin, from the slowest of one run per CPU at once: at least 1, in halves
    margin = coefficients.pop("deadline_margin")
    assert margin >= 1 and 2 * margin == int(2 * margin)
    assert set(coefficients) == {"row_ns", "op_ns", "sort_ns", "join_ns", "group_ns", "base_ms"}
    for value in coefficients.values():
        assert value > 0 and power_of_two_up(value) == value  # rounded to powers of two
    # pasted into the config, the suggestion is a valid config whose model sizes every table
    raw = yaml.safe_load(path.read_text())
    raw["execution"].update(coefficients)
    for table, declared in suggested["tables"].items():
        raw["tables"][table]["rows"] = declared["rows"]
    assert parse_config(raw).execution.row_ns == coefficients["row_ns"]
    # neither the protected database nor the configured ledger was written
    assert small_demo.read_bytes() == before
    assert not ledger.exists()


def test_without_measure_nothing_is_timed(small_demo: Path, tmp_path: Path) -> None:
    path = tmp_path / "dpgate.yaml"
    path.write_text(config_yaml(str(small_demo), str(tmp_path / "ledger.db")))
    result = CliRunner().invoke(main, ["config", "check", str(path)])
    assert result.exit_code == 0, result.output
    assert "Measured on" not in result.output and "execution:" not in result.output


def _covers(cal: Calibration) -> None:
    """Every measured shape is covered by the suggested coefficients, each shape's
    features are those the gateway's own cost model computes from its SQL."""
    assert {s.table for s in cal.shapes} == {"patients", "visits"}  # zip_regions is public
    names = {s.name for s in cal.shapes if s.table == "visits"}
    assert {"count", "sum", "long where", "quantile", "group by", "join patients"} <= names
    for shape in cal.shapes:
        assert cal.estimate_ms(shape, cal.suggested) >= shape.ms, shape.name
        assert cal.estimate_ms(shape, cal.fitted) >= shape.ms * (1 - 1e-9), shape.name
    # the visits statements sort (its unit is not kept unique), patients' simple ones not
    by = {(s.table, s.name): s for s in cal.shapes}
    assert by[("visits", "sum")].windows >= 1
    assert by[("patients", "sum")].windows == 0
    assert len(by[("visits", "long where")].sql) > len(by[("visits", "sum")].sql)


def test_measured_coefficients_cover_every_shape_on_sqlite(
    small_demo: Path, tmp_path: Path
) -> None:
    cfg = load_config_text(config_yaml(str(small_demo), str(tmp_path / "ledger.db")), tmp_path)
    cal = measure_config(cfg, repeat=1)
    assert cal.engine == "sqlite"
    assert (
        cal.counts["visits"]
        == sqlite3.connect(small_demo).execute("SELECT COUNT(*) FROM visits").fetchone()[0]
    )
    _covers(cal)


def load_config_text(text: str, tmp_path: Path) -> Any:
    path = tmp_path / "dpgate.yaml"
    path.write_text(text)
    return load_config(str(path))


@pytest.fixture
def postgres_demo(small_demo: Path) -> Iterator[tuple[str, str]]:
    """The small demo copied into a fresh PostgreSQL schema: (URL, schema)."""
    if not POSTGRES_URL:
        pytest.skip("set DPGATE_TEST_POSTGRES_URL to run PostgreSQL tests")
    schema = f"dpgate_measure_{uuid.uuid4().hex[:10]}"
    source = sa.create_engine(f"sqlite:///{small_demo}")
    target = sa.create_engine(POSTGRES_URL)
    meta = sa.MetaData()
    meta.reflect(source, only=list(TABLES))
    copies = sa.MetaData(schema=schema)
    with target.begin() as conn:
        conn.exec_driver_sql(f"CREATE SCHEMA {schema}")
        for table in meta.sorted_tables:
            # SQLite stores the demo's booleans as integers; PostgreSQL has the type
            columns = [
                sa.Column(
                    c.name,
                    sa.Boolean() if c.name in BOOLEANS else c.type,
                    primary_key=c.primary_key,
                    nullable=c.nullable,
                )
                for c in table.columns
            ]
            copy = sa.Table(table.name, copies, *columns)
            copy.create(conn)
            with source.connect() as read:
                rows = [
                    {k: bool(v) if k in BOOLEANS else v for k, v in r._mapping.items()}
                    for r in read.execute(sa.select(table))
                ]
            conn.execute(copy.insert(), rows)
    source.dispose()
    try:
        yield POSTGRES_URL, schema
    finally:
        with target.begin() as conn:
            conn.exec_driver_sql(f"DROP SCHEMA {schema} CASCADE")
        target.dispose()


def test_measured_coefficients_cover_every_shape_on_postgres(
    postgres_demo: tuple[str, str], tmp_path: Path
) -> None:
    url, schema = postgres_demo
    raw = yaml.safe_load(config_yaml("x.db", str(tmp_path / "ledger.db")))
    raw["database"]["url"] = url
    for table in raw["tables"].values():
        table["schema"] = schema
    cal = measure_config(parse_config(raw), repeat=1)
    assert cal.engine == "postgres"
    assert cal.counts["patients"] == 400
    _covers(cal)


def _shape(
    rows: int, ops: float, windows: int, lookup: int, ms: float, group_keys: int = 0
) -> Shape:
    return Shape(
        "t", "s", "SELECT", rows, lookup, windows, max(rows, lookup), ms, group_keys, row_ops=ops
    )


def test_fit_recovers_the_coefficients_of_a_model_it_can_express() -> None:
    """Times generated by the cost model itself are fitted back to its coefficients."""
    truth = EngineCosts(row_ns=90, op_ns=0.7, sort_ns=40, join_ns=300, base_ms=2, group_ns=150)
    shapes = [
        _shape(rows, n, w, lookup, 0.0, g)
        for rows, n, w, lookup, g in [
            (10_000, 15, 0, 0, 0),
            (10_000, 150, 0, 0, 0),
            (50_000, 25, 1, 0, 0),
            (50_000, 45, 2, 0, 0),
            (20_000, 35, 0, 2_000, 0),
            (80_000, 20, 0, 0, 0),
            (30_000, 30, 0, 0, 1),
        ]
    ]
    cal = Calibration("sqlite", {}, (), 2.0, truth, truth, 0.0, 2)
    shapes = [
        Shape(
            s.table,
            s.name,
            s.sql,
            s.rows,
            s.lookup_rows,
            s.windows,
            s.largest,
            cal.estimate_ms(s, truth),
            s.group_keys,
            row_ops=s.row_ops,
        )
        for s in shapes
    ]
    fitted = fit(shapes, base_ms=2.0)
    for name in ("row_ns", "op_ns", "sort_ns", "join_ns", "group_ns"):
        assert getattr(fitted, name) == pytest.approx(getattr(truth, name), rel=1e-6), name


def test_fit_is_raised_until_every_shape_is_covered() -> None:
    """Times no non-negative model fits exactly: the fit is raised to cover the worst."""
    shapes = [_shape(10_000, 100, 0, 0, 5.0), _shape(10_000, 100, 0, 0, 9.0)]
    fitted = fit(shapes, base_ms=1.0)
    cal = Calibration("sqlite", {}, tuple(shapes), 1.0, fitted, rounded_up(fitted), 0.0, 2)
    assert all(cal.estimate_ms(s, fitted) >= s.ms - 1e-9 for s in shapes)
    assert cal.estimate_ms(shapes[1], fitted) == pytest.approx(9.0)


def test_rounding_is_coarse_and_upward() -> None:
    assert [power_of_two_up(x) for x in (0, 0.3, 1, 1.01, 100)] == [1 / 64, 0.5, 1, 2, 128]
    assert [round_rows_up(n) for n in (0, 7, 99, 100, 1234, 27_830, 96_000)] == [
        10,
        10,
        100,
        100,
        1300,
        28_000,
        96_000,
    ]


def test_postgres_is_told_which_index_serves_the_per_unit_bound(
    postgres_demo: tuple[str, str], tmp_path: Path
) -> None:
    """A table without a unit key (visits) and no index leading with its unit: config check
    names the index to create; once it exists, it says so (and names none)."""
    url, schema = postgres_demo
    raw = yaml.safe_load(config_yaml("x.db", str(tmp_path / "ledger.db")))
    raw["database"]["url"] = url
    for table in raw["tables"].values():
        table["schema"] = schema
    path = tmp_path / "dpgate.yaml"
    path.write_text(yaml.safe_dump(raw))
    advice = (
        f"no index leads with patient_id: CREATE INDEX visits_patient_id_dpgate ON {schema}.visits"
    )
    result = CliRunner().invoke(main, ["config", "check", str(path)])
    assert result.exit_code == 0, result.output
    assert advice in result.output
    assert "patients_patient_id_dpgate" not in result.output  # its unit is its key
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            f"CREATE INDEX visits_patient_id_dpgate ON {schema}.visits (patient_id)"
        )
    engine.dispose()
    result = CliRunner().invoke(main, ["config", "check", str(path)])
    assert result.exit_code == 0, result.output
    assert "CREATE INDEX" not in result.output
    assert "privacy unit patient_id: an index leads with it" in result.output


def test_sqlite_says_what_the_per_unit_windows_cost(small_demo: Path, tmp_path: Path) -> None:
    path = tmp_path / "dpgate.yaml"
    path.write_text(config_yaml(str(small_demo), str(tmp_path / "ledger.db")))
    result = CliRunner().invoke(main, ["config", "check", str(path)])
    assert result.exit_code == 0, result.output
    visits = result.output.split("tables.visits")[1].split("tables.zip_regions")[0]
    assert "bounded by per-unit windows" in visits
    patients = result.output.split("tables.patients")[1].split("tables.visits")[0]
    assert "per-unit windows" not in patients  # its unit is its key
    assert "several times a scan of the table, with or without an index" in result.output
    # the read bound that spares a query with a WHERE its second window; no index is
    # named on SQLite (it slowed the windowed queries at 1M rows)
    assert "max_rows_read_per_unit: 5 keeps the rows read" in visits
    assert "CREATE INDEX" not in result.output
    assert "max_rows_read_per_unit" not in patients
    raw = yaml.safe_load(path.read_text())
    raw["tables"]["visits"]["max_rows_read_per_unit"] = 5
    path.write_text(yaml.safe_dump(raw))
    result = CliRunner().invoke(main, ["config", "check", str(path)])
    assert result.exit_code == 0, result.output
    visits = result.output.split("tables.visits")[1].split("tables.zip_regions")[0]
    assert "max_rows_read_per_unit" not in visits
    assert "bounded by per-unit windows" in visits


def test_the_fitted_features_are_the_cost_models_own(small_demo: Path, tmp_path: Path) -> None:
    """What the fit calls a shape's cost is what ``CostModel.statement_ms`` computes for the
    same statement and row counts (a plain query, one with windows, a join): coefficients
    fitted on one are the right ones for the other."""
    import budget
    from gateway.pipeline.gateway import Gateway

    cfg = load_config_text(config_yaml(str(small_demo), str(tmp_path / "l.db")), tmp_path)
    ledger = budget.Ledger.from_url(f"sqlite:///{tmp_path / 'ledger.db'}")
    gw = Gateway(cfg, ledger=ledger)
    costs = EngineCosts(row_ns=70, op_ns=0.9, sort_ns=33, join_ns=410, base_ms=3, group_ns=120)
    rows = {"patients": 5_000, "visits": 21_000, "zip_regions": 1_920}
    model = CostModel(
        tables={k: TableCost(rows=n, sorts=False) for k, n in rows.items()}, engine=costs, cpus=2
    )
    cal = Calibration("sqlite", rows, (), 3.0, costs, costs, 0.0, 2)
    for sql in [
        "SELECT AVG(age) FROM patients",
        "SELECT department, COUNT(*) FROM visits WHERE year >= 2022 GROUP BY department",
        "SELECT COUNT(*) FROM visits a JOIN patients b ON a.patient_id = b.patient_id",
    ]:
        plan = gw.analyze(sql)
        compiled = gw.compile(plan)
        statement = compiled.sql
        anchor = rows[plan.table]
        # the demo's references are every_row_matches: each query joins its lookup
        joined = [t.name.lower() for t in plan.join.tables[1:]] if plan.join else []
        assert joined
        lookup = sum(rows[t] for t in joined)
        shape = Shape(
            plan.table,
            sql,
            statement,
            anchor,
            lookup,
            statement.upper().count(" OVER ("),
            max(anchor, lookup),
            0.0,
            len(plan.group_keys),
            len(joined),
            row_ops=compiled.row_ops,
        )
        assert cal.estimate_ms(shape, costs) == pytest.approx(model.statement_ms(plan, compiled))
    gw.engine.dispose()
    ledger.engine.dispose()
