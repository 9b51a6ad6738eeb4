"""Joins (docs/design.md, "Joins"; docs/privacy.md, "Joins").

The attack first: a person with many visits, joined to their patient row. Without
bounding after the join, COUNT over the join moves with their number of visits; dpgate
bounds each person's rows of the *joined* relation, in the SQL, so one person — all of
their rows in both tables — moves each aggregate by at most its declared sensitivity.
That is checked through the whole query path (``Gateway.query``) on neighbouring
databases, for many join queries and several kinds of neighbour. Then: the refusals are
decided from the SQL and the config alone and cost nothing, a join that fails in the
database is charged, and the auditor reads a join's regions in the cell space of the
table whose rows it counts.
"""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.core.config import ConfigError
from gateway.core.config_load import parse_config
from gateway.core.errors import DatabaseUnavailable, GatewayError
from gateway.core.plan import QueryPlan, QueryRequest
from gateway.demo.hospital import config_yaml
from gateway.pipeline.gateway import CHARGED_FAILURE_MESSAGE, Gateway
from gateway.pipeline.noising import centred

FIXTURES = yaml.safe_load((Path(__file__).parent / "fixtures" / "analyze.yaml").read_text())
NEW = 999_999  # the neighbour's patient_id


def request(sql: str, *, epsilon: float = 0.1, delta: float = 0.0) -> QueryRequest:
    return QueryRequest(sql=sql, epsilon=epsilon, delta=delta, mechanism="laplace")


# -- the config ---------------------------------------------------------------------------


def _tables(**changes: Any) -> dict[str, Any]:
    tables: dict[str, Any] = {
        "patients": {
            "privacy_unit": "pid",
            "columns": {"pid": {"type": "integer"}, "zip": {"type": "text"}},
            "references": {"zip": "zips.zip"},
        },
        "visits": {
            "max_rows_per_unit": 3,
            "columns": {"pid": {"type": "integer"}, "dept": {"type": "text"}},
            "references": {"pid": "patients.pid"},
        },
        "zips": {
            "public": True,
            "key": "zip",
            "columns": {"zip": {"type": "text"}, "region": {"type": "text"}},
        },
    }
    for path, value in changes.items():
        table, _, key = path.partition("__")
        if value is None:
            tables[table].pop(key, None)
        else:
            tables[table][key] = value
    return tables


def _config(tables: dict[str, Any]) -> Any:
    return parse_config(
        {"database": {"url": "sqlite://"}, "ledger": {"url": "sqlite://"}, "tables": tables}
    )


def test_a_privacy_unit_path_gives_the_referencing_table_its_unit() -> None:
    config = _config(_tables())
    visits = config.tables["visits"]
    assert visits.privacy_unit == "pid" and visits.max_rows_per_unit == 3
    assert [(r.column, r.table, r.target) for r in visits.references] == [
        ("pid", "patients", "pid")
    ]
    zips = config.tables["zips"]
    assert zips.public and zips.key == "zip" and zips.privacy_unit is None


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        (
            {"visits__references": {"dept": "patients.pid"}},
            "visits.dept is text but patients.pid is integer",
        ),
        ({"visits__references": {"dept": "patients.zip"}}, "must name its privacy unit"),
        ({"visits__references": {"pid": "doctors.id"}}, "'doctors' is not a declared table"),
        ({"visits__references": {"pid": "patients"}}, "as table.column"),
        ({"visits__references": {"nope": "patients.pid"}}, "'nope' is not a declared column"),
        ({"visits__references": {"pid": "visits.pid"}}, "cannot reference itself"),
        ({"patients__references": {"zip": "zips.region"}}, "joins on its key 'zip' only"),
        ({"zips__key": None}, "a public table needs a key"),
        ({"zips__privacy_unit": "zip"}, "a public table has no privacy unit"),
        ({"zips__references": {"zip": "patients.zip"}}, "cannot reference other tables"),
        ({"patients__key": "zip"}, "only a public table"),
        ({"zips__public": "yes"}, "public: must be true or false"),
        (
            {"patients__max_rows_per_unit": 2},
            "patients may hold 2 rows per unit; a referenced table must hold one",
        ),
        (
            {
                "visits__privacy_unit": "dept",
                "visits__columns": {"pid": {"type": "integer"}, "dept": {"type": "integer"}},
            },
            "must be this table's privacy unit",
        ),
        (
            {"patients__references": {"zip": "zips.zip", "pid": "visits.pid"}},
            "a referenced table must hold one",
        ),
    ],
)
def test_the_config_refuses_references_that_could_multiply_rows(
    changes: dict[str, Any], problem: str
) -> None:
    with pytest.raises(ConfigError) as info:
        _config(_tables(**changes))
    assert any(problem in p for p in info.value.problems), info.value.problems


