"""Released values respect what is public (post-processing, free under DP): a count is
never below 0, a SUM of a non-negative column never negative, an AVG and its 95% interval
within the column's declared bounds — on every backend the suite runs — unless the
request asks ``"raw": true``, which shows the same release's values as drawn.

The assertions hold for every draw of the noise (no false alarms): the tests ask at a
small ε over small groups, where raw counts below 0 and AVG intervals past the bounds
are common, and check the clamped answer against the raw one of the same release.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.core.config_load import parse_config
from gateway.core.plan import QueryRequest
from gateway.demo.hospital import config_yaml
from gateway.pipeline.gateway import Gateway
from tests.conftest import ADMIN_KEY
from tests.test_execution import _copy_demo

# small groups (disease × city × sex) at a small ε: raw counts of -5 and less are common
GROUPED = (
    "SELECT disease, city, sex, COUNT(*) AS n, SUM(income) AS s, AVG(glucose) AS g "
    "FROM patients WHERE age BETWEEN {lo} AND {hi} GROUP BY disease, city, sex"
)
GLUCOSE = (2.0, 20.0)


def _config(url: str, ledger: Path, schema: str | None) -> Any:
    raw = yaml.safe_load(config_yaml("/unused.db", str(ledger)))
    raw["database"]["url"] = url
    raw["execution"] = {"timing": "off"}
    raw["audit"] = {"mode": "off"}
    raw["analysts"] = [{"name": "demo", "epsilon": 1e6, "delta": 1e-6}]
    if schema:
        for t in raw["tables"].values():
            t["schema"] = schema
    return parse_config(raw)


BACKENDS = ["sqlite", "duckdb", pytest.param("postgres", marks=pytest.mark.postgres)]


@pytest.fixture(scope="module", params=BACKENDS)
def backend(
    request: pytest.FixtureRequest, demo_db: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Gateway]:
    root = tmp_path_factory.mktemp("bounds")
    schema: str | None = None
    admin: sa.Engine | None = None
    if request.param == "sqlite":
        url = f"sqlite:///{demo_db}"
    elif request.param == "duckdb":
        pytest.importorskip("duckdb_engine", reason="pip install duckdb-engine (the dev extra)")
        url = f"duckdb:///{root / 'hospital.duckdb'}"
        writer = sa.create_engine(url)
        _copy_demo(demo_db, writer, None)
        writer.dispose()
    else:
        url = os.environ.get("DPGATE_TEST_POSTGRES_URL", "")
        if not url:
            pytest.skip("set DPGATE_TEST_POSTGRES_URL to run PostgreSQL tests")
        schema = f"dpgate_bounds_{uuid.uuid4().hex[:10]}"
        admin = sa.create_engine(url)
        with admin.begin() as conn:
            conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
        _copy_demo(demo_db, admin, schema)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DPGATE_ADMIN_KEY", ADMIN_KEY)
        gateway = Gateway(_config(url, root / "ledger.db", schema))
    try:
        yield gateway
    finally:
        gateway.engine.dispose()
        gateway.ledger.close()
        if admin is not None:
            with admin.begin() as conn:
                conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
            admin.dispose()


def _ask(gateway: Gateway, sql: str, *, raw: bool = False) -> dict[str, Any]:
    request = QueryRequest(sql=sql, epsilon=0.05, delta=1e-7, mechanism="laplace", raw=raw)
    return gateway.query("demo", request).to_json()


def _within(value: float, bounds: tuple[float, float]) -> bool:
    return bounds[0] <= value <= bounds[1]


def assert_release_within_public_bounds(gateway: Gateway, sql: str) -> None:
    """``sql`` (a ``GROUPED`` query) released once and shown twice, clamped and raw: the
    clamped counts and sums are the raw ones moved to 0 at most, the AVG and its interval
    within glucose's declared bounds, and the answer says when it moved a value."""
    shown = _ask(gateway, sql)
    raw = _ask(gateway, sql, raw=True)
    assert raw["cached"] and raw["query_id"] == shown["query_id"]  # one release, charged once
    assert len(raw["rows"]) == len(shown["rows"])  # the same rows: only values differ
    intervals = shown["accuracy"]["g"]["ci95_intervals"]
    for row, raw_row, interval in zip(shown["rows"], raw["rows"], intervals, strict=True):
        n, s, g = row[3:]
        raw_n, raw_s = raw_row[3:5]
        assert isinstance(n, int) and n == max(raw_n, 0)
        assert s == max(raw_s, 0)
        assert g is None or _within(g, GLUCOSE)
        if interval is not None:
            assert _within(interval[0], GLUCOSE) and _within(interval[1], GLUCOSE)
            assert interval[0] <= g <= interval[1]
    moved = any(r[3] < 0 or r[4] < 0 for r in raw["rows"]) or any(
        iv is not None and (iv[0] < GLUCOSE[0] or iv[1] > GLUCOSE[1])
        for iv in raw["accuracy"]["g"]["ci95_intervals"]
    )
    # the answer says when it moved a value, and never when it did not
    assert ("clamped" in shown) == moved
    assert "clamped" not in raw


