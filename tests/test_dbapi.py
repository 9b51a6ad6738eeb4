"""The DB-API 2.0 driver: module globals, safe parameter binding, cursors, errors, URLs."""

from __future__ import annotations

import datetime as dt
import decimal

import pytest

from dpgate_client import dbapi, errors
from dpgate_client.binding import bind, render_literal

try:
    from test_client_fakes import FakeGateway, error, gateway, released
except ImportError:  # tests/ imported as a package
    from tests.test_client_fakes import FakeGateway, error, gateway, released

__all__ = ["gateway"]


def test_module_globals_follow_pep_249() -> None:
    assert dbapi.apilevel == "2.0"
    assert dbapi.threadsafety in (1, 2)
    assert dbapi.paramstyle == "named"
    for name in (
        "Warning",
        "Error",
        "InterfaceError",
        "DatabaseError",
        "DataError",
        "OperationalError",
        "IntegrityError",
        "InternalError",
        "ProgrammingError",
        "NotSupportedError",
    ):
        assert issubclass(getattr(dbapi, name), Exception)
    assert issubclass(dbapi.DatabaseError, dbapi.Error)
    assert issubclass(dbapi.InterfaceError, dbapi.Error)
    for name in ("DataError", "OperationalError", "IntegrityError", "InternalError"):
        assert issubclass(getattr(dbapi, name), dbapi.DatabaseError)
    assert issubclass(dbapi.ProgrammingError, dbapi.DatabaseError)
    assert issubclass(dbapi.NotSupportedError, dbapi.DatabaseError)
    assert not issubclass(dbapi.Warning, dbapi.Error)
    assert issubclass(errors.BudgetExhaustedError, dbapi.OperationalError)
    assert issubclass(errors.AuditRefusedError, dbapi.OperationalError)
    assert dbapi.NUMBER == "integer" and dbapi.NUMBER == "real" and dbapi.STRING == "text"
    assert dbapi.DATETIME == "date" and dbapi.NUMBER != "text"
    assert dbapi.Date(2024, 1, 2) == dt.date(2024, 1, 2)


# --- binding -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "literal"),
    [
        (None, "NULL"),
        (True, "TRUE"),
        (False, "FALSE"),
        (42, "42"),
        (-7, "-7"),
        (2.5, "2.5"),
        (1e-7, "1e-07"),
        (decimal.Decimal("1.50"), "1.50"),
        ("Crohn", "'Crohn'"),
        ("O'Brien", "'O''Brien'"),
        ("'; DROP TABLE patients; --", "'''; DROP TABLE patients; --'"),
        ("back\\slash", "'back\\slash'"),
        ("ünïcode ✓", "'ünïcode ✓'"),
        (dt.date(2024, 3, 1), "'2024-03-01'"),
        (dt.datetime(2024, 3, 1, 12, 30), "'2024-03-01 12:30:00'"),
        (dt.time(8, 15), "'08:15:00'"),
    ],
)
def test_scalars_render_as_quoted_literals(value: object, literal: str) -> None:
    assert render_literal(value) == literal


@pytest.mark.parametrize(
    "value",
    [[1, 2], (1, 2), {"a": 1}, {1, 2}, object(), float("nan"), float("inf"), "a\x00b"],
)
def test_non_scalars_and_non_finite_values_are_refused(value: object) -> None:
    with pytest.raises(errors.ProgrammingError):
        render_literal(value)


def test_numpy_scalars_bind_as_their_python_values() -> None:
    np = pytest.importorskip("numpy")
    assert render_literal(np.int64(7)) == "7"
    assert render_literal(np.float64(2.5)) == "2.5"
    assert render_literal(np.bool_(True)) == "TRUE"
    assert render_literal(np.str_("F")) == "'F'"
    with pytest.raises(errors.ProgrammingError):
        render_literal(np.array([1, 2]))
    with pytest.raises(errors.ProgrammingError):
        render_literal(np.float64("nan"))


def test_bytes_are_not_supported() -> None:
    with pytest.raises(errors.NotSupportedError):
        render_literal(b"\x00")


