"""Nothing leaks: no response, of any kind, carries a protected value that was not
declared public (docs/design.md, invariant 5: only what is declared public is
published), and no input makes the query endpoint fail with a 500, a stack trace, or
rows on a refusal (a property-based test with hypothesis).
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

import pytest
from flask.testing import FlaskClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.pipeline.gateway import Gateway

PROBES = [
    "SELECT COUNT(*) FROM patients WHERE name = 'x'",
    "SELECT name, COUNT(*) FROM patients GROUP BY name",
    "SELECT COUNT(*) FROM patients WHERE name LIKE 'A%'",
    "SELECT * FROM patients",
    "SELECT patient_id FROM patients",
    "SELECT MAX(name) FROM patients",
    "SELECT COUNT(*) FROM patients WHERE CAST(zip AS INTEGER) > 1000",
    "SELECT zip, COUNT(*) FROM patients GROUP BY zip",
    "SELECT zip, COUNT(*) FROM patients WHERE age > 90 GROUP BY zip",
    "SELECT COUNT(*) FROM patients WHERE patient_id = 1",
    "SELECT COUNT(*) FROM (SELECT * FROM patients) AS t",
    "SELECT income, COUNT(*) FROM patients GROUP BY income",
    "SELECT glucose, COUNT(*) FROM patients GROUP BY glucose",
    "SELECT COUNT(*) FROM patients; SELECT name FROM patients",
    "SELECT disease, AVG(income) FROM patients GROUP BY disease",
    "SELECT city, zip, COUNT(*) FROM patients GROUP BY city, zip",
]


def _protected(gateway: Gateway) -> tuple[set[str], set[str]]:
    """Values that must never appear: names (never declared), and zip codes shared by at
    most two people (not declared public: partition selection keeps them out, except
    with probability far below 1e-6 at the δ used here)."""
    db = gateway.config.database.url.removeprefix("sqlite:///")
    with sqlite3.connect(db) as conn:
        names = {r[0] for r in conn.execute("SELECT name FROM patients")}
        rare_zips = {
            r[0] for r in conn.execute("SELECT zip FROM patients GROUP BY zip HAVING COUNT(*) <= 2")
        }
    return names, rare_zips


def test_no_response_carries_an_undeclared_protected_value(
    client: FlaskClient, auth: dict[str, str], gateway: Gateway
) -> None:
    names, rare_zips = _protected(gateway)
    bodies: list[str] = []
    released_keys: set[Any] = set()
    for sql in PROBES:
        for eps in (0.1, 1.0):
            resp = client.post("/v1/query", json={"sql": sql, "epsilon": eps}, headers=auth)
            bodies.append(resp.get_data(as_text=True))
            body = resp.get_json()
            if body.get("ok"):
                released_keys |= {v for row in body["rows"] for v in row if isinstance(v, str)}
    for path in ("/v1/schema", "/v1/budget", "/v1/queries", "/openapi.json", "/nope"):
        bodies.append(client.get(path, headers=auth).get_data(as_text=True))
    text = "\n".join(bodies)
    assert [n for n in names if n in text] == []
    assert released_keys & rare_zips == set()
    # Sanity: the test would see them if they were there.
    assert any(n.startswith("Anna") for n in names) and rare_zips


SQL_WORDS = st.sampled_from(
    [
        "SELECT",
        "COUNT(*)",
        "SUM(income)",
        "AVG(age)",
        "MAX(age)",
        "FROM",
        "patients",
        "visits",
        "WHERE",
        "GROUP BY",
        "HAVING",
        "ORDER BY",
        "LIMIT",
        "age",
        "zip",
        "name",
        "sex",
        "patient_id",
        ">",
        "=",
        "'F'",
        "1",
        "0.5",
        "(",
        ")",
        ",",
        "*",
        "AND",
        "OR",
        "NOT",
        "IN",
        "BETWEEN",
        "LIKE",
        "'%'",
        "NULL",
        "IS",
        "UNION",
        "JOIN",
        ";",
        "--",
        "/*",
        "DROP",
        "TABLE",
        "CASE",
        "WHEN",
        "THEN",
        "END",
        "DISTINCT",
        "AS",
        "t",
        '"',
        "'",
        "\\",
        "\x00",
        "é",
        "OVER",
        "()",
        "version()",
    ]
)
SQLISH = st.lists(SQL_WORDS, min_size=0, max_size=14).map(" ".join)
VALID_PREFIX = st.sampled_from(
    [
        "SELECT COUNT(*) FROM patients WHERE ",
        "SELECT sex, COUNT(*) FROM patients GROUP BY ",
        "SELECT COUNT(*) FROM visits ",
    ]
)
VALID_SQL = st.sampled_from(
    [
        "SELECT COUNT(*) FROM patients WHERE age > 30",
        "SELECT sex, AVG(income) FROM patients GROUP BY sex",
        "SELECT zip, COUNT(*) FROM patients GROUP BY zip",
        "SELECT 1",
    ]
)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=6,
)
BODIES = st.one_of(
    st.fixed_dictionaries(
        {
            "sql": st.one_of(
                SQLISH,
                VALID_PREFIX.flatmap(lambda p: SQLISH.map(lambda s: p + s)),
                VALID_SQL,  # so that odd parameters meet a query that gets past analysis
            )
        },
        optional={
            "epsilon": JSON_VALUES,
            "delta": JSON_VALUES,
            "mechanism": st.sampled_from(["laplace", "gaussian", "x", ""]) | JSON_VALUES,
            "dry_run": JSON_VALUES,
        },
    ),
    JSON_VALUES,
    st.dictionaries(st.text(max_size=10), JSON_VALUES, max_size=4),
)


@settings(
    max_examples=250,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(body=BODIES)
def test_no_input_yields_a_500_a_trace_or_rows_on_refusal(
    client: FlaskClient, auth: dict[str, str], body: Any
) -> None:
    resp = client.post(
        "/v1/query",
        data=json.dumps(body, allow_nan=True),
        headers={**auth, "Content-Type": "application/json"},
    )
    assert resp.status_code < 500 or resp.status_code == 503, resp.get_data(as_text=True)
    payload = resp.get_json()
    text = resp.get_data(as_text=True)
    assert "Traceback" not in text and 'File "' not in text
    if resp.status_code != 200:
        assert set(payload) == {"ok", "status", "error"}
        assert payload["ok"] is False and "rows" not in payload


@pytest.mark.parametrize(
    "raw",
    [b"", b"{", b"\xff\xfe", b"null", b'"sql"', b"[]", b"1e999", b'{"sql": "SELECT 1"'],
)
def test_malformed_bodies_get_invalid_request(
    client: FlaskClient, auth: dict[str, str], raw: bytes
) -> None:
    resp = client.post("/v1/query", data=raw, headers={**auth, "Content-Type": "application/json"})
    assert resp.status_code == 400
    assert resp.get_json()["error"]["code"] == "invalid_request"
