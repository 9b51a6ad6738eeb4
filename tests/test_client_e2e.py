"""Acceptance: the client, DB-API driver and SQLAlchemy dialect against a real dpgate.

One module-scoped ``dpgate serve`` subprocess on a free loopback port, over a small
SQLite database and config written to a temporary folder; analyst keys come from the
admin API. Everything a BI tool does goes through HTTP, exactly as in production.
"""

from __future__ import annotations

import json
import os
import random
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip(
    "gateway.http.app", reason="the gateway package is not importable yet", exc_type=ImportError
)

import sqlalchemy as sa
from sqlalchemy import types as sqltypes

from dpgate_client import Client, dbapi, errors

ADMIN_KEY = "e2e-admin-" + "x" * 32
PATIENTS = 400
STARTUP_SECONDS = 60

CONFIG = """\
database: {{url: "sqlite:///{db}"}}
ledger: {{url: "sqlite:///{ledger}"}}
privacy:
  mechanism: laplace
  epsilon: 0.1
  max_epsilon_per_query: 1.0
  delta: 1.0e-7
  composition: zcdp
audit: {{mode: refuse, min_group_size: 5, scope: analyst}}
tables:
  patients:
    privacy_unit: patient_id
    max_rows_per_unit: 1
    columns:
      patient_id: {{type: integer}}
      sex:        {{type: text, values: [F, M], nullable: false}}
      age:        {{type: integer, lower: 0, upper: 100}}
      disease:    {{type: text, values: [Crohn, Influenza, Meningitis], nullable: false}}
      glucose:    {{type: real, lower: 2.0, upper: 20.0}}
      smoker:     {{type: boolean, nullable: false}}
      admitted:   {{type: date}}
"""


def _build_database(path: Path) -> None:
    rng = random.Random(6)
    with sqlite3.connect(path) as conn:
        conn.execute(
            "CREATE TABLE patients (patient_id INTEGER PRIMARY KEY, sex TEXT, age INTEGER,"
            " disease TEXT, glucose REAL, smoker INTEGER, admitted DATE)"
        )
        conn.executemany(
            "INSERT INTO patients VALUES (?, ?, ?, ?, ?, ?, ?)",
            [
                (
                    i,
                    rng.choice("FM"),
                    rng.randint(0, 99),
                    rng.choice(["Crohn", "Influenza", "Influenza", "Meningitis"]),
                    round(rng.uniform(3, 15), 1),
                    rng.random() < 0.3,
                    f"2024-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
                )
                for i in range(PATIENTS)
            ],
        )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _http(url: str, *, key: str, body: dict[str, object] | None = None) -> dict[str, object]:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode() if body is not None else None,
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        method="POST" if body is not None else "GET",
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        answer: dict[str, object] = json.loads(response.read())
        return answer


