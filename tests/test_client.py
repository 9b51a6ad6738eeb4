"""The Python client against a scripted gateway: requests sent, results parsed, errors raised."""

from __future__ import annotations

import dataclasses
import datetime as dt
import pickle
import socket

import pytest

import dpgate_client
from dpgate_client import Client, ColumnSchema, errors

try:
    from test_client_fakes import FakeGateway, error, gateway, released
except ImportError:  # tests/ imported as a package
    from tests.test_client_fakes import FakeGateway, error, gateway, released

__all__ = ["gateway"]  # the fixture, re-exported for pytest


def test_query_sends_sql_privacy_parameters_and_bearer_key(gateway: FakeGateway) -> None:
    client = Client(gateway.url, "k-123")
    client.query("SELECT COUNT(*) FROM patients", epsilon=0.5, delta=1e-7, mechanism="gaussian")
    assert gateway.last["authorization"] == "Bearer k-123"
    assert gateway.last["body"] == {
        "sql": "SELECT COUNT(*) FROM patients",
        "epsilon": 0.5,
        "delta": 1e-7,
        "mechanism": "gaussian",
    }


def test_query_leaves_out_parameters_the_gateway_should_default(gateway: FakeGateway) -> None:
    Client(gateway.url, "k").query("SELECT 1")
    assert gateway.last["body"] == {"sql": "SELECT 1"}
    Client(gateway.url, "k").query("SELECT 1", dry_run=True)
    assert gateway.last["body"] == {"sql": "SELECT 1", "dry_run": True}


def test_a_released_answer_is_frozen_and_carries_cost_and_accuracy(gateway: FakeGateway) -> None:
    answer = Client(gateway.url, "k").query("SELECT disease, COUNT(*) AS n FROM patients")
    assert answer.column_names == ("disease", "n")
    assert answer.rows == (("Crohn", 312),)
    assert answer.accuracy["n"].ci95_halfwidth == 5.99
    assert answer.accuracy["n"].stddev == 2.04
    assert answer.privacy == dpgate_client.Privacy("laplace", 0.5, 0.0, 0.125)
    assert answer.cost is answer.privacy
    assert answer.budget is not None and answer.budget.epsilon_remaining == 8.0
    assert answer.query_id == "q-1" and answer.cached is False
    with pytest.raises(dataclasses.FrozenInstanceError):
        answer.rows = ()  # type: ignore[misc]
    with pytest.raises(TypeError):
        answer.accuracy["n"] = None  # type: ignore[index]


def test_values_are_converted_to_their_declared_types(gateway: FakeGateway) -> None:
    gateway.routes[("POST", "/v1/query")] = released(
        [("day", "date"), ("flag", "boolean"), ("mean", "real"), ("n", "integer")],
        [["2024-03-01", 1, 3, 7], [None, 0, 2.5, 8]],
    )
    answer = Client(gateway.url, "k").query("SELECT …")
    assert answer.rows == ((dt.date(2024, 3, 1), True, 3.0, 7), (None, False, 2.5, 8))
    assert isinstance(answer.rows[0][2], float)


def test_to_pandas_keeps_accuracy_and_cost_in_attrs(gateway: FakeGateway) -> None:
    pd = pytest.importorskip("pandas")
    frame = Client(gateway.url, "k").query("SELECT …").to_pandas()
    assert isinstance(frame, pd.DataFrame)
    assert list(frame.columns) == ["disease", "n"]
    assert frame["n"].tolist() == [312]
    assert frame.attrs["accuracy"] == {"n": {"ci95_halfwidth": 5.99, "stddev": 2.04}}
    assert frame.attrs["privacy"]["epsilon"] == 0.5
    assert frame.attrs["budget"]["epsilon_remaining"] == 8.0


AVG_ACCURACY = {
    "ci95_intervals": [[5.61, 6.02], None],
    "sum": {"ci95_halfwidth": 34.0, "stddev": 11.3},
    "count": {"ci95_halfwidth": 6.0, "stddev": 2.0},
}