def test_named_placeholders_are_replaced_outside_quotes_and_comments() -> None:
    sql = (
        "SELECT ':x' AS \":x\", COUNT(*) -- :x in a comment\n"
        "FROM t /* :x */ WHERE a = :x AND b::text = :y AND c = 'it''s :x'"
    )
    assert bind(sql, {"x": "v'1", "y": 3}) == (
        "SELECT ':x' AS \":x\", COUNT(*) -- :x in a comment\n"
        "FROM t /* :x */ WHERE a = 'v''1' AND b::text = 3 AND c = 'it''s :x'"
    )


def test_qmark_placeholders_bind_a_sequence_in_order() -> None:
    assert bind("SELECT COUNT(*) FROM t WHERE a = ? AND b = '?' AND c = ?", ("x", 2)) == (
        "SELECT COUNT(*) FROM t WHERE a = 'x' AND b = '?' AND c = 2"
    )


def test_injection_attempts_stay_inside_one_literal() -> None:
    sql = bind("SELECT COUNT(*) FROM patients WHERE sex = :sex", {"sex": "F' OR '1'='1"})
    assert sql == "SELECT COUNT(*) FROM patients WHERE sex = 'F'' OR ''1''=''1'"


def test_without_parameters_the_sql_is_untouched() -> None:
    sql = "SELECT COUNT(*) FROM t WHERE a = ':x' OR b LIKE '%?%'"
    assert bind(sql, None) == sql


@pytest.mark.parametrize(
    ("sql", "parameters"),
    [
        ("SELECT :a", {}),
        ("SELECT :a", [1]),
        ("SELECT ?", {"a": 1}),
        ("SELECT ?, ?", [1]),
        ("SELECT :a, ?", {"a": 1}),
        ("SELECT :a", "abc"),
        ("SELECT :a", 5),
        ("SELECT :a", {"a": [1, 2]}),
    ],
)
def test_mismatched_parameters_are_programming_errors(sql: str, parameters: object) -> None:
    with pytest.raises(errors.ProgrammingError):
        bind(sql, parameters)  # type: ignore[arg-type]


# --- connections and cursors -------------------------------------------------------------


def test_cursor_executes_binds_and_fetches(gateway: FakeGateway) -> None:
    conn = dbapi.connect(gateway.url, key="k", epsilon=0.25)
    cur = conn.cursor()
    assert cur.description is None and cur.rowcount == -1 and cur.arraysize == 1
    gateway.routes[("POST", "/v1/query")] = released(
        [("sex", "text"), ("n", "integer")], [["F", 10], ["M", 12], [None, 3]]
    )
    assert cur.execute("SELECT sex, COUNT(*) AS n FROM patients WHERE age > :age", {"age": 65})
    assert gateway.last["body"] == {
        "sql": "SELECT sex, COUNT(*) AS n FROM patients WHERE age > 65",
        "epsilon": 0.25,
    }
    assert cur.description == (
        ("sex", "text", None, None, None, None, True),
        ("n", "integer", None, None, None, None, True),
    )
    assert cur.description[1][1] == dbapi.NUMBER
    assert cur.rowcount == 3
    assert cur.fetchone() == ("F", 10)
    assert cur.fetchmany() == [("M", 12)]
    assert cur.fetchall() == [(None, 3)]
    assert cur.fetchone() is None and cur.fetchall() == [] and cur.fetchmany(5) == []
    assert cur.privacy is not None and cur.privacy.epsilon == 0.5
    assert cur.accuracy["n"].ci95_halfwidth == 5.99
    assert cur.budget is not None and cur.budget.epsilon_remaining == 8.0
    assert cur.query_id == "q-1" and cur.cached is False
    cur.execute("SELECT 1", epsilon=1.0, mechanism="gaussian", delta=1e-8)
    assert gateway.last["body"] == {
        "sql": "SELECT 1",
        "epsilon": 1.0,
        "delta": 1e-8,
        "mechanism": "gaussian",
    }
    assert list(cur) == [("F", 10), ("M", 12), (None, 3)]


def test_executemany_runs_each_parameter_set(gateway: FakeGateway) -> None:
    cur = dbapi.connect(gateway.url, key="k").cursor()
    cur.executemany("SELECT COUNT(*) FROM patients WHERE sex = :s", [{"s": "F"}, {"s": "M"}])
    sent = [r["body"]["sql"] for r in gateway.requests]
    assert sent == [
        "SELECT COUNT(*) FROM patients WHERE sex = 'F'",
        "SELECT COUNT(*) FROM patients WHERE sex = 'M'",
    ]
    assert cur.rowcount == 2


