"""Input limits checked before anything recurses or runs (issue 36): hostile bodies and
SQL get the error envelope — never a 500 — and cost nothing; honest input just inside
each limit is answered. Over HTTP, in process and over the PostgreSQL wire.

The attacks: JSON nested 1,000 deep (the parser's recursion), a 310-digit ε (a float
overflow), SQL nested 490 deep (sqlglot's recursion), ``WHERE #> 1`` (a TypeError inside
sqlglot), a 96 kB ``AND`` chain (seconds of CPU), a NUL character in a literal and
``ABS`` nested 22 deep (both accepted before, then failing at SQLite — charged).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from flask.testing import FlaskClient

from gateway.core.errors import InvalidRequest, SqlSyntaxError, UnsupportedQuery
from gateway.core.plan import QueryRequest
from gateway.pgwire.server import WireServer
from gateway.pipeline.gateway import Gateway
from gateway.pipeline.request import MAX_JSON_DEPTH, MAX_JSON_NUMBER_CHARS
from gateway.sql.analyze.limits import (
    MAX_CONNECTIVES,
    MAX_LIST_ITEMS,
    MAX_NESTING,
    MAX_STATEMENT_NODES,
    MAX_TOKENS,
    MAX_TREE_DEPTH,
)
from tests.conftest import wire_connect

COUNT = "SELECT COUNT(*) FROM patients WHERE "


def nested(opening: str, inner: str, closing: str, n: int) -> str:
    return opening * n + inner + closing * n


HOSTILE_SQL: dict[str, tuple[str, str]] = {
    "parentheses": (COUNT + nested("(", "age > 1", ")", 490), "unsupported_query"),
    "not": (COUNT + "NOT " * 490 + "age > 1", "unsupported_query"),
    "abs": (COUNT + nested("ABS(", "age", ")", 490) + " > 1", "unsupported_query"),
    "unary minus": (COUNT + "- " * 490 + "age > 1", "unsupported_query"),
    "subqueries": (
        "SELECT COUNT(*) FROM " + nested("(SELECT * FROM ", "patients", ") AS t", 490),
        "unsupported_query",
    ),
    "case": (COUNT + nested("CASE WHEN ", "age > 1", " THEN TRUE END", 200), "unsupported_query"),
    "json operator": ("SELECT COUNT(*) FROM patients WHERE #> 1", "sql_syntax"),
    "and chain": (COUNT + " AND ".join(["age > 1"] * 8_000), "unsupported_query"),
    # Under the token cap: the count of ANDs and ORs refuses it before the parser.
    "or chain under the token cap": (
        COUNT + " OR ".join(["age = 1"] * 1_990),
        "unsupported_query",
    ),
    "nul in a literal": (COUNT + "city = '\x00'", "unsupported_query"),
    "abs past sqlite's parser": (
        COUNT + nested("ABS(", "age", ")", 22) + " > 1",
        "unsupported_query",
    ),
    "coalesce past sqlite's parser": (
        COUNT + nested("COALESCE(", "age", ", 1)", 30) + " > 1",
        "unsupported_query",
    ),
}

HOSTILE_BODIES: dict[str, str] = {
    "arrays 981 deep": "[" * 981 + "]" * 981,
    "objects 2,000 deep": '{"a":' * 2000 + "1" + "}" * 2000,
    "nested in a field": '{"sql": "SELECT COUNT(*) FROM patients", "accuracy": '
    + nested("[", "1", "]", 100)
    + "}",
    "310-digit epsilon": '{"sql": "SELECT COUNT(*) FROM patients", "epsilon": ' + "1" * 310 + "}",
    "310-digit delta": '{"sql": "SELECT COUNT(*) FROM patients", "delta": ' + "1" * 310 + "}",
    "310-digit accuracy": '{"sql": "SELECT COUNT(*) FROM patients", '
    '"accuracy": {"ci95_halfwidth": ' + "9" * 310 + "}}",
    "400-digit float": '{"sql": "SELECT COUNT(*) FROM patients", "epsilon": 0.' + "1" * 400 + "}",
}


def spent(gateway: Gateway) -> float:
    return gateway.charges.status("alice").epsilon_spent


@pytest.mark.parametrize("name", HOSTILE_SQL)
def test_hostile_sql_is_refused_free_with_the_envelope(
    name: str, ask: Callable[..., Any], gateway: Gateway
) -> None:
    sql, code = HOSTILE_SQL[name]
    status, body = ask(sql, epsilon=0.1)
    assert status == 400, body
    assert body["ok"] is False and body["error"]["code"] == code, body
    assert spent(gateway) == 0.0


@pytest.mark.parametrize("name", HOSTILE_BODIES)
def test_hostile_json_bodies_are_refused_free_with_the_envelope(
    name: str, client: FlaskClient, auth: dict[str, str], gateway: Gateway
) -> None:
    resp = client.post(
        "/v1/query", data=HOSTILE_BODIES[name], headers=auth, content_type="application/json"
    )
    body = resp.get_json()
    assert resp.status_code == 400, body
    assert body["error"]["code"] == "invalid_request"
    assert body["error"]["detail"]["limit"] in ("max_json_depth", "max_json_number_chars")
    assert spent(gateway) == 0.0


def test_admin_bodies_have_the_same_limits(client: FlaskClient) -> None:
    from tests.conftest import ADMIN_KEY

    resp = client.post(
        "/v1/admin/analysts",
        data='{"name": "bob", "epsilon": ' + "1" * 310 + ', "delta": 0}',
        headers={"Authorization": f"Bearer {ADMIN_KEY}"},
        content_type="application/json",
    )
    assert resp.status_code == 400
    assert resp.get_json()["error"]["detail"]["limit"] == "max_json_number_chars"


def test_honest_input_just_inside_the_limits_is_answered(
    ask: Callable[..., Any], client: FlaskClient, auth: dict[str, str]
) -> None:
    # Nesting the analyzer accepts and SQLite parses once compiled.
    for sql in (
        COUNT + nested("(", "age > 1", ")", 20),
        COUNT + nested("ABS(", "age", ")", 20) + " > 1",
        COUNT + "NOT NOT NOT age > 1",
        COUNT + "city = 'Szeged'",
        COUNT + " OR ".join(f"age = {i}" for i in range(20)),
    ):
        status, body = ask(sql, epsilon=0.1)
        assert status == 200, (sql, body)
    # A long IN list is far inside the token limit.
    status, body = ask(COUNT + "age IN (" + ", ".join(map(str, range(1000))) + ")", epsilon=0.1)
    assert status == 200, body
    # A 17-significant-digit ε (what a double prints as) and the depth of a query body.
    resp = client.post(
        "/v1/query",
        data='{"sql": "SELECT COUNT(*) FROM patients", "epsilon": 0.10000000000000001}',
        headers=auth,
        content_type="application/json",
    )
    assert resp.status_code == 200, resp.get_json()
    resp = client.post(
        "/v1/query",
        data=json.dumps(
            {"sql": "SELECT COUNT(*) FROM patients", "accuracy": {"ci95_halfwidth": 50}}
        ),
        headers=auth,
        content_type="application/json",
    )
    assert resp.status_code == 200, resp.get_json()


def test_a_long_connective_chain_is_one_level_and_its_terms_are_counted(
    ask: Callable[..., Any], gateway: Gateway
) -> None:
    """sqlglot builds ``a OR b OR c …`` as a left-deep tree, but the query is flat: a chain
    of 40 terms (an IN list written out) is answered, though its tree is 40 deep
    (``max_depth`` is 32); its length is what is bounded, by ``max_connectives`` before
    parsing (and ``max_nodes`` after it)."""
    from gateway.sql.analyze.totality import MAX_DEPTH

    terms = MAX_DEPTH + 8
    status, body = ask(COUNT + " OR ".join(f"age = {i}" for i in range(terms)), epsilon=0.1)
    assert status == 200, body
    status, body = ask(COUNT + " AND ".join(f"age > {i}" for i in range(terms)), epsilon=0.1)
    assert status == 200, body
    # Chains inside chains still nest: each parenthesised OR in an AND is a level.
    deep = "age > 1"
    for i in range(MAX_DEPTH):
        deep = f"(age = {i} OR {deep})" if i % 2 else f"(age > {i} AND {deep})"
    status, body = ask(COUNT + deep, epsilon=0.1)
    assert status == 400 and body["error"]["detail"]["limit"] == "max_depth", body
    spent_before = spent(gateway)
    # n terms, n - 1 ORs
    status, body = ask(COUNT + " OR ".join(["age = 1"] * (MAX_CONNECTIVES + 2)), epsilon=0.1)
    assert status == 400 and body["error"]["detail"]["limit"] == "max_connectives", body
    # Within the count of ORs, the statement's tree is past its size once parsed ...
    status, body = ask(COUNT + " OR ".join(["age = 1"] * (MAX_CONNECTIVES + 1)), epsilon=0.1)
    assert status == 400 and body["error"]["detail"]["limit"] == "max_statement_nodes", body
    # ... and a shorter chain is past the row expression's (4 nodes a term).
    status, body = ask(COUNT + " OR ".join(["age = 1"] * 200), epsilon=0.1)
    assert status == 400 and body["error"]["detail"]["limit"] == "max_nodes", body
    assert spent(gateway) == spent_before


#: Parsed, then refused by the measure of the statement's tree before any later pass
#: copies, resolves or prints it: (SQL, the limit that refuses it).
PAST_THE_TREE_LIMITS: dict[str, tuple[str, str]] = {
    "a + chain": (COUNT + " + ".join(["age"] * (MAX_TREE_DEPTH + 2)) + " > 1", "max_tree_depth"),
    "a || chain": (
        COUNT + " || ".join(["city"] * (MAX_TREE_DEPTH + 2)) + " = 'x'",
        "max_tree_depth",
    ),
    "a HAVING chain": (
        "SELECT sex, COUNT(*) FROM patients GROUP BY sex HAVING "
        + " + ".join(["COUNT(*)"] * (MAX_TREE_DEPTH + 2))
        + " > 1",
        "max_tree_depth",
    ),
    "COALESCE's arguments": (
        COUNT + "COALESCE(" + ", ".join(["age"] * (MAX_LIST_ITEMS + 2)) + ") > 1",
        "max_list_items",
    ),
    "the select list": (
        "SELECT " + ", ".join(["COUNT(*)"] * (MAX_LIST_ITEMS + 1)) + " FROM patients",
        "max_list_items",
    ),
    "GROUP BY": (
        "SELECT COUNT(*) FROM patients GROUP BY "
        + ", ".join(f"age + {i}" for i in range(MAX_LIST_ITEMS + 1)),
        "max_list_items",
    ),
    "many comparisons": (
        COUNT + " AND ".join(f"age > {i}" for i in range(MAX_STATEMENT_NODES // 4 + 1)),
        "max_statement_nodes",
    ),
}


@pytest.mark.parametrize("name", sorted(PAST_THE_TREE_LIMITS))
def test_a_statement_past_the_tree_limits_is_refused_by_name_and_free(
    name: str, ask: Callable[..., Any], gateway: Gateway
) -> None:
    sql, limit = PAST_THE_TREE_LIMITS[name]
    status, body = ask(sql, epsilon=0.1)
    assert status == 400 and body["error"]["detail"]["limit"] == limit, body
    assert spent(gateway) == 0.0


def test_the_tree_limits_leave_honest_queries_alone(ask: Callable[..., Any]) -> None:
    """Just inside them: a 30-term sum (32 levels of the row expression's cap), 200
    group keys, an IN list of 1,000 values beside other terms."""
    status, body = ask(COUNT + " + ".join(["age"] * 30) + " > 1", epsilon=0.1)
    assert status == 200, body
    keys = ", ".join(f"age + {i}" for i in range(200))
    status, body = ask(
        f"SELECT {keys}, COUNT(*) FROM patients GROUP BY {keys} LIMIT 1", epsilon=0.1
    )
    assert status == 200, body
    values = ", ".join(str(i) for i in range(1_000))
    status, body = ask(COUNT + f"age IN ({values}) AND sex = 'F'", epsilon=0.1)
    assert status == 200, body


def test_the_limits_are_where_their_names_say() -> None:
    from gateway.pipeline.request import load_json

    load_json(nested("[", "1", "]", MAX_JSON_DEPTH))
    with pytest.raises(InvalidRequest):
        load_json(nested("[", "1", "]", MAX_JSON_DEPTH + 1))
    # Brackets inside strings are text, not nesting.
    assert load_json(json.dumps({"sql": "[" * 500})) == {"sql": "[" * 500}
    load_json("1" * MAX_JSON_NUMBER_CHARS)
    with pytest.raises(InvalidRequest):
        load_json("1" * (MAX_JSON_NUMBER_CHARS + 1))


def test_in_process_callers_get_the_same_refusals(gateway: Gateway) -> None:
    gateway.ledger.create_analyst("alice", 10.0, 1e-6)
    for sql, _ in HOSTILE_SQL.values():
        with pytest.raises((SqlSyntaxError, UnsupportedQuery)):
            gateway.query(
                "alice", QueryRequest(sql=sql, epsilon=0.1, delta=0.0, mechanism="laplace")
            )
    deepest = COUNT + nested("(", "age > 1", ")", MAX_NESTING)
    with pytest.raises(UnsupportedQuery):  # past SQLite's parser once compiled
        gateway.query(
            "alice", QueryRequest(sql=deepest, epsilon=0.1, delta=0.0, mechanism="laplace")
        )
    tokens = COUNT + " AND ".join(["age > 1"] * (MAX_TOKENS // 4 + 1))
    with pytest.raises(UnsupportedQuery, match="max_tokens"):
        gateway.query(
            "alice", QueryRequest(sql=tokens, epsilon=0.1, delta=0.0, mechanism="laplace")
        )
    with pytest.raises(InvalidRequest):  # an in-process caller's 310-digit ε
        gateway.query(
            "alice",
            QueryRequest(sql=COUNT + "age > 1", epsilon=10**310, delta=0.0, mechanism="laplace"),
        )
    assert spent(gateway) == 0.0


def test_the_wire_refuses_hostile_sql_free(wire: tuple[WireServer, int, str]) -> None:
    server, port, key = wire
    with wire_connect(port, key) as conn:
        for name, (sql, _) in {**HOSTILE_SQL, **PAST_THE_TREE_LIMITS}.items():
            if "\x00" in sql:
                continue  # libpq cannot send one
            with pytest.raises(psycopg.Error) as info:
                conn.execute(sql, prepare=False)
            assert info.value.sqlstate != "XX000", name
        conn.execute("SELECT 1")
    assert spent(server.gateway) == 0.0
