"""The SQLAlchemy dialect against a scripted gateway: URLs, reflection, SQL text, errors."""

from __future__ import annotations

import warnings

import pytest
import sqlalchemy as sa
from sqlalchemy import types as sqltypes

from dpgate_client import errors
from dpgate_client.dialect import DpgateDialect, DpgateHttpsDialect

try:
    from test_client_fakes import FakeGateway, error, gateway, released
except ImportError:  # tests/ imported as a package
    from tests.test_client_fakes import FakeGateway, error, gateway, released

__all__ = ["gateway"]


def engine_for(fake: FakeGateway, key: str = "k", query: str = "") -> sa.Engine:
    return sa.create_engine(fake.url.replace("http://", f"dpgate://{key}@") + query)


@pytest.mark.parametrize(
    ("url", "dialect", "connect_url", "key"),
    [
        ("dpgate://KEY@127.0.0.1:8000", DpgateDialect, "http://127.0.0.1:8000", "KEY"),
        ("dpgate+http://KEY@h:80", DpgateDialect, "http://h:80", "KEY"),
        ("dpgate+https://KEY@gw.example", DpgateHttpsDialect, "https://gw.example", "KEY"),
        (
            "dpgate+https://alice:S3CR%2FT@gw:8443/dp",
            DpgateHttpsDialect,
            "https://gw:8443/dp",
            "S3CR/T",
        ),
    ],
)
def test_urls_select_the_dialect_and_connect_arguments(
    url: str, dialect: type[DpgateDialect], connect_url: str, key: str
) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. no dbapi()/import_dbapi deprecation warning
        engine = sa.create_engine(url)
    assert type(engine.dialect) is dialect
    assert engine.dialect.name == "dpgate"
    args, kwargs = engine.dialect.create_connect_args(engine.url)
    assert args == [] and kwargs == {"url": connect_url, "key": key}


def test_privacy_defaults_travel_in_the_url(gateway: FakeGateway) -> None:
    engine = engine_for(gateway, query="?epsilon=0.3&mechanism=gaussian&delta=1e-8")
    with engine.connect() as conn:
        conn.exec_driver_sql("SELECT 1")
    assert gateway.last["body"] == {
        "sql": "SELECT 1",
        "epsilon": 0.3,
        "delta": 1e-8,
        "mechanism": "gaussian",
    }


def test_inspector_answers_everything_superset_asks(gateway: FakeGateway) -> None:
    inspector = sa.inspect(engine_for(gateway))
    assert inspector.default_schema_name == "main"
    assert inspector.get_schema_names() == ["main"]
    assert inspector.get_table_names() == ["patients", "visits"]
    assert inspector.get_table_names("main") == ["patients", "visits"]
    assert inspector.get_table_names("other") == []
    assert inspector.get_view_names() == [] and inspector.get_view_names("main") == []
    assert inspector.has_table("patients") and inspector.has_table("patients", "main")
    assert not inspector.has_table("secrets")
    columns = {c["name"]: c for c in inspector.get_columns("patients", "main")}
    assert list(columns) == ["patient_id", "age", "sex", "glucose", "admitted", "smoker"]
    expected_types = {
        "patient_id": sqltypes.Integer,
        "age": sqltypes.Integer,
        "sex": sqltypes.String,
        "glucose": sqltypes.Float,
        "admitted": sqltypes.Date,
        "smoker": sqltypes.Boolean,
    }
    for name, cls in expected_types.items():
        assert isinstance(columns[name]["type"], cls), name
    assert columns["admitted"]["nullable"] is False and columns["age"]["nullable"] is True
    assert columns["age"]["comment"] == "clamped to [0.0, 120.0]"
    assert columns["sex"]["comment"] == "values: F, M"
    assert columns["patient_id"]["comment"] == "privacy unit"
    assert inspector.get_pk_constraint("patients", "main")["constrained_columns"] == []
    assert inspector.get_foreign_keys("patients", "main") == []
    assert inspector.get_indexes("patients", "main") == []
    assert inspector.get_unique_constraints("patients", "main") == []
    assert inspector.get_check_constraints("patients", "main") == []
    assert "patient_id" in (inspector.get_table_comment("patients", "main")["text"] or "")
    with pytest.raises(sa.exc.NoSuchTableError):
        inspector.get_columns("secrets")
    # One inspector reads the public schema once, however many questions it answers
    # (SQLAlchemy 1.4 does not hand its cache to has_table and a few others).
    reads = sum(r["path"] == "/v1/schema" for r in gateway.requests)
    assert reads == 1 or (sa.__version__.startswith("1.") and reads <= 6)