def test_closed_objects_and_early_fetches_are_interface_errors(gateway: FakeGateway) -> None:
    conn = dbapi.connect(gateway.url, key="k")
    cur = conn.cursor()
    with pytest.raises(errors.InterfaceError):
        cur.fetchone()
    cur.close()
    with pytest.raises(errors.InterfaceError):
        cur.execute("SELECT 1")
    conn.commit()
    conn.rollback()
    conn.close()
    assert conn.closed
    conn.rollback()  # harmless after close: pools call it on check-in
    with pytest.raises(errors.InterfaceError):
        conn.cursor()
    with pytest.raises(errors.NotSupportedError):
        dbapi.connect(gateway.url, key="k").cursor().callproc("p")


def test_gateway_errors_reach_the_cursor_with_their_fields(gateway: FakeGateway) -> None:
    gateway.routes[("POST", "/v1/query")] = error(
        403, "audit_refused", "With earlier answers this would single out fewer than 5 people."
    )
    cur = dbapi.connect(gateway.url, key="k").cursor()
    with pytest.raises(dbapi.OperationalError) as caught:
        cur.execute("SELECT COUNT(*) FROM patients WHERE age = 97")
    assert isinstance(caught.value, errors.AuditRefusedError)
    assert caught.value.code == "audit_refused" and caught.value.status == 403
    assert cur.description is None and cur.rowcount == -1


def test_ping_uses_the_budget_endpoint_and_checks_the_key(gateway: FakeGateway) -> None:
    conn = dbapi.connect(gateway.url, key="bad")
    assert conn.ping() and gateway.last["path"] == "/v1/budget"
    gateway.routes[("GET", "/v1/budget")] = error(401, "unauthenticated", "Unknown API key.")
    with pytest.raises(errors.AuthenticationError):
        conn.ping()


# --- URLs --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("dpgate://KEY@127.0.0.1:8000", {"url": "http://127.0.0.1:8000", "key": "KEY"}),
        ("dpgate+http://KEY@h:1", {"url": "http://h:1", "key": "KEY"}),
        ("dpgate+https://KEY@gw.example", {"url": "https://gw.example", "key": "KEY"}),
        ("dpgate://alice:s%2Fk@h:8000", {"url": "http://h:8000", "key": "s/k"}),
        ("dpgate://KEY@h:8000/dp", {"url": "http://h:8000/dp", "key": "KEY"}),
        (
            "dpgate://KEY@h:8000?epsilon=0.5&mechanism=gaussian&delta=1e-7",
            {
                "url": "http://h:8000",
                "key": "KEY",
                "epsilon": "0.5",
                "mechanism": "gaussian",
                "delta": "1e-7",
            },
        ),
        ("http://h:8000/", {"url": "http://h:8000/"}),
        ("dpgate://KEY@[::1]:8000", {"url": "http://[::1]:8000", "key": "KEY"}),
    ],
)
def test_urls_parse_into_connect_arguments(url: str, expected: dict[str, str]) -> None:
    assert dbapi.parse_url(url) == expected


@pytest.mark.parametrize("url", ["postgres://h/db", "dpgate://KEY@h?epsilon=1&colour=red"])
def test_bad_urls_are_interface_errors(url: str) -> None:
    with pytest.raises(errors.InterfaceError):
        dbapi.parse_url(url)


def test_connect_with_host_and_port(gateway: FakeGateway) -> None:
    port = int(gateway.url.rsplit(":", 1)[1])
    conn = dbapi.connect(host="127.0.0.1", port=port, key="k2", mechanism="gaussian")
    conn.cursor().execute("SELECT 1")
    assert gateway.last["authorization"] == "Bearer k2"
    assert gateway.last["body"] == {"sql": "SELECT 1", "mechanism": "gaussian"}


def test_connect_with_a_dpgate_url(gateway: FakeGateway) -> None:
    url = gateway.url.replace("http://", "dpgate://analyst:k3@") + "?epsilon=0.75"
    with dbapi.connect(url) as conn, conn.cursor() as cur:
        cur.execute("SELECT 1")
    assert gateway.last["authorization"] == "Bearer k3"
    assert gateway.last["body"] == {"sql": "SELECT 1", "epsilon": 0.75}