def test_avg_accuracy_keeps_its_intervals_and_parts(gateway: FakeGateway) -> None:
    """An AVG has no single half-width: per-row intervals and its SUM and COUNT parts."""
    gateway.routes[("POST", "/v1/query")] = released(
        [("sex", "text"), ("mean_glucose", "real")],
        [["F", 5.8], ["M", None]],
        accuracy={"mean_glucose": AVG_ACCURACY},
    )
    answer = Client(gateway.url, "k").query("SELECT sex, AVG(glucose) …")
    accuracy = answer.accuracy["mean_glucose"]
    assert accuracy.ci95_intervals == ((5.61, 6.02), None)
    assert accuracy.sum == dpgate_client.Accuracy(34.0, 11.3)
    assert accuracy.count == dpgate_client.Accuracy(6.0, 2.0)
    assert (accuracy.ci95_halfwidth, accuracy.stddev) == (None, None)
    pytest.importorskip("pandas")
    frame = answer.to_pandas()
    assert frame.attrs["accuracy"]["mean_glucose"] == {
        "ci95_halfwidth": None,
        "stddev": None,
        **AVG_ACCURACY,
    }


def test_quantile_and_spread_accuracy_keep_their_rank_interval_and_parts(
    gateway: FakeGateway,
) -> None:
    gateway.routes[("POST", "/v1/query")] = released(
        [("m", "real"), ("s", "real")],
        [[41.0, 12.5]],
        accuracy={
            "m": {"quantile": 0.5, "rank_ci95_halfwidth": 8, "buckets": 101, "note": "…"},
            "s": {**AVG_ACCURACY, "sum_squares": {"ci95_halfwidth": 900.0, "stddev": 300.0}},
        },
    )
    answer = Client(gateway.url, "k").query("SELECT MEDIAN(age) AS m, STDDEV(age) AS s …")
    median, spread = answer.accuracy["m"], answer.accuracy["s"]
    assert (median.quantile, median.rank_ci95_halfwidth) == (0.5, 8)
    assert median.to_dict()["rank_ci95_halfwidth"] == 8
    assert spread.sum_squares == dpgate_client.Accuracy(900.0, 300.0)
    assert spread.to_dict()["sum_squares"] == {"ci95_halfwidth": 900.0, "stddev": 300.0}


def test_partition_selection_is_reported(gateway: FakeGateway) -> None:
    selection = {"threshold": 43, "note": "Groups need about 43 people …"}
    gateway.routes[("POST", "/v1/query")] = released(
        [("zip", "text"), ("n", "integer")], [], partition_selection=selection
    )
    answer = Client(gateway.url, "k").query("SELECT zip, COUNT(*) AS n …")
    assert answer.rows == () and answer.partition_selection == selection


def test_rows_left_out_by_the_audit_are_reported(gateway: FakeGateway) -> None:
    left_out = {"groups": [{"disease": "Meningitis"}], "reason": "the audit leaves …"}
    gateway.routes[("POST", "/v1/query")] = released(
        [("disease", "text"), ("n", "integer")], [["Crohn", 12]], audit_left_out=left_out
    )
    answer = Client(gateway.url, "k").query("SELECT disease, COUNT(*) AS n …")
    assert answer.audit_left_out is not None
    assert answer.audit_left_out["reason"] == left_out["reason"]
    assert [dict(g) for g in answer.audit_left_out["groups"]] == left_out["groups"]


def test_an_audit_refusal_says_what_to_ask_instead(gateway: FakeGateway) -> None:
    suggestions = ["SELECT SUM(x) AS s, COUNT(*) AS n FROM t", "SELECT COUNT(*) AS n FROM t"]
    gateway.routes[("POST", "/v1/query")] = error(
        403,
        "audit_refused",
        "this query would …",
        charged=False,
        groups=["smoker = TRUE"],
        ask_instead=suggestions,
    )
    with pytest.raises(errors.AuditRefusedError) as caught:
        Client(gateway.url, "k").query("SELECT SUM(x) AS s FROM t")
    refusal = caught.value
    assert refusal.ask_instead == suggestions
    assert refusal.groups == ["smoker = TRUE"] and refusal.charged is False