def test_a_table_reached_by_two_paths_is_refused() -> None:
    tables = _tables()
    tables["visits"]["columns"]["zip"] = {"type": "text"}
    tables["visits"]["references"]["zip"] = "zips.zip"  # visits→zips and visits→patients→zips
    with pytest.raises(ConfigError) as info:
        _config(tables)
    assert any("'zips' is reached twice" in p for p in info.value.problems)


def test_configs_without_joins_load_as_before() -> None:
    tables = _tables(patients__references=None, visits__references=None)
    tables["visits"]["privacy_unit"] = "pid"
    config = _config(tables)
    assert all(not t.references for t in config.tables.values())
    assert not config.tables["patients"].public


# -- neighbouring databases, through the whole query path ------------------------------


def _add_person(db: Path, *, patient: bool, visits: int) -> None:
    """One more person, with all their rows: a patient row (unless not), and visits."""
    with sqlite3.connect(db) as conn:
        if patient:
            conn.execute(
                "INSERT INTO patients VALUES (?, 'Nóra Új', 'F', 50, 'Budapest', '1005', 1, "
                "6.0, 50000, 'Crohn')",
                (NEW,),
            )
        depts = ("Cardiology", "Oncology", "Surgery", "Neurology", "Emergency")
        for i in range(visits):
            conn.execute(
                "INSERT INTO visits (patient_id, year, department, length_of_stay, cost) "
                "VALUES (?, ?, ?, ?, ?)",
                (NEW, 2019 + i % 7, depts[i % len(depts)], 30 - i % 3, 19_000.0 + i),
            )


@pytest.fixture
def build_gateway(make_gateway: Callable[..., Gateway]) -> Callable[..., Gateway]:
    """A Gateway on a private copy of the demo data (changed by ``prepare`` first), with
    an analyst 'alice' whose budget outlasts every test here."""

    def factory(prepare: Callable[[Path], Any] | None = None, **overrides: Any) -> Gateway:
        gw = make_gateway(prepare, **overrides)
        gw.ledger.create_analyst("alice", 1000.0, 1e-3)
        return gw

    return factory


def _answer(
    gw: Gateway, sql: str, seen: list[list[tuple[Any, ...]]]
) -> tuple[QueryPlan, dict[tuple[Any, ...], tuple[int, ...]]]:
    """The plan of ``sql`` and its exact measures by group key, through Gateway.query
    (an AVG's sum as the noise sees it: centred on the middle of its bounds)."""
    gw.query("alice", request(sql, epsilon=1.0, delta=1e-6))
    plan = gw.planner.analyze(sql)
    assert isinstance(plan, QueryPlan) and plan.join is not None
    k, m = len(plan.group_keys), len(plan.measures)
    rows = seen[-1]
    measures = centred(plan, [row[k : k + m] for row in rows])
    return plan, {
        row[:k]: tuple(int(v) for v in values) for row, values in zip(rows, measures, strict=True)
    }


