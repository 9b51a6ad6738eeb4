"""Released values respect what is public on ClickHouse (chDB) and Spark SQL (local), as
tests/test_public_bounds.py checks on SQLite, DuckDB and PostgreSQL (issue 38): counts
never below 0, SUMs of a non-negative column never negative, an AVG and its interval
within the declared bounds, quantiles within them — unless ``"raw": true`` is asked.

The demo's patients (3,000 rows) are loaded once per engine; the property runs on a few
derandomized examples (each one statement: the raw view of a release is its cached
copy), so the Spark worker's one session runs a handful of jobs.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.core.config_load import parse_config
from gateway.demo.hospital import config_yaml
from gateway.pipeline.gateway import Gateway
from tests import engines
from tests.conftest import ADMIN_KEY
from tests.test_public_bounds import (
    GROUPED,
    assert_quantiles_within_public_bounds,
    assert_release_within_public_bounds,
)

ENGINES = [
    pytest.param("clickhouse", marks=engines.SLOW),
    pytest.param("spark", marks=[engines.SLOW, engines.SPARK_GROUP]),
]
#: The demo's patients columns the queries read, as ``engines.load`` declares them.
COLUMNS = {
    "patient_id": "integer",
    "sex": "text",
    "age": "integer",
    "city": "text",
    "disease": "text",
    "glucose": "real",
    "income": "integer",
}


def _patients(demo_db: Path) -> list[dict[str, Any]]:
    db = sqlite3.connect(demo_db)
    try:
        rows = db.execute(f"SELECT {', '.join(COLUMNS)} FROM patients").fetchall()
    finally:
        db.close()
    return [dict(zip(COLUMNS, r, strict=True)) for r in rows]


@pytest.fixture(scope="module", params=ENGINES)
def backend(
    request: pytest.FixtureRequest, demo_db: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    kind = request.param
    database = engines.new_database("bounds")
    engines.load(
        kind,
        tmp_path_factory,
        database,
        "patients",
        COLUMNS,
        _patients(demo_db),
        not_null=[c for c in COLUMNS if c != "glucose"],
    )
    root = tmp_path_factory.mktemp("bounds-engines")
    raw = yaml.safe_load(config_yaml("/unused.db", str(root / "ledger.db")))
    patients = raw["tables"]["patients"]
    patients["schema"] = database
    patients.pop("references", None)
    patients["columns"] = {c: patients["columns"][c] for c in COLUMNS}
    raw["tables"] = {"patients": patients}
    raw["database"]["url"] = engines.url(kind, tmp_path_factory)
    raw["database"]["statement_timeout_ms"] = 600_000  # a loaded machine's Spark jobs
    raw["execution"] = {"timing": "off"}
    raw["audit"] = {"mode": "off"}
    raw["analysts"] = [{"name": "demo", "epsilon": 1e6, "delta": 1e-6}]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DPGATE_ADMIN_KEY", ADMIN_KEY)
        gateway = Gateway(parse_config(raw))
    try:
        yield gateway
    finally:
        gateway.engine.dispose()
        gateway.ledger.close()


@settings(
    max_examples=3,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
    derandomize=True,
)
@given(lo=st.integers(0, 90), width=st.integers(0, 30))
def test_released_values_lie_within_public_bounds(backend: Gateway, lo: int, width: int) -> None:
    assert_release_within_public_bounds(backend, GROUPED.format(lo=lo, hi=lo + width))


def test_quantiles_lie_within_public_bounds(backend: Gateway) -> None:
    assert_quantiles_within_public_bounds(backend)