def test_history_is_read_from_the_queries_list(gateway: FakeGateway) -> None:
    entry = {"query_id": "q-1", "sql": "SELECT COUNT(*) FROM patients", "outcome": "answered"}
    gateway.routes[("GET", "/v1/queries")] = (200, {"ok": True, "queries": [entry]})
    assert Client(gateway.url, "k").queries() == [entry]
    gateway.routes[("GET", "/v1/queries")] = (200, {"ok": True, "items": [entry]})
    with pytest.raises(errors.InterfaceError):
        Client(gateway.url, "k").queries()


def test_dry_run_has_a_plan_and_cost_but_no_rows(gateway: FakeGateway) -> None:
    gateway.routes[("POST", "/v1/query")] = (
        200,
        {
            "ok": True,
            "dry_run": True,
            "plan": {"table": "patients"},
            "privacy": {"mechanism": "laplace", "epsilon": 0.1, "delta": 0, "rho": 0.005},
            "accuracy": {"n": {"ci95_halfwidth": 30.0, "stddev": 14.1}},
            "would_fit": True,
        },
    )
    answer = Client(gateway.url, "k").query("SELECT COUNT(*) AS n FROM patients", dry_run=True)
    assert answer.dry_run and answer.rows == () and answer.plan == {"table": "patients"}
    assert answer.would_fit is True
    assert answer.privacy is not None and answer.privacy.epsilon == 0.1
    assert answer.accuracy["n"].ci95_halfwidth == 30.0


def test_budget_and_schema(gateway: FakeGateway) -> None:
    client = Client(gateway.url, "k")
    budget = client.budget()
    assert (budget.epsilon_total, budget.epsilon_spent, budget.epsilon_remaining) == (10, 1.5, 8.5)
    assert budget.composition == "zcdp" and budget.analyst == "alice"
    schema = client.schema()
    assert schema.table_names == ("patients", "visits")
    patients = schema.table("patients")
    assert patients is not None and patients.privacy_unit == "patient_id"
    age = patients.column("age")
    assert age is not None and (age.type, age.lower, age.upper) == ("integer", 0, 120)
    sex = patients.column("sex")
    assert sex is not None and sex.values == ("F", "M")


def test_a_fresh_budget_reports_zero_spent_not_unknown(gateway: FakeGateway) -> None:
    gateway.routes[("GET", "/v1/budget")] = (
        200,
        {"ok": True, "budget": {"epsilon": 5.0, "epsilon_spent": 0.0, "delta_spent": 0.0}},
    )
    budget = Client(gateway.url, "k").budget()
    assert (budget.epsilon_total, budget.epsilon_spent, budget.delta_spent) == (5.0, 0.0, 0.0)


def test_nested_budget_shapes_are_understood(gateway: FakeGateway) -> None:
    gateway.routes[("GET", "/v1/budget")] = (
        200,
        {
            "ok": True,
            "budget": {
                "total": {"epsilon": 4.0, "delta": 1e-6},
                "spent": {"epsilon": 1.0, "delta": 0.0},
                "remaining": {"epsilon": 3.0, "delta": 1e-6},
                "composition": "pure",
                "name": "carol",
                "queries": 3,
                "max_next_laplace_epsilon": 2.5,
            },
        },
    )
    budget = Client(gateway.url, "k").budget()
    assert (budget.epsilon_total, budget.epsilon_spent, budget.epsilon_remaining) == (4, 1, 3)
    assert budget.composition == "pure" and budget.analyst == "carol"
    assert budget.queries == 3 and budget.max_next_laplace_epsilon == 2.5