JOIN_QUERIES = [
    "SELECT COUNT(*) FROM patients p JOIN visits v ON p.patient_id = v.patient_id",
    "SELECT p.sex, COUNT(*) FROM patients p JOIN visits v ON p.patient_id = v.patient_id "
    "GROUP BY p.sex",
    "SELECT v.department, COUNT(*), SUM(v.cost) FROM visits v JOIN patients p "
    "ON v.patient_id = p.patient_id WHERE p.age > 40 GROUP BY v.department",
    "SELECT region, COUNT(*), AVG(v.length_of_stay) FROM visits v JOIN patients p "
    "ON p.patient_id = v.patient_id JOIN zip_regions z ON z.zip = p.zip GROUP BY region",
    "SELECT v.year, COUNT(DISTINCT v.patient_id) FROM visits v LEFT JOIN patients p "
    "ON p.patient_id = v.patient_id WHERE p.smoker OR p.smoker IS NULL GROUP BY v.year",
    "SELECT z.region, COUNT(*), SUM(p.income) FROM patients p JOIN zip_regions z "
    "ON p.zip = z.zip GROUP BY z.region",
    "SELECT p.zip, COUNT(*) FROM visits v JOIN patients p ON p.patient_id = v.patient_id "
    "GROUP BY p.zip",
    "SELECT COUNT(*), SUM(v.length_of_stay) FROM visits v LEFT JOIN patients p "
    "ON p.patient_id = v.patient_id WHERE p.disease = 'Crohn' OR v.cost > 15000",
    "SELECT p.disease, v.department, COUNT(*) FROM visits v JOIN patients p "
    "ON p.patient_id = v.patient_id GROUP BY p.disease, v.department",
    "SELECT region, p.sex, COUNT(*) FROM patients p LEFT JOIN zip_regions z ON z.zip = p.zip "
    "WHERE p.age BETWEEN 30 AND 70 GROUP BY region, p.sex",
]


def _plain_references() -> dict[str, Any]:
    """The demo's tables with both references declared plain (``table.column``)."""
    tables: dict[str, Any] = yaml.safe_load(config_yaml("x.db", "l.db"))["tables"]
    tables["visits"]["references"] = {"patient_id": "patients.patient_id"}
    tables["patients"]["references"] = {"zip": "zip_regions.zip"}
    return tables


NEIGHBOURS: dict[str, Callable[[Path], None]] = {
    "a patient with 40 visits": lambda db: _add_person(db, patient=True, visits=40),
    "40 visits and no patient row": lambda db: _add_person(db, patient=False, visits=40),
    "a patient with no visit": lambda db: _add_person(db, patient=True, visits=0),
    "a patient with 2 visits": lambda db: _add_person(db, patient=True, visits=2),
}


def test_the_attack_a_person_with_many_visits_moves_a_join_count_by_the_bound_only(
    build_gateway: Callable[..., Gateway], exact: list[list[tuple[Any, ...]]]
) -> None:
    sql = JOIN_QUERIES[0]
    without = build_gateway(audit={"mode": "off"})
    with_them = build_gateway(NEIGHBOURS["a patient with 40 visits"], audit={"mode": "off"})
    raw = []
    for gw in (without, with_them):
        db = gw.config.database.url.removeprefix("sqlite:///")
        with sqlite3.connect(db) as conn:
            raw.append(conn.execute(sql).fetchone()[0])
    # The attack: the join itself moves by their 40 visits...
    assert raw[1] - raw[0] == 40
    plan, before = _answer(without, sql, exact)
    _, after = _answer(with_them, sql, exact)
    # ...the relation dpgate counts, bounded after the join, by visits' bound of 5.
    assert after[()][0] - before[()][0] == 5
    assert plan.measures[0].sensitivity.l1 == 5


@pytest.mark.parametrize("neighbour", list(NEIGHBOURS))
def test_one_person_moves_each_join_aggregate_by_at_most_its_sensitivity(
    neighbour: str, build_gateway: Callable[..., Gateway], exact: list[list[tuple[Any, ...]]]
) -> None:
    # references declared plain (the demo declares them every_row_matches): rows that
    # match nothing stay in the table (with every_row_matches they move nothing at all:
    # tests/test_join_matches.py)
    plain = _plain_references()
    without = build_gateway(audit={"mode": "off"}, tables=plain)
    with_them = build_gateway(NEIGHBOURS[neighbour], audit={"mode": "off"}, tables=plain)
    moved_somewhere = False
    for sql in JOIN_QUERIES:
        plan, before = _answer(without, sql, exact)
        _, after = _answer(with_them, sql, exact)
        for j, measure in enumerate(plan.measures):
            changes = [
                abs(after.get(g, (0,) * len(plan.measures))[j] - before.get(g, (0,) * 9)[j])
                for g in set(before) | set(after)
            ]
            assert sum(changes) <= measure.sensitivity.l1, (sql, j, changes)
            assert max(changes, default=0) <= measure.sensitivity.linf, (sql, j)
            moved_somewhere |= sum(changes) > 0
    # The test can fail: the neighbour does change answers (except one in no join).
    assert moved_somewhere or neighbour == "a patient with no visit"