def test_table_reflection_builds_a_usable_table(gateway: FakeGateway) -> None:
    engine = engine_for(gateway)
    table = sa.Table("patients", sa.MetaData(), autoload_with=engine)
    assert [c.name for c in table.columns][:3] == ["patient_id", "age", "sex"]
    assert list(table.primary_key) == []


def test_ping_goes_to_the_gateway_and_checks_the_key(gateway: FakeGateway) -> None:
    engine = engine_for(gateway)
    raw = engine.raw_connection()
    try:
        assert engine.dialect.do_ping(raw.dbapi_connection)
        gateway.routes[("GET", "/v1/budget")] = error(401, "unauthenticated", "Unknown API key.")
        with pytest.raises(errors.AuthenticationError):
            engine.dialect.do_ping(raw.dbapi_connection)
    finally:
        raw.close()


def test_compiled_sql_is_what_the_gateway_reads(gateway: FakeGateway) -> None:
    engine = engine_for(gateway)
    patients = sa.table("patients", sa.column("disease"), sa.column("age"), sa.column("order"))
    query = (
        sa.select(patients.c.disease, sa.func.count().label("count"))
        .where(patients.c.age >= 65, patients.c.order == "x'y")
        .group_by(patients.c.disease)
        .order_by(sa.desc("count"))
        .limit(10)
    )
    text = str(query.compile(engine, compile_kwargs={"literal_binds": True}))
    assert " ".join(text.split()) == (
        "SELECT patients.disease, count(*) AS count FROM patients "
        "WHERE patients.age >= 65 AND patients.\"order\" = 'x''y' "
        "GROUP BY patients.disease ORDER BY count DESC LIMIT 10"
    )
    gateway.routes[("POST", "/v1/query")] = released(
        [("disease", "text"), ("count", "integer")], [["Crohn", 5]]
    )
    with engine.connect() as conn:
        rows = conn.execute(query).all()
    assert rows == [("Crohn", 5)]
    assert " ".join(gateway.last["body"]["sql"].split()) == " ".join(text.split())


def test_offset_without_limit_has_no_negative_limit(gateway: FakeGateway) -> None:
    patients = sa.table("patients", sa.column("sex"))
    query = sa.select(patients.c.sex, sa.func.count().label("n")).group_by(patients.c.sex)
    engine = engine_for(gateway)
    paged = str(query.offset(20).compile(engine, compile_kwargs={"literal_binds": True}))
    assert paged.split()[-2:] == ["OFFSET", "20"] and "LIMIT" not in paged
    both = str(query.limit(10).offset(20).compile(engine, compile_kwargs={"literal_binds": True}))
    assert both.split()[-4:] == ["LIMIT", "10", "OFFSET", "20"]


def test_gateway_errors_become_sqlalchemy_errors_with_the_original(gateway: FakeGateway) -> None:
    engine = engine_for(gateway)
    cases = [
        (error(400, "unsupported_query", "SELECT * is not supported."), sa.exc.ProgrammingError),
        (error(403, "budget_exhausted", "Budget exhausted."), sa.exc.OperationalError),
        (error(500, "internal", "Internal error (request r-1)."), sa.exc.InternalError),
    ]
    for answer, wrapper in cases:
        gateway.routes[("POST", "/v1/query")] = answer
        with engine.connect() as conn, pytest.raises(wrapper) as caught:
            conn.exec_driver_sql("SELECT * FROM patients LIMIT 100")
        assert isinstance(caught.value.orig, errors.DatabaseError)
        assert caught.value.orig.code == answer[1]["error"]["code"]


def test_pandas_read_sql_through_the_engine(gateway: FakeGateway) -> None:
    pd = pytest.importorskip("pandas")
    gateway.routes[("POST", "/v1/query")] = released(
        [("sex", "text"), ("n", "integer")], [["F", 10], ["M", 12]]
    )
    frame = pd.read_sql(
        sa.text("SELECT sex, COUNT(*) AS n FROM patients WHERE age > :age GROUP BY sex"),
        engine_for(gateway),
        params={"age": 40},
    )
    assert frame.to_dict("list") == {"sex": ["F", "M"], "n": [10, 12]}
    assert gateway.last["body"]["sql"] == (
        "SELECT sex, COUNT(*) AS n FROM patients WHERE age > 40 GROUP BY sex"
    )