@pytest.mark.parametrize(
    ("status", "code", "cls", "pep249_base"),
    [
        (400, "invalid_request", errors.InvalidRequestError, errors.ProgrammingError),
        (400, "sql_syntax", errors.SQLSyntaxError, errors.ProgrammingError),
        (400, "unsupported_query", errors.UnsupportedQueryError, errors.ProgrammingError),
        (400, "unknown_table", errors.UnknownTableError, errors.ProgrammingError),
        (400, "unknown_column", errors.UnknownColumnError, errors.ProgrammingError),
        (
            400,
            "invalid_privacy_parameters",
            errors.InvalidPrivacyParametersError,
            errors.ProgrammingError,
        ),
        (401, "unauthenticated", errors.AuthenticationError, errors.OperationalError),
        (403, "forbidden", errors.ForbiddenError, errors.OperationalError),
        (403, "budget_exhausted", errors.BudgetExhaustedError, errors.OperationalError),
        (403, "audit_refused", errors.AuditRefusedError, errors.OperationalError),
        (429, "rate_limited", errors.RateLimitedError, errors.OperationalError),
        (503, "database_unavailable", errors.DatabaseUnavailableError, errors.OperationalError),
        (503, "ledger_unavailable", errors.LedgerUnavailableError, errors.OperationalError),
        (503, "shutting_down", errors.ShuttingDownError, errors.OperationalError),
        (500, "internal", errors.InternalError, errors.DatabaseError),
        (400, "some_future_code", errors.ProgrammingError, errors.DatabaseError),
        (503, "some_future_outage", errors.OperationalError, errors.DatabaseError),
    ],
)
def test_every_gateway_error_code_maps_to_its_class(
    gateway: FakeGateway,
    status: int,
    code: str,
    cls: type[errors.Error],
    pep249_base: type[errors.Error],
) -> None:
    gateway.routes[("POST", "/v1/query")] = error(status, code, "Something is wrong.", line=1)
    with pytest.raises(cls) as caught:
        Client(gateway.url, "k").query("SELECT …")
    exc = caught.value
    assert type(exc) is cls
    assert isinstance(exc, pep249_base) and isinstance(exc, errors.DatabaseError)
    assert (exc.code, exc.status, exc.message) == (code, status, "Something is wrong.")
    assert exc.detail == {"line": 1}
    assert str(exc).startswith("Something is wrong.") and code in str(exc)


def test_the_client_knows_every_code_the_gateway_sends() -> None:
    """Each gateway error has its own client class, with the same code and status."""
    from gateway.core.errors import ALL_ERRORS

    for server_class in ALL_ERRORS:
        server_error = server_class("Something is wrong.")
        exc = errors.error_from_response(server_error.status, server_error.to_dict())
        assert type(exc).code == server_class.code, server_class.__name__
        assert (exc.code, exc.status) == (server_class.code, server_class.status)
        assert type(exc).status == server_class.status
    # And the other way: each leaf's code is one the gateway sends, or the client's own.
    client_side = {"connection_failed", "interface_error", "not_supported"}
    server_codes = {c.code for c in ALL_ERRORS}
    for name in errors.__all__:
        cls = getattr(errors, name)
        own_leaf = isinstance(cls, type) and "code" in vars(cls) and not cls.__subclasses__()
        if own_leaf and issubclass(cls, errors.Error):
            assert cls.code in server_codes | client_side, name


def test_syntax_errors_say_where(gateway: FakeGateway) -> None:
    gateway.routes[("POST", "/v1/query")] = error(
        400, "sql_syntax", "Unexpected token FORM.", line=1, column=17
    )
    with pytest.raises(errors.SQLSyntaxError) as caught:
        Client(gateway.url, "k").query("SELECT COUNT(*) FORM patients")
    assert str(caught.value) == "Unexpected token FORM. (line 1, column 17) [dpgate: sql_syntax]"


def test_errors_survive_pickling(gateway: FakeGateway) -> None:
    gateway.routes[("POST", "/v1/query")] = error(403, "budget_exhausted", "Out of budget.", left=0)
    with pytest.raises(errors.BudgetExhaustedError) as caught:
        Client(gateway.url, "k").query("SELECT …")
    copy = pickle.loads(pickle.dumps(caught.value))
    assert type(copy) is errors.BudgetExhaustedError
    assert (copy.code, copy.status, copy.message, dict(copy.detail)) == (
        "budget_exhausted",
        403,
        "Out of budget.",
        {"left": 0},
    )