# -- side channels -------------------------------------------------------------------------


def test_join_refusals_are_decided_from_the_sql_and_the_config_and_cost_nothing(
    build_gateway: Callable[..., Gateway],
) -> None:
    gateways = [
        build_gateway(),
        build_gateway(NEIGHBOURS["a patient with 40 visits"]),
        build_gateway(lambda db: sqlite3.connect(db).executescript("DELETE FROM visits;")),
    ]
    for case in FIXTURES["joins_refused"]:
        errors = []
        for gw in gateways:
            with pytest.raises(GatewayError) as info:
                gw.query("alice", request(case["sql"]))
            errors.append(info.value.to_dict())
        assert errors[0] == errors[1] == errors[2], case["sql"]
        assert errors[0]["error"]["code"] == case["code"]
    for gw in gateways:
        assert gw.ledger.budget_status("alice").rho_spent == 0
        assert gw.ledger.history("alice") == []


def test_a_join_that_fails_in_the_database_is_charged(
    build_gateway: Callable[..., Gateway],
) -> None:
    gw = build_gateway(
        lambda db: sqlite3.connect(db).executescript("DROP TABLE zip_regions;"),
        audit={"mode": "off"},
    )
    sql = (
        "SELECT z.region, COUNT(*) FROM patients p JOIN zip_regions z ON p.zip = z.zip "
        "GROUP BY z.region"
    )
    with pytest.raises(DatabaseUnavailable) as info:
        gw.query("alice", request(sql))
    assert info.value.to_dict()["error"] == {
        "code": "database_unavailable",
        "message": CHARGED_FAILURE_MESSAGE,
        "detail": {"charged": True},
    }
    assert gw.ledger.budget_status("alice").rho_spent == pytest.approx(0.1**2 / 2)
    assert [h.outcome for h in gw.ledger.history("alice")] == ["withheld"]


# -- the auditor ---------------------------------------------------------------------------


def test_audited_join_queries_are_answered(build_gateway: Callable[..., Gateway]) -> None:
    gw = build_gateway()
    for sql in (
        "SELECT z.region, COUNT(*) FROM patients p JOIN zip_regions z ON p.zip = z.zip "
        "GROUP BY z.region",
        "SELECT z.region, COUNT(*) FROM patients p JOIN zip_regions z ON p.zip = z.zip "
        "WHERE p.age >= 18 GROUP BY z.region",
        "SELECT department, COUNT(*) FROM visits GROUP BY department",
        "SELECT p.sex, v.department, COUNT(*) FROM visits v LEFT JOIN patients p "
        "ON p.patient_id = v.patient_id WHERE p.age > 30 GROUP BY p.sex, v.department",
    ):
        release = gw.query("alice", request(sql, epsilon=1.0))
        assert release.rows, sql


def test_the_auditor_counts_the_rows_an_inner_join_drops(
    build_gateway: Callable[..., Gateway],
) -> None:
    """An inner join counts the visits whose patient row exists; the same cells over all
    visits then determine the visits with none — none in the demo, a group of 0 that the
    noisy answers cannot show to reach k, so the auditor refuses (a LEFT JOIN, which keeps
    every visit, determines no such group: test above). A reference declared
    ``every_row_matches`` makes the group empty by construction
    (tests/test_join_matches.py; the demo declares it so); here it is plain."""
    gw = build_gateway(tables=_plain_references())
    gw.query(
        "alice",
        request(
            "SELECT v.department, COUNT(*) FROM visits v JOIN patients p "
            "ON p.patient_id = v.patient_id GROUP BY v.department",
            epsilon=1.0,
        ),
    )
    with pytest.raises(GatewayError) as info:
        gw.query(
            "alice",
            request("SELECT department, COUNT(*) FROM visits GROUP BY department", epsilon=1.0),
        )
    assert info.value.code == "audit_refused"