def assert_quantiles_within_public_bounds(gateway: Gateway) -> None:
    """A quantile is chosen among the declared bounds' candidates: within them, raw or
    not (nothing to clamp)."""
    sql = "SELECT disease, MEDIAN(glucose) AS m, PERCENTILE_CONT(0.9) WITHIN GROUP "
    sql += "(ORDER BY age) AS a FROM patients GROUP BY disease"
    for raw in (False, True):
        answer = _ask(gateway, sql, raw=raw)
        for _disease, m, a in answer["rows"]:
            assert m is None or _within(m, GLUCOSE)
            assert a is None or _within(a, (0, 100))


@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
    derandomize=True,
)
@given(lo=st.integers(0, 90), width=st.integers(0, 30))
def test_released_values_lie_within_public_bounds(backend: Gateway, lo: int, width: int) -> None:
    assert_release_within_public_bounds(backend, GROUPED.format(lo=lo, hi=lo + width))


def test_quantiles_lie_within_public_bounds(backend: Gateway) -> None:
    assert_quantiles_within_public_bounds(backend)


def test_raw_values_are_the_noisy_values_as_drawn(backend: Gateway) -> None:
    """With ``raw`` the counts are unbiased: across the groups of one query at ε = 0.05,
    some raw count is negative (in this data 168 groups of size ≤ 12 with scale 20 noise:
    the chance that none is below 0 is under 1e-40)."""
    sql = GROUPED.format(lo=0, hi=100)
    raw = _ask(backend, sql, raw=True)
    assert any(r[3] < 0 for r in raw["rows"])
    assert "clamped" not in raw
    shown = _ask(backend, sql)
    assert shown["cached"] and all(r[3] >= 0 for r in shown["rows"])
    assert "raw" in shown["clamped"]["note"] and "n" in shown["clamped"]["columns"]


def test_a_limit_cuts_the_same_release(backend: Gateway) -> None:
    """A ``LIMIT 1`` probe and the full query are two cuts of one release: the second is
    free and its first row is the probe's row."""
    sql = GROUPED.format(lo=20, hi=60) + " ORDER BY n DESC"
    probe = _ask(backend, sql + " LIMIT 1")
    assert not probe["cached"] and len(probe["rows"]) == 1
    full = _ask(backend, sql)
    assert full["cached"] and full["query_id"] == probe["query_id"]
    assert full["rows"][0] == probe["rows"][0] and len(full["rows"]) > 1
    assert len(full["accuracy"]["g"]["ci95_intervals"]) == len(full["rows"])
    offset = _ask(backend, sql + " LIMIT 2 OFFSET 1")
    assert offset["cached"] and offset["rows"] == full["rows"][1:3]
    assert offset["accuracy"]["g"]["ci95_intervals"] == full["accuracy"]["g"]["ci95_intervals"][1:3]