def test_rate_limits_say_when_to_retry(gateway: FakeGateway) -> None:
    gateway.routes[("POST", "/v1/query")] = error(429, "rate_limited", "Slow down.", retry_after=7)
    with pytest.raises(errors.RateLimitedError) as caught:
        Client(gateway.url, "k").query("SELECT 1")
    assert caught.value.retry_after == 7.0


def test_a_proxy_error_page_is_still_a_readable_error(gateway: FakeGateway) -> None:
    gateway.routes[("POST", "/v1/query")] = (502, "<html><body>Bad Gateway</body></html>")
    with pytest.raises(errors.OperationalError) as caught:
        Client(gateway.url, "k").query("SELECT 1")
    assert caught.value.status == 502 and "Bad Gateway" in str(caught.value)


def test_a_non_dpgate_success_body_is_an_interface_error(gateway: FakeGateway) -> None:
    gateway.routes[("GET", "/v1/budget")] = (200, "<html>login page</html>")
    with pytest.raises(errors.InterfaceError):
        Client(gateway.url, "k").budget()


def test_an_unreachable_gateway_is_an_operational_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(errors.ConnectionFailedError) as caught:
        Client(f"http://127.0.0.1:{port}", "k", timeout=5).budget()
    assert isinstance(caught.value, errors.OperationalError)
    assert f"127.0.0.1:{port}" in str(caught.value)


def test_key_defaults_to_the_environment(
    gateway: FakeGateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DPGATE_KEY", "from-env")
    monkeypatch.setenv("DPGATE_URL", gateway.url)
    Client().budget()
    assert gateway.last["authorization"] == "Bearer from-env"


@pytest.mark.parametrize("url", ["ftp://x", "127.0.0.1:8000", "http://user:key@host"])
def test_bad_urls_are_refused_early(url: str) -> None:
    with pytest.raises(errors.InterfaceError):
        Client(url, "k")


def test_base_url_prefix_is_kept(gateway: FakeGateway) -> None:
    gateway.routes[("GET", "/dp/v1/budget")] = gateway.routes[("GET", "/v1/budget")]
    Client(gateway.url + "/dp/", "k").budget()
    assert gateway.last["path"] == "/dp/v1/budget"


def test_public_api_is_pinned() -> None:
    assert set(dpgate_client.__all__) == {
        "Accuracy",
        "AuditRefusedError",
        "AuthenticationError",
        "Budget",
        "BudgetExhaustedError",
        "Client",
        "ColumnSchema",
        "ConflictError",
        "ConnectionFailedError",
        "DataError",
        "DatabaseError",
        "DatabaseUnavailableError",
        "Error",
        "ForbiddenError",
        "IntegrityError",
        "InterfaceError",
        "InternalError",
        "InvalidPrivacyParametersError",
        "InvalidRequestError",
        "LedgerUnavailableError",
        "MethodNotAllowedError",
        "NotFoundError",
        "NotSupportedError",
        "OperationalError",
        "Privacy",
        "ProgrammingError",
        "QueryResult",
        "RateLimitedError",
        "ResultColumn",
        "SQLSyntaxError",
        "Schema",
        "ShuttingDownError",
        "TableSchema",
        "UnknownColumnError",
        "UnknownTableError",
        "UnsupportedQueryError",
        "Warning",
        "__version__",
    }
    for name in dpgate_client.__all__:
        assert hasattr(dpgate_client, name)


def test_a_declared_null_when_reaches_the_client_and_bi_comments() -> None:
    """``/v1/schema`` publishes a column's ``null_when``; the client keeps it and the
    SQLAlchemy dialect's column comment says it."""
    column = ColumnSchema.from_json(
        {
            "name": "occupation",
            "type": "text",
            "nullable": True,
            "values": ["Clerk", "Nurse"],
            "null_when": "employment IS NULL OR employment <> 'Employed'",
        }
    )
    assert column.null_when == "employment IS NULL OR employment <> 'Employed'"
    assert column.describe() == (
        "values: Clerk, Nurse; NULL exactly when employment IS NULL OR employment <> 'Employed'"
    )
    assert ColumnSchema.from_json({"name": "age", "type": "integer"}).null_when is None