def test_the_auditor_sees_a_difference_between_a_join_and_a_single_table_query(
    build_gateway: Callable[..., Gateway],
) -> None:
    """Meningitis patients, minus those of them the join places outside one small region:
    the rest is the region's few Meningitis patients (and any patient no zip matches).
    The join's region lies in patients' own cell space, so the auditor sees it."""
    gw = build_gateway()
    meningitis = "SELECT COUNT(*) FROM patients WHERE disease = 'Meningitis'"
    gw.query("alice", request(meningitis, epsilon=1.0))
    with pytest.raises(GatewayError) as info:
        gw.query(
            "alice",
            request(
                "SELECT COUNT(*) FROM patients p JOIN zip_regions z ON p.zip = z.zip "
                "WHERE p.disease = 'Meningitis' AND z.region <> 'Western Transdanubia'",
                epsilon=1.0,
            ),
        )
    assert info.value.code == "audit_refused"


def test_a_lookup_column_is_never_taken_as_independent_of_its_join_column(
    build_gateway: Callable[..., Gateway],
) -> None:
    """A region is a function of the zip code: the auditor cannot relate conditions on
    the two, so (as for any two conditions on one column it cannot relate) it refuses,
    before anything is spent."""
    gw = build_gateway()
    gw.query(
        "alice",
        request(
            "SELECT z.region, COUNT(*) FROM patients p JOIN zip_regions z ON p.zip = z.zip "
            "GROUP BY z.region"
        ),
    )
    spent = gw.ledger.budget_status("alice").rho_spent
    with pytest.raises(GatewayError) as info:
        gw.query("alice", request("SELECT COUNT(*) FROM patients WHERE zip = '8001'"))
    assert info.value.code == "audit_refused"
    assert "cannot relate" in info.value.message
    assert gw.ledger.budget_status("alice").rho_spent == spent


# -- the public contract -------------------------------------------------------------------


def test_the_schema_shows_public_tables_and_references(client: Any, auth: dict[str, str]) -> None:
    body = client.get("/v1/schema", headers=auth).get_json()
    tables = {t["name"]: t for t in body["tables"]}
    assert tables["zip_regions"]["public"] is True and tables["zip_regions"]["key"] == "zip"
    assert tables["visits"]["references"] == [
        {"column": "patient_id", "table": "patients", "target": "patient_id"}
    ]
    assert "public" not in tables["patients"]


def test_a_join_over_http_releases_its_groups(client: Any, auth: dict[str, str]) -> None:
    resp = client.post(
        "/v1/query",
        json={
            "sql": "SELECT z.region, COUNT(*) AS n FROM patients p LEFT JOIN zip_regions z "
            "ON p.zip = z.zip GROUP BY z.region",
            "epsilon": 0.5,
        },
        headers=auth,
    )
    body = resp.get_json()
    assert resp.status_code == 200, body
    assert [c["name"] for c in body["columns"]] == ["region", "n"]
    regions = [r[0] for r in body["rows"]]
    # every declared value; no NULL group: the demo declares every zip listed
    # (every_row_matches), so a LEFT JOIN of zip_regions is its inner join
    assert "Central Hungary" in regions and None not in regions


def test_an_older_demo_database_gets_the_public_table(demo_db: Path, tmp_path: Path) -> None:
    from gateway.demo.hospital import upgrade, zip_region_rows

    db = tmp_path / "old.db"
    shutil.copy(demo_db, db)
    with sqlite3.connect(db) as conn:
        conn.execute("DROP TABLE zip_regions")
        before = conn.execute("SELECT COUNT(*) FROM patients").fetchone()
    upgrade(db)
    upgrade(db)  # idempotent
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT zip, region FROM zip_regions ORDER BY zip").fetchall()
        assert conn.execute("SELECT COUNT(*) FROM patients").fetchone() == before
    assert rows == sorted(zip_region_rows())