@dataclass(frozen=True)
class Server:
    url: str

    def new_analyst(self, name: str, epsilon: float = 10.0, delta: float = 1e-6) -> str:
        answer = _http(
            f"{self.url}/v1/admin/analysts",
            key=ADMIN_KEY,
            body={"name": name, "epsilon": epsilon, "delta": delta},
        )
        return str(answer["api_key"])

    def dpgate_url(self, key: str, scheme: str = "dpgate") -> str:
        return self.url.replace("http://", f"{scheme}://{key}@")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    folder = tmp_path_factory.mktemp("dpgate-e2e")
    _build_database(folder / "hospital.db")
    config = folder / "dpgate.yaml"
    config.write_text(CONFIG.format(db=folder / "hospital.db", ledger=folder / "ledger.db"))
    port = _free_port()
    env = {**os.environ, "DPGATE_ADMIN_KEY": ADMIN_KEY}
    log = (folder / "server.log").open("wb")
    process = subprocess.Popen(
        [
            *(sys.executable, "-m", "gateway.cli", "serve", "--config", str(config)),
            *("--host", "127.0.0.1", "--port", str(port), "--workers", "1"),
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STARTUP_SECONDS
        while True:
            if process.poll() is not None:
                log.flush()
                pytest.fail(
                    "dpgate serve exited at startup:\n" + (folder / "server.log").read_text()
                )
            try:
                with urllib.request.urlopen(url + "/healthz", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail("dpgate serve did not answer /healthz in time")
                time.sleep(0.2)
        yield Server(url)
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


@pytest.fixture
def key(server: Server, request: pytest.FixtureRequest) -> str:
    """A fresh analyst per test: the auditor's history is per analyst, and a refusal
    caused by another test's queries would be noise here."""
    return server.new_analyst(f"a{abs(hash(request.node.nodeid)) % 10**12}", epsilon=50.0)


COUNT_BY_DISEASE = "SELECT disease, COUNT(*) AS n FROM patients GROUP BY disease"


# --- Client ------------------------------------------------------------------------------


def test_client_query_releases_rows_cost_and_accuracy(server: Server, key: str) -> None:
    client = Client(server.url, key)
    before = client.budget()
    answer = client.query(COUNT_BY_DISEASE, epsilon=0.5)
    assert answer.column_names == ("disease", "n")
    assert {row[0] for row in answer.rows} <= {"Crohn", "Influenza", "Meningitis"}
    assert all(isinstance(row[1], int) for row in answer.rows)
    assert answer.privacy is not None and answer.privacy.epsilon == pytest.approx(0.5)
    assert answer.privacy.mechanism == "laplace"
    assert answer.accuracy["n"].ci95_halfwidth is not None
    assert answer.accuracy["n"].ci95_halfwidth > 0
    assert answer.budget is not None
    after = client.budget()
    assert before.epsilon_spent is not None and after.epsilon_spent is not None
    assert after.epsilon_spent > before.epsilon_spent
    assert after.epsilon_total == 50.0 and after.composition == "zcdp"
    again = client.query(COUNT_BY_DISEASE, epsilon=0.5)
    assert again.cached and again.rows == answer.rows
    assert client.budget().epsilon_spent == pytest.approx(after.epsilon_spent)


def test_client_dry_run_spends_nothing(server: Server, key: str) -> None:
    client = Client(server.url, key)
    before = client.budget().epsilon_spent
    answer = client.query("SELECT COUNT(*) AS n FROM patients WHERE age > 30", dry_run=True)
    assert answer.rows == ()
    assert answer.privacy is not None and answer.privacy.epsilon > 0
    assert client.budget().epsilon_spent == pytest.approx(before)


def test_client_to_pandas_and_schema(server: Server, key: str) -> None:
    pytest.importorskip("pandas")
    client = Client(server.url, key)
    frame = client.query(
        "SELECT sex, AVG(glucose) AS mean_glucose FROM patients GROUP BY sex", epsilon=0.4
    ).to_pandas()
    assert list(frame.columns) == ["sex", "mean_glucose"]
    assert set(frame["sex"]) <= {"F", "M"}
    assert "mean_glucose" in frame.attrs["accuracy"]
    assert frame.attrs["privacy"]["epsilon"] == pytest.approx(0.4)
    schema = client.schema()
    patients = schema.table("patients")
    assert patients is not None and patients.privacy_unit == "patient_id"
    age = patients.column("age")
    assert age is not None and (age.lower, age.upper) == (0, 100)


# --- DB-API ------------------------------------------------------------------------------


def test_dbapi_cursor_binds_parameters_and_reports_privacy(server: Server, key: str) -> None:
    with dbapi.connect(server.dpgate_url(key) + "?epsilon=0.3") as conn:
        cur = conn.cursor()
        cur.execute(
            "SELECT sex, COUNT(*) AS n FROM patients WHERE age >= :age AND disease = :d "
            "GROUP BY sex",
            {"age": 40, "d": "Influenza"},
        )
        assert [d[0] for d in cur.description or ()] == ["sex", "n"]
        assert cur.description is not None and cur.description[1][1] == dbapi.NUMBER
        rows = cur.fetchall()
        assert cur.rowcount == len(rows) and {r[0] for r in rows} <= {"F", "M"}
        assert cur.privacy is not None and cur.privacy.epsilon == pytest.approx(0.3)
        assert "n" in cur.accuracy
        assert cur.budget is not None and cur.budget.epsilon_remaining is not None


def test_dbapi_connection_probes_are_free(server: Server, key: str) -> None:
    with dbapi.connect(server.url, key=key) as conn:
        cur = conn.cursor()
        spent = conn.client.budget().epsilon_spent
        for probe in ("SELECT 1", "SELECT version()", "SELECT current_schema()"):
            cur.execute(probe)
            assert cur.fetchone() is not None, probe
            assert cur.privacy is not None and cur.privacy.epsilon == 0, probe
        assert conn.client.budget().epsilon_spent == pytest.approx(spent)


@pytest.mark.parametrize(
    ("sql", "parameters", "cls"),
    [
        ("SELECT COUNT(*) FORM patients", {}, errors.SQLSyntaxError),
        ("SELECT COUNT(*) FROM secrets", {}, errors.UnknownTableError),
        ("SELECT COUNT(*) FROM patients WHERE salary > 3", {}, errors.UnknownColumnError),
        ("SELECT * FROM patients LIMIT 100", {}, errors.UnsupportedQueryError),
        ("SELECT COUNT(*) FROM patients", {"epsilon": 50.0}, errors.InvalidPrivacyParametersError),
    ],
)
def test_dbapi_errors_are_the_documented_classes(
    server: Server, key: str, sql: str, parameters: dict[str, float], cls: type[errors.Error]
) -> None:
    cur = dbapi.connect(server.url, key=key).cursor()
    with pytest.raises(cls) as caught:
        cur.execute(sql, **parameters)
    assert isinstance(caught.value, dbapi.ProgrammingError)
    assert caught.value.status == 400 and caught.value.message
    assert caught.value.code in str(caught.value)


def test_a_wrong_key_is_an_authentication_error(server: Server) -> None:
    conn = dbapi.connect(server.url, key="not-a-key")
    with pytest.raises(errors.AuthenticationError) as caught:
        conn.ping()
    assert isinstance(caught.value, dbapi.OperationalError) and caught.value.status == 401
    with pytest.raises(errors.AuthenticationError):
        conn.cursor().execute("SELECT COUNT(*) FROM patients")


def test_an_exhausted_budget_is_a_budget_exhausted_error(server: Server) -> None:
    poor = server.new_analyst("bob", epsilon=0.2, delta=1e-6)
    cur = dbapi.connect(server.url, key=poor).cursor()
    with pytest.raises(errors.BudgetExhaustedError) as caught:
        cur.execute("SELECT COUNT(*) AS n FROM patients", epsilon=1.0)
    assert isinstance(caught.value, dbapi.OperationalError)
    assert (caught.value.code, caught.value.status) == ("budget_exhausted", 403)


# --- SQLAlchemy and pandas ---------------------------------------------------------------


def test_inspector_answers_everything_superset_calls(server: Server, key: str) -> None:
    engine = sa.create_engine(server.dpgate_url(key))
    inspector = sa.inspect(engine)
    assert inspector.default_schema_name == "main"
    schemas = inspector.get_schema_names()
    assert schemas == ["main"]
    assert inspector.get_table_names("main") == ["patients"]
    assert inspector.get_table_names() == ["patients"]
    assert inspector.get_view_names("main") == []
    assert inspector.has_table("patients", "main") and not inspector.has_table("nope", "main")
    columns = {c["name"]: c["type"] for c in inspector.get_columns("patients", "main")}
    assert set(columns) == {"patient_id", "sex", "age", "disease", "glucose", "smoker", "admitted"}
    assert isinstance(columns["age"], sqltypes.Integer)
    assert isinstance(columns["glucose"], sqltypes.Float)
    assert isinstance(columns["sex"], sqltypes.String)
    assert isinstance(columns["smoker"], sqltypes.Boolean)
    assert isinstance(columns["admitted"], sqltypes.Date)
    assert inspector.get_pk_constraint("patients", "main")["constrained_columns"] == []
    assert inspector.get_foreign_keys("patients", "main") == []
    assert inspector.get_indexes("patients", "main") == []
    assert inspector.get_unique_constraints("patients", "main") == []
    assert inspector.get_check_constraints("patients", "main") == []
    assert inspector.get_table_comment("patients", "main")["text"]
    with engine.connect() as conn:
        assert engine.dialect.do_ping(conn.connection.dbapi_connection)


def test_superset_style_chart_query_through_sqlalchemy(server: Server, key: str) -> None:
    engine = sa.create_engine(server.dpgate_url(key) + "?epsilon=0.2")
    patients = sa.table("patients", sa.column("disease"), sa.column("age"), schema="main")
    chart = (
        sa.select(sa.literal_column("disease").label("disease"), sa.func.count().label("count"))
        .select_from(patients)
        .where(sa.literal_column("age") >= 18)
        .group_by(sa.literal_column("disease"))
        .order_by(sa.desc(sa.literal_column("count")))
        .limit(10000)
    )
    # Superset renders its query with literal binds and runs the text on a raw cursor.
    sql = str(chart.compile(engine, compile_kwargs={"literal_binds": True}))
    raw = engine.raw_connection()
    try:
        cur = raw.cursor()
        cur.execute(sql)
        rows = cur.fetchall()
    finally:
        raw.close()
    assert {r[0] for r in rows} <= {"Crohn", "Influenza", "Meningitis"}
    counts = [r[1] for r in rows]
    assert counts == sorted(counts, reverse=True)
    # SQL Lab wraps queries as a virtual table.
    # (Same region as the chart, so the differencing auditor has nothing to compare.)
    inner = "SELECT disease, COUNT(*) AS count FROM patients WHERE age >= 18 GROUP BY disease"
    wrapped = f"SELECT disease, count FROM ({inner}) AS virtual_table LIMIT 1001"
    with engine.connect() as conn:
        result = conn.exec_driver_sql(wrapped).all()
    assert {r[0] for r in result} <= {"Crohn", "Influenza", "Meningitis"}


def test_pandas_read_sql_with_an_aggregate_query(server: Server, key: str) -> None:
    pd = pytest.importorskip("pandas")
    engine = sa.create_engine(server.dpgate_url(key))
    frame = pd.read_sql(
        sa.text(
            "SELECT disease, COUNT(*) AS n, AVG(age) AS mean_age FROM patients "
            "WHERE sex = :sex GROUP BY disease ORDER BY n DESC"
        ),
        engine,
        params={"sex": "F"},
    )
    assert list(frame.columns) == ["disease", "n", "mean_age"]
    assert set(frame["disease"]) <= {"Crohn", "Influenza", "Meningitis"}


def test_sqlalchemy_surfaces_gateway_errors_with_the_original(server: Server, key: str) -> None:
    engine = sa.create_engine(server.dpgate_url(key))
    with engine.connect() as conn, pytest.raises(sa.exc.ProgrammingError) as caught:
        conn.exec_driver_sql("SELECT * FROM patients LIMIT 100")
    assert isinstance(caught.value.orig, errors.UnsupportedQueryError)
    assert "unsupported_query" in str(caught.value)


# --- nested aggregation: a chart over a virtual dataset ------------------------------------


def test_a_chart_over_a_virtual_dataset_through_sqlalchemy_costs_the_dataset_query_once(
    server: Server, key: str
) -> None:
    """What Superset sends for a SUM(n) metric over a dataset defined by SQL: the
    dataset's query is answered and charged once; every chart over it is post-processing
    of that release (through the DB-API cursor, as Superset runs it)."""
    client = Client(server.url, key)
    engine = sa.create_engine(server.dpgate_url(key) + "?epsilon=0.2")
    inner = "SELECT disease, sex, COUNT(*) AS n FROM patients GROUP BY disease, sex"
    virtual = (
        sa.text(inner)
        .columns(sa.column("disease"), sa.column("sex"), sa.column("n"))
        .subquery("virtual_table")
    )
    total = sa.func.sum(virtual.c.n).label("SUM(n)")
    chart = (
        sa.select(virtual.c.disease.label("disease"), total)
        .group_by(virtual.c.disease)
        .order_by(sa.desc(total))
        .limit(10000)
    )
    sql = str(chart.compile(engine, compile_kwargs={"literal_binds": True}))
    assert "FROM (SELECT disease, sex, COUNT(*) AS n" in sql and "GROUP BY" in sql
    before = client.budget().epsilon_spent
    raw = engine.raw_connection()
    try:
        cur = raw.cursor()
        cur.execute(sql)
        rows = cur.fetchall()
        assert [d[0] for d in cur.description] == ["disease", "SUM(n)"]
        assert cur.privacy is not None and cur.privacy.epsilon == pytest.approx(0.2)
        sum_accuracy = cur.accuracy["SUM(n)"]
        assert sum_accuracy.ci95_intervals is not None and len(sum_accuracy.ci95_intervals) == len(
            rows
        )
    finally:
        raw.close()
    after = client.budget().epsilon_spent
    assert before is not None and after is not None and after > before
    totals = [r[1] for r in rows]
    assert totals == sorted(totals, reverse=True)
    # The dataset's own query is the release that was charged: a cache hit, and the
    # chart is its per-disease sum.
    released = client.query(inner, epsilon=0.2)
    assert released.cached
    by_disease: dict[str, int] = {}
    for disease, _, n in released.rows:
        by_disease[disease] = by_disease.get(disease, 0) + n
    assert dict(rows) == by_disease
    # Another chart over the same dataset (AVG, filtered) is free.
    with engine.connect() as conn:
        by_sex = conn.exec_driver_sql(
            f'SELECT sex AS sex, AVG(n) AS "AVG(n)" FROM ({inner}) AS virtual_table '
            "WHERE disease IN ('Crohn', 'Influenza') GROUP BY sex ORDER BY sex LIMIT 10000"
        ).all()
    assert [r[0] for r in by_sex] == ["F", "M"]
    assert client.budget().epsilon_spent == pytest.approx(after)
